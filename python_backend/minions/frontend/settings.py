"""The OpenAI frontend's own options, each default defined once: a field here, a flag of
`python -m minions.frontend` (`--max-body-bytes`, ...). The limits the `minions` model enforces (the
context, `max_tokens_limit`) are the deployment's (minions.settings), not repeated here."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields


def _option(default: int, help: str) -> int:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class FrontendSettings:
    """Request-size limits and the 503 answer's retry hint."""

    max_body_bytes: int = _option(4 * 2**20, "a request body above this many bytes gets 413")
    max_stop_strings: int = _option(4, "stop strings a request may send at most (OpenAI's 4)")
    max_stop_chars: int = _option(256, "characters of one stop string at most (each is matched against the "
                                       "text at every token)")
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
