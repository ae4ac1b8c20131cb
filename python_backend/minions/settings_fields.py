"""The machinery every settings dataclass shares (settings.py, trtllm_settings.py): fields the renderer
derives, numeric ranges deploy.yaml must respect, and the conversion to and from deploy.yaml values and
config.pbtxt's string parameters."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

S = TypeVar("S", bound="Settings")

DERIVED = "derived"
"""Field metadata: the renderer computes this setting from the rest of the deployment; not a deploy.yaml key."""
RANGE = "range"
"""Field metadata: the (lowest, highest) a number in deploy.yaml must lie in; highest None: no bound."""


def derived(default: Any) -> Any:
    """A setting the renderer computes (model names, paths, budgets): deploy.yaml may not set it."""
    return dataclasses.field(default=default, metadata={DERIVED: True})


def ranged(default: Any, lowest: float, highest: float | None = None) -> Any:
    """A numeric setting whose deploy.yaml value must lie in [lowest, highest] (minions.deploy.schema);
    numbers declared plainly must be >= 0."""
    return dataclasses.field(default=default, metadata={RANGE: (lowest, highest)})


class Settings:
    """Conversion between a settings dataclass and mappings of YAML values or config.pbtxt strings."""

    @classmethod
    def from_yaml(cls: type[S], entry: Mapping[str, Any], **derived: Any) -> S:
        """From a deploy.yaml section; keys that are not settings (name, source, ...) are ignored.
        `derived`: values the renderer computes (model names, paths, budgets)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values = {k: _convert(cls, k, v) for k, v in entry.items() if k in names and v is not None}
        return cls(**{**values, **derived})

    @classmethod
    def from_params(cls: type[S], params: Mapping[str, str]) -> S:
        """From config.pbtxt string parameters (as rendered by `params`); absent or empty ones keep their default."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: _convert(cls, k, v) for k, v in params.items() if k in names and v != ""})

    def params(self) -> dict[str, str]:
        """Every setting as a config.pbtxt string parameter."""
        return {f.name: _render(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


def _convert(cls: type, name: str, value: Any) -> Any:
    kind = typing.get_type_hints(cls)[name]
    if kind is bool:
        return value if isinstance(value, bool) else str(value).strip().lower() == "true"
    if kind in (int, float, str):
        return kind(value)
    if kind == tuple[int, ...]:
        items = value.split(",") if isinstance(value, str) else value
        return tuple(int(x) for x in items if str(x).strip())
    if kind == tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        return tuple(str(x).strip() for x in items if str(x).strip())
    raise TypeError(f"setting {name!r} has an unsupported type {kind}")


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)
