"""What a deployment file may say: every key, its type and range, which keys it must give.

Checked before anything is rendered, so that a mistake is reported as one line naming its key, not as a
traceback from deep in the renderer or, for a misspelt key, not at all. The engines' and the orchestrator's
settings are checked against their dataclasses (minions/settings.py: types, `ranged`, `derived`), so a new
setting needs no change here. Pure: `problems` returns the problems found, the caller reports them.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from minions.errors import InvalidRequest
from minions.settings import EngineKind, EngineSettings, OrchestratorSettings
from minions.settings_fields import DERIVED, RANGE
from minions.trtllm_settings import TrtllmSettings
from minions.speculation.mode import Speculation, SpeculationMode


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


TEXT = "text"
"""The kind of a setting of type str: from_yaml reads a number as its text (default_num_draft_tokens: 4)."""
TYPES: dict[Any, tuple[str, Callable[[Any], bool]]] = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", _is_int),
    float: ("a number", _is_number),
    str: ("a string", lambda v: isinstance(v, str)),
    TEXT: ("a string", lambda v: isinstance(v, str) or _is_number(v)),
    tuple[int, ...]: ("a list of integers", lambda v: isinstance(v, list) and all(map(_is_int, v))),
    tuple[str, ...]: ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    dict: ("a mapping", lambda v: isinstance(v, dict)),
    list: ("a list", lambda v: isinstance(v, list)),
}
"""Each type a key may have: how a problem names it, and whether a YAML value is one."""
NUMERIC = (int, float, tuple[int, ...])
"""Types whose numbers have a range."""


@dataclass(frozen=True)
class Key:
    """One key of a section: its type (a TYPES key), whether the file must give it, the range of its numbers
    (highest None: no bound), the values it is one of, whether null stands for its default, and whether it
    is a setting the renderer derives (named, so that setting it is explained, not called unknown)."""

    kind: Any
    required: bool = False
    lowest: float = 0
    highest: float | None = None
    choices: type[StrEnum] | None = None
    nullable: bool = False
    derived: bool = False


PORT = Key(int, lowest=1, highest=65535)
TOP = {"server": Key(dict), "cache_dir": Key(str), "llm": Key(dict, required=True), "ssms": Key(list),
       "orchestrator": Key(dict, required=True)}
SERVER = {"host": Key(str), "http_port": PORT, "grpc_port": PORT, "metrics_port": PORT,
          "openai_port": dataclasses.replace(PORT, lowest=0), "log_verbose": Key(int), "triton_home": Key(str)}
"""Read by ServerPorts.of and deploy/server.py (which hold the defaults)."""
MODEL = {"name": Key(str, required=True), "engine": Key(str, required=True, choices=EngineKind),
         "source": Key(str), "optional": Key(bool)}
"""Every model entry's own keys (deploy/config.py, render.py); its settings come from its settings class."""
KIND_KEYS = {EngineKind.LLAMACPP: {"repack": Key(str)}}
"""Keys only one engine kind reads."""
SOURCED = {EngineKind.TORCH, EngineKind.LLAMACPP, EngineKind.TENSORRTLLM}
"""Engine kinds whose model files come from `source` (and the LLM, whose tokenizer does)."""
ORCHESTRATOR = {"name": Key(str)}
"""The orchestrator's own key: its model's name (OrchestratorSettings.model_name unless given)."""
SPECULATION = "default_speculation"
"""The orchestrator setting that is a speculation mode (checked by speculation/mode.py's parser)."""


def settings_keys(cls: type) -> dict[str, Key]:
    """A settings dataclass's fields as deploy.yaml keys, with their types and ranges (numbers >= 0 unless
    `ranged`); null keeps the default, as from_yaml reads it."""
    keys = {}
    for name, (f, kind) in cls.flat_fields().items():
        lowest, highest = f.metadata.get(RANGE, (0, None))
        keys[name] = Key(TEXT if kind is str else kind, lowest=lowest, highest=highest, nullable=True,
                         derived=bool(f.metadata.get(DERIVED)))
    return keys


def settings_class(kind: EngineKind) -> type:
    """Which settings an engine kind's entry holds."""
    return TrtllmSettings if kind == EngineKind.TENSORRTLLM else EngineSettings


def normalized(raw: Any) -> Any:
    """The file as its settings mean it: YAML reads an unquoted `off` as false, so a speculation mode of
    false is the mode `off`. Returns a new mapping where it changes one."""
    orchestrator = raw.get("orchestrator") if isinstance(raw, dict) else None
    if isinstance(orchestrator, dict) and orchestrator.get(SPECULATION) is False:
        return {**raw, "orchestrator": {**orchestrator, SPECULATION: str(SpeculationMode.OFF)}}
    return raw


