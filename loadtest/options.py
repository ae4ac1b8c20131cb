"""The load options shared by the Locust file and the runner, each with its one default.

The Locust file adds them to Locust's own command line (and environment: MINIONS_LOADTEST_<NAME>);
the runner adds them to its command line and hands their values on to Locust."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minions.text.datasets import CHAT_SETS_VAR, DEFAULT_CHAT_SETS, mixed_prompts, named_sets


@dataclass(frozen=True)
class Option:
    name: str
    """The attribute on the parsed options (`max_tokens`); the flag is `--max-tokens`."""
    type: Callable[[str], Any]
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env_var(self) -> str:
        return "MINIONS_LOADTEST_" + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("grpc_host", str, "127.0.0.1:8001", "gRPC address (host:port) of the server for the gRPC user; the "
           "HTTP user takes Locust's --host"),
    Option("openai_host", str, "http://127.0.0.1:9000/v1", "base URL of an OpenAI-compatible API for the openai "
           "user (Minions' frontend, as `make serve` runs it, or another server, e.g. llama-server's)"),
    Option("openai_model", str, "minions", "the `model` the openai user names (Minions' frontend serves its "
           "orchestrator's name; llama-server ignores it)"),
    Option("max_tokens", int, 64, "output tokens per request"),
    Option("speculation", str, "", "speculation mode of every request (off, vote, bandit, single:<ssm>); "
           "empty: the deployment's default"),
    Option("temperature", float, 0.0, "sampling temperature (0: greedy)"),
    Option("datasets", str, "", "comma-separated prompt sets, taken in turn (datasets/README.md: code_edit and "
           f"passages are copy-heavy); empty: the chat sets of {CHAT_SETS_VAR}, else "
           f"{','.join(DEFAULT_CHAT_SETS)}"),
    Option("prompts", int, 200, "prompts loaded from the sets; the users cycle through them"),
    Option("response_timeout", float, 60.0, "seconds a stream may stay silent before it is cancelled and "
           "counted as a failure"),
    Option("records", str, "", "file the users append one JSON line per request to (empty: none)"),
)


def add_options(parser, with_env: bool = False, exclude: tuple[str, ...] = ()) -> None:
    """Add the options (but `exclude`) to an argparse (or Locust's configargparse) parser; `with_env`:
    also read each from its environment variable (configargparse only)."""
    for o in OPTIONS:
        if o.name in exclude:
            continue
        extra = {"env_var": o.env_var} if with_env else {}
        parser.add_argument(o.flag, type=o.type, default=o.default, help=o.help, **extra)


def prompts(values: Any) -> list[str]:
    """The prompts the options select (--prompts of the --datasets sets, taken in turn); MissingPromptSet
    when a set is not there."""
    return mixed_prompts(values.prompts, named_sets(values.datasets))


def option_args(values: Any) -> list[str]:
    """The options' values (attributes of `values`) as command-line arguments, to hand on to Locust."""
    return [arg for o in OPTIONS for arg in (o.flag, str(getattr(values, o.name)))]
