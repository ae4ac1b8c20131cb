"""Real prompts kept with the project (prompts.json), so that tests and tools need nothing outside it."""

from __future__ import annotations

import json
from pathlib import Path


def kept_prompts(name: str) -> list[str]:
    return json.loads(Path(__file__).with_name("prompts.json").read_text())[name]