def problems(raw: Any) -> list[str]:
    """Every problem of a loaded (normalized) deployment file, one line each: `<key path>: <problem>`."""
    if not isinstance(raw, dict):
        return [f"expected a mapping of sections ({', '.join(TOP)}), got {_shown(raw)}"]
    found = _section(raw, TOP, "")
    if isinstance(raw.get("server"), dict):
        found += _section(raw["server"], SERVER, "server.")
    models = {"llm": raw["llm"]} if isinstance(raw.get("llm"), dict) else {}
    for i, entry in enumerate(raw["ssms"] if isinstance(raw.get("ssms"), list) else []):
        if isinstance(entry, dict):
            models[f"ssms[{i}]"] = entry
        else:
            found.append(f"ssms[{i}]: expected a mapping, got {_shown(entry)}")
    for path, entry in models.items():
        found += _model(entry, path)
    ssm_names = tuple(m["name"] for path, m in models.items() if path != "llm" and isinstance(m.get("name"), str))
    if isinstance(raw.get("orchestrator"), dict):
        known = ssm_names if isinstance(raw.get("ssms", []), list) else None
        found += _orchestrator(raw["orchestrator"], known)
        models = {"orchestrator": {"name": raw["orchestrator"].get("name", OrchestratorSettings.model_name)}, **models}
    return found + _duplicate_names(models)


def _model(entry: Mapping, path: str) -> list[str]:
    """An engine model's entry: its own keys, and its engine kind's settings."""
    kind = entry.get("engine")
    known = kind in list(EngineKind)
    keys = {**MODEL}
    if path == "llm" or (known and kind in SOURCED):
        keys["source"] = Key(str, required=True)
    if not known:  # its settings are unknown: check only what every entry has
        return _section({k: v for k, v in entry.items() if k in keys}, keys, f"{path}.")
    keys = {**settings_keys(settings_class(kind)), **keys, **KIND_KEYS.get(kind, {})}
    found = _section(entry, keys, f"{path}.")
    if settings_class(kind) is EngineSettings:
        try:
            EngineSettings.from_yaml(_typed(entry, keys)).check()
        except ValueError as exc:
            found.append(f"{path}: {exc}")
    return found


def _orchestrator(section: Mapping, ssm_names: tuple[str, ...] | None) -> list[str]:
    """The orchestrator section: its settings, then the checks of the values OrchestratorSettings reads
    (those of the right type): the speculation mode's (against `ssm_names`; None: unknown, unchecked) and
    the settings' own `check`."""
    keys = {**settings_keys(OrchestratorSettings), **ORCHESTRATOR}
    found = _section(section, keys, "orchestrator.")
    typed = _typed(section, keys)
    if SPECULATION in typed and ssm_names is not None:
        try:
            Speculation.parse(str(typed[SPECULATION]), ssm_names)
        except InvalidRequest as exc:
            found.append(f"orchestrator.{SPECULATION}: {exc}")
    try:
        OrchestratorSettings.from_yaml(typed).check()
    except ValueError as exc:
        found.append(f"orchestrator: {exc}")
    return found


def _typed(section: Mapping, keys: Mapping[str, Key]) -> dict:
    """The section's settings whose values are of the right type (what a settings class can read, so
    its own checks can run on them); problems with the others are reported by `_section`."""
    return {k: v for k, v in section.items() if k in keys and not keys[k].derived and v is not None
            and _value_problem(k, v, keys[k]) is None}


def _duplicate_names(models: Mapping[str, Mapping]) -> list[str]:
    """Each served model is a directory of the repository: a name may be used once."""
    first: dict[str, str] = {}
    found = []
    for path, entry in models.items():
        name = entry.get("name")
        if isinstance(name, str) and name in first:
            found.append(f"{path}.name: {name!r} is already the name of {first[name]}")
        elif isinstance(name, str):
            first[name] = path
    return found


def _section(values: Mapping, keys: Mapping[str, Key], path: str) -> list[str]:
    """One mapping's problems: required keys absent, unknown keys, values of the wrong type or range."""
    found = [f"{path}{name}: required" for name, key in keys.items() if key.required and values.get(name) is None]
    for name, value in values.items():
        key = keys.get(name)
        if key is None:
            found.append(f"{path}{name}: unknown key{_did_you_mean(str(name), keys)}")
        elif key.derived:
            found.append(f"{path}{name}: derived from the rest of the deployment, not set in the file")
        elif value is not None or not (key.required or key.nullable):
            problem = _value_problem(str(name), value, key)
            found += [f"{path}{name}: {problem}"] if problem else []
    return found


def _value_problem(name: str, value: Any, key: Key) -> str | None:
    what, fits = TYPES[key.kind]
    if not fits(value):
        quote = " (quote it to keep it text)" if isinstance(value, bool) and key.kind in (str, TEXT) else ""
        return f"expected {what}, got {_shown(value)}{quote}"
    if key.choices is not None and value not in list(key.choices):
        return f"unknown {name} {value!r}; one of: {', '.join(key.choices)}"
    if key.kind in NUMERIC:
        for number in value if isinstance(value, list) else [value]:
            if number < key.lowest or (key.highest is not None and number > key.highest):
                bounds = f">= {key.lowest}" if key.highest is None else f"between {key.lowest} and {key.highest}"
                return f"must be {bounds}, got {number}"
    return None


def _did_you_mean(name: str, keys: Mapping[str, Key]) -> str:
    close = difflib.get_close_matches(name, [k for k, key in keys.items() if not key.derived], n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _shown(value: Any) -> str:
    """A YAML value as the file spells it (true, null) or, for a section, what it is."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, dict | list):
        return "a mapping" if isinstance(value, dict) else "a list"
    return repr(value)
