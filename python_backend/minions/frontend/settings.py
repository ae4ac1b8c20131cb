"""The OpenAI frontend's own options, each default defined once: a field here, a flag of
`python -m minions.frontend` (`--max-body-bytes`, ...). The limits the `minions` model enforces (the
context, `max_tokens_limit`) are the deployment's (minions.settings), not repeated here; the stop-string
limits default to the model's (minions.settings), which refuses beyond them on Triton's own ports too."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

from minions.settings import DEFAULTS


def _option(default: int, help: str) -> int:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class FrontendSettings:
    """Request-size limits and the 503 answer's retry hint."""

    max_body_bytes: int = _option(4 * 2**20, "a request body above this many bytes gets 413")
    max_stop_strings: int = _option(DEFAULTS.limits.stop_strings, "stop strings a request may send at most, as "
                                    "OpenAI allows (the minions model's default max_stop_strings)")
    max_stop_chars: int = _option(DEFAULTS.limits.stop_chars, "characters of one stop string at most, each matched "
                                  "against the text at every token (the minions model's default max_stop_chars)")
    retry_after_s: int = _option(1, "the Retry-After header of a 503 (the server at capacity), in seconds")

    def __post_init__(self) -> None:
        for option in fields(self):
            if getattr(self, option.name) < 0:
                raise ValueError(f"{option.name} must be >= 0, got {getattr(self, option.name)}")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per option, `--max-body-bytes` for `max_body_bytes`, with its default."""
        for option in fields(cls):
            parser.add_argument(f"--{option.name.replace('_', '-')}", type=int, default=option.default,
                                help=f"{option.metadata['help']} (default {option.default})")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FrontendSettings:
        return cls(**{option.name: getattr(args, option.name) for option in fields(cls)})
