"""Majority-voted speculation: merge the SSMs' drafts into a prefix tree and pick the heaviest path.

A node's weight is the sum of the weights of the SSMs whose draft passes through it. From the root
the heaviest child is taken at each depth until a leaf, so the result is always (a prefix of, and in
fact exactly) one real SSM's draft, and only that one sequence goes to the LLM: one verification per
round whatever the number of SSMs. Ties go to the child first reached, i.e. to the heavier SSM,
because drafts are inserted heaviest first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class TreeNode:
    token: int | None
    weight: float = 0.0
    ssms: list[str] = field(default_factory=list)
    children: dict[int, TreeNode] = field(default_factory=dict)


def merge_drafts(drafts: Mapping[str, list[int]], weights: Mapping[str, float]) -> TreeNode:
    """The prefix tree of all drafts, each node weighted by the SSMs passing through it."""
    root = TreeNode(None)
    for ssm in sorted(drafts, key=lambda s: -weights[s]):  # stable: ties keep the caller's order
        node = root
        node.weight += weights[ssm]
        node.ssms.append(ssm)
        for token in drafts[ssm]:
            node = node.children.setdefault(token, TreeNode(token))
            node.weight += weights[ssm]
            node.ssms.append(ssm)
    return root


@dataclass
class Vote:
    draft: list[int]
    supporters: list[str]
    """SSMs whose draft contains the whole chosen path, heaviest first."""


def heaviest_path(root: TreeNode) -> Vote:
    draft: list[int] = []
    node = root
    while node.children:
        node = max(node.children.values(), key=lambda c: c.weight)  # max keeps the first on ties
        draft.append(node.token)  # type: ignore[arg-type]
    return Vote(draft, list(node.ssms))


def vote(drafts: Mapping[str, list[int]], weights: Mapping[str, float]) -> Vote:
    """The voted draft; empty drafts take part with their weight but add no path."""
    return heaviest_path(merge_drafts(drafts, weights))


def dominant(weights: Mapping[str, float]) -> str | None:
    """The SSM heavier than all others together, if any. At every node on its draft its child
    outweighs any sibling, so every voted path begins with its whole draft: the others could only
    extend it past its end, when it drafted fewer tokens than asked."""
    if not weights:
        return None
    top = max(weights, key=lambda s: weights[s])
    return top if weights[top] > sum(weights.values()) - weights[top] else None
