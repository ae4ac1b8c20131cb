"""The shape a model's config promises for each output, and whether a response keeps that promise:
from a model_repository template (unit tests) or from a running server's own config (integration)."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from minions.deploy.render import TEMPLATES, TENSORRT_LLM_IO
from minions.serving.inputs import pbtxt_inputs

ModelConfig = model_config_pb2.ModelConfig


def template_config(template: str, max_batch_size: int = 8) -> ModelConfig:
    """model_repository/<template>/config.pbtxt parsed as Triton parses it, its placeholders filled as
    minions.deploy.render fills them (settings left out: they declare no tensor)."""
    text = string.Template((TEMPLATES / template / "config.pbtxt").read_text()).safe_substitute(
        model_name=template, instance_count="1", max_batch_size=str(max_batch_size),
        tensorrt_llm_io=TENSORRT_LLM_IO.read_text(), minions_inputs=pbtxt_inputs(), parameters="")
    assert not re.search(r"^[^#\n]*\$\{\w+\}", text, re.MULTILINE), "a placeholder left unfilled"
    return text_format.Parse(text, ModelConfig())


def promised_shape(config: ModelConfig, name: str) -> list[int]:
    """The shape of output `name` in a response: the batch dimension (when the model batches), then
    its dims; -1 stands for any length."""
    dims = [list(o.dims) for o in config.output if o.name == name]
    assert dims, f"{config.name} declares no output {name!r}"
    return ([-1] if config.max_batch_size > 0 else []) + dims[0]


def fits(shape: Iterable[int], promised: list[int]) -> bool:
    shape = list(shape)
    return len(shape) == len(promised) and all(p in (-1, s) for p, s in zip(promised, shape))


def shape_breaches(config: ModelConfig, shapes: dict[str, Iterable[int]],
                   exceptions: dict[str, tuple[int, ...]] | None = None) -> dict[str, tuple[list[int], list[int]]]:
    """name -> (shape sent, shape promised) for every output in `shapes` that breaks its config;
    `exceptions`: outputs held to an exact shape of their own instead."""
    exceptions = exceptions or {}
    breaches = {}
    for name, shape in shapes.items():
        shape = list(shape)
        if name in exceptions:
            if tuple(shape) != exceptions[name]:
                breaches[name] = (shape, list(exceptions[name]))
        elif not fits(shape, promised := promised_shape(config, name)):
            breaches[name] = (shape, promised)
    return breaches


BLS_TEXT_OUTPUT = {"text_output": (1,)}
"""tensorrt_llm_bls sends text_output as [1] (its postprocessing model's one string per beam), not as
[1, 1] as its config's dims [-1] behind the batch dimension would say, and its end-to-end client reads
it so (`output[0].decode()`): `minions` does the same."""
