"""The machinery every settings dataclass shares (settings.py, trtllm_settings.py): fields the renderer
derives, numeric ranges deploy.yaml must respect, groups of one concern nested in code but flat in files,
and the conversion to and from deploy.yaml values and config.pbtxt's string parameters."""

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
GROUP = "group"
"""Field metadata: the prefix of a group's settings' flat keys (`group`)."""


def derived(default: Any) -> Any:
    """A setting the renderer computes (model names, paths, budgets): deploy.yaml may not set it."""
    return dataclasses.field(default=default, metadata={DERIVED: True})


def ranged(default: Any, lowest: float, highest: float | None = None) -> Any:
    """A numeric setting whose deploy.yaml value must lie in [lowest, highest] (minions.deploy.schema);
    numbers declared plainly must be >= 0."""
    return dataclasses.field(default=default, metadata={RANGE: (lowest, highest)})


def group(cls: type[Settings], prefix: str) -> Any:
    """A group of settings of one concern (a Settings dataclass of its own), read in code as
    `settings.probe.min_gap` and written flat in deploy.yaml and config.pbtxt as `prefix + name`
    (`probe_min_gap`)."""
    return dataclasses.field(default_factory=cls, metadata={GROUP: prefix})


class Settings:
    """Conversion between a settings dataclass and mappings of YAML values or config.pbtxt strings, both
    keyed flat: a group's settings under their prefixed names (`group`)."""

    @classmethod
    def flat_fields(cls) -> dict[str, tuple[dataclasses.Field, type]]:
        """Every setting by its flat key (its name in deploy.yaml and config.pbtxt): its field and type."""
        hints = typing.get_type_hints(cls)
        found: dict[str, tuple[dataclasses.Field, type]] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if GROUP in f.metadata:
                found |= {f.metadata[GROUP] + k: v for k, v in hints[f.name].flat_fields().items()}
            else:
                found[f.name] = (f, hints[f.name])
        return found

    @classmethod
    def from_flat(cls: type[S], values: Mapping[str, Any]) -> S:
        """From typed values by flat key; absent ones keep their defaults, unknown ones are ignored."""
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if GROUP in f.metadata:
                prefix = f.metadata[GROUP]
                kwargs[f.name] = hints[f.name].from_flat(
                    {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)})
            elif f.name in values:
                kwargs[f.name] = values[f.name]
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls: type[S], entry: Mapping[str, Any], **derived: Any) -> S:
        """From a deploy.yaml section; keys that are not settings (name, source, ...) are ignored.
        `derived`: values the renderer computes (model names, paths, budgets)."""
        fields = cls.flat_fields()
        values = {k: _convert(fields[k][1], k, v) for k, v in entry.items() if k in fields and v is not None}
        return cls.from_flat({**values, **derived})

    @classmethod
    def from_params(cls: type[S], params: Mapping[str, str]) -> S:
        """From config.pbtxt string parameters (as rendered by `params`); absent or empty ones keep their default."""
        fields = cls.flat_fields()
        return cls.from_flat({k: _convert(fields[k][1], k, v) for k, v in params.items() if k in fields and v != ""})

    def flat_values(self) -> dict[str, Any]:
        """Every setting's value by its flat key."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if GROUP in f.metadata:
                values |= {f.metadata[GROUP] + k: v for k, v in value.flat_values().items()}
            else:
                values[f.name] = value
        return values

    def params(self) -> dict[str, str]:
        """Every setting as a config.pbtxt string parameter."""
        return {k: _render(v) for k, v in self.flat_values().items()}

    def with_keys(self: S, **values: Any) -> S:
        """A copy with the settings named by their flat keys replaced (dataclasses.replace, flat)."""
        unknown = set(values) - set(self.flat_fields())
        if unknown:
            raise TypeError(f"{type(self).__name__} has no setting {', '.join(sorted(unknown))}")
        return type(self).from_flat({**self.flat_values(), **values})


def _convert(kind: type, name: str, value: Any) -> Any:
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
