"""Two replicas of the default deployment behind the SGLang Model Gateway (minions.deploy.cluster, what
`make cluster` runs): the gateway's prefix affinity keeps each conversation on the replica that holds
its KV, where round-robin moves it (the control, so the test can fail); a replica killed between two
turns loses no conversation: each of its conversations goes on on the survivor, which computes the
history it did not hold.

Which replica answered a request is read from the replicas' own logs (each request's answer id), how
much of a prompt a replica found cached from its own answer (`usage.prompt_tokens_details`). Requests
go one at a time in the affinity and control runs, so each run's routing is deterministic.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest

from client.api import GenerationParams, MinionsClientError, generate_openai
from minions.deploy.cluster import Cluster
from minions.deploy.gateway import gateway_command
from minions.deploy.server import ServerPorts, free_ports, server_env, wait_http_ok
from minions.triton.shm import sweep_orphaned_shm
from harness.triton_process import ROOT, stop_process

SYSTEM = ("You are a careful assistant for a team of gardeners. Answer in plain words, keep each answer short, "
          "and when a question is about plants, name the plant's common name first. ") * 3
TOPICS = ["tomatoes", "roses", "apple trees", "basil", "tulips", "lavender"]
KILL_TOPICS = ["peppers", "orchids", "pear trees", "mint", "daffodils", "rosemary"]
"""The kill test's own conversations: histories the affinity test left cached on both replicas would
make a moved conversation's turn look free on the survivor."""
FOLLOW_UPS = ["How often should they be watered?", "What pests should I watch for?", "Any tip for winter?"]
PARAMS = GenerationParams(max_tokens=12, temperature=0.0)
ATTEMPTS = 2
"""A turn whose stream broke is sent once more: the second try must reach the survivor."""


@dataclass
class Answer:
    conversation: int
    turn: int
    answer_id: str | None
    prompt_tokens: int
    cached_tokens: int


def turns(topic: str) -> list[str]:
    return [f"I grow {topic}. What soil do they like?", *FOLLOW_UPS]


def converse(url: str, conversation: int, topic: str, messages: list[dict], turn: int) -> Answer:
    messages.append({"role": "user", "content": turns(topic)[turn]})
    completion = generate_openai(url, "minions", [{"role": "system", "content": SYSTEM}, *messages], PARAMS,
                                 timeout_s=120)
    messages.append({"role": "assistant", "content": completion.text})
    return Answer(conversation, turn, completion.response_id, completion.num_input_tokens or 0,
                  completion.num_cached_tokens or 0)


def interleaved(url: str, topics: list[str], count: int) -> list[Answer]:
    """Each conversation's turn 1, then each one's turn 2, ...: one request at a time."""
    histories: list[list[dict]] = [[] for _ in topics]
    return [converse(url, c, topic, histories[c], turn) for turn in range(count) for c, topic in enumerate(topics)]


def kept_and_cached(cluster: Cluster, answers: list[Answer]) -> tuple[float, float]:
    """The share of later turns answered by the replica of their conversation's turn before, and the
    share of those turns' prompt tokens their replica found cached."""
    served = cluster.served_by()
    by_turn = {(a.conversation, a.turn): served[a.answer_id] for a in answers}
    later = [a for a in answers if a.turn > 0]
    kept = sum(by_turn[a.conversation, a.turn] == by_turn[a.conversation, a.turn - 1] for a in later) / len(later)
    return kept, sum(a.cached_tokens for a in later) / sum(a.prompt_tokens for a in later)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    ports = free_ports(10)
    replica_ports = [ServerPorts("127.0.0.1", *ports[4 * i:4 * i + 4]) for i in range(2)]
    with Cluster(ROOT / "deploy.yaml", replica_ports, ports[8], root / "build", log_dir=root / "logs",
                 gateway_metrics_port=ports[9]) as running:
        yield running
    sweep_orphaned_shm()  # the killed replica's stubs could not free their regions


@pytest.fixture(scope="module")
def round_robin(cluster):
    """A second gateway in front of the same replicas, round-robin."""
    port, metrics_port = free_ports(2)
    proc = subprocess.Popen(gateway_command(sys.executable, port, cluster.workers, None, metrics_port), env=server_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", proc, "the round-robin gateway", 60.0)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_process(proc, signal.SIGTERM, 30)


def test_affinity_keeps_each_conversation_on_its_replica_where_round_robin_moves_it(cluster, round_robin):
    kept, cached = kept_and_cached(cluster, interleaved(cluster.url, TOPICS[:3], 3))
    rr_kept, rr_cached = kept_and_cached(cluster, interleaved(round_robin, TOPICS[3:], 3))
    assert kept == 1.0, f"affinity kept {kept:.0%} of later turns on their replica"
    assert rr_kept <= 0.5, f"round-robin kept {rr_kept:.0%}: the control shows no difference"
    # Prompt tokens computed again (not found cached): the shared system prompt is cached everywhere, a
    # conversation's own history only on its replica.
    assert 1 - cached < 0.6 * (1 - rr_cached), f"computed {1 - cached:.0%} of later turns' prompts with " \
                                               f"affinity, {1 - rr_cached:.0%} round-robin"


def test_a_replica_killed_between_turns_loses_no_conversation_and_they_move(cluster):
    answers: list[Answer] = []
    failed: list[tuple[int, int, str]] = []
    first_turns_done = threading.Barrier(len(KILL_TOPICS) + 1)
    victim_dead = threading.Event()

    def conversation(c: int, topic: str) -> None:
        messages: list[dict] = []
        for turn in range(len(turns(topic))):
            for _ in range(ATTEMPTS):
                try:
                    answers.append(converse(cluster.url, c, topic, messages, turn))
                    break
                except (MinionsClientError, OSError) as exc:
                    failed.append((c, turn, str(exc)))
                    messages.pop()  # asked again, as a user would
            if turn == 0:
                first_turns_done.wait(timeout=300)
                victim_dead.wait(timeout=300)

    threads = [threading.Thread(target=conversation, args=(c, t), daemon=True) for c, t in enumerate(KILL_TOPICS)]
    for thread in threads:
        thread.start()
    first_turns_done.wait(timeout=300)
    served = cluster.served_by()
    victim = cluster.replicas[1]
    on_victim = {a.conversation for a in answers if served.get(a.answer_id) == victim.index}
    victim.kill()
    victim_dead.set()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a conversation hung after the replica died"
    # Lost: at most a dead replica's conversation's first try after the kill (the gateway had not yet seen it down).
    assert all(turn == 1 and c in on_victim for c, turn, _ in failed), failed
    assert len(failed) == len({c for c, _, _ in failed}), failed
    served = cluster.served_by()
    assert len(answers) == len(KILL_TOPICS) * len(FOLLOW_UPS + [""]), "a turn got no answer"
    assert all(served[a.answer_id] == 0 for a in answers if a.turn >= 1), "a turn went to the dead replica"
    moved = [a for a in answers if a.conversation in on_victim and a.turn == 1]
    stayed = [a for a in answers if a.conversation not in on_victim and a.turn == 1]
    assert on_victim and stayed, "the first turns did not use both replicas"
    share = lambda group: sum(a.cached_tokens for a in group) / sum(a.prompt_tokens for a in group)  # noqa: E731
    assert share(moved) < share(stayed), "the moved conversations' first turn on the survivor cost nothing"
