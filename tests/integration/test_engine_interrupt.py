"""The LLM engine model's interrupt over Triton's gRPC, as the orchestrator sends it when a draft turns
up while plain tokens stream: a `stop` with the `keep_sequence` request parameter ends the running
stream and keeps the sequence in its slot, so the next call continues it without a prefix-cache lookup.
A plain `stop` (a release) gives the sequence up, and the next call has to look it up again (the case
that shows the counter can tell the two apart)."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from minions.decoding.engine_call import EngineRequest
from minions.triton.engine_client import TritonEngineClient
from tests.integration.helpers import metric_above, metric_value

LLM = "llm"
LONG = 1024
"""Tokens the stream is asked for: more than it could make (12 s and more here) before the `stop` sent
after its second token is taken, however busy the machine."""


def _tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1000, 40000, n)]


async def _stream_end_and_continue(url: str, end: str) -> int:
    """A new sequence streams plain tokens; after two, `end` ("interrupt" or "release") ends the stream;
    a second call continues the sequence from every token made. Returns the tokens the prefix-cache
    lookups of these calls and of a last, unrelated call must add up to."""
    client = TritonEngineClient(url, frozenset({LLM}), stall_timeout_s=60)
    sequence, prompt = f"interrupt-{uuid.uuid4().hex}", _tokens(60, seed=len(end))
    made: list[int] = []
    async for result in client.stream(LLM, EngineRequest(sequence, prompt, LONG, streaming=True,
                                                         exclude_input_in_output=True)):
        made += result.tokens
        if len(made) >= 2 and len(made) - len(result.tokens) < 2:  # once
            await getattr(client, end)(LLM, sequence)
    assert 2 <= len(made) < LONG, "the stream ran to its end"
    go_on = await client.generate(LLM, EngineRequest(sequence, prompt + made, 2, exclude_input_in_output=True))
    assert len(go_on.tokens) == 2
    await client.release(LLM, sequence)
    last = _tokens(7, seed=99)
    await client.generate(LLM, EngineRequest(f"after-{sequence}", last, 1, exclude_input_in_output=True))
    await client.release(LLM, f"after-{sequence}")
    looked_up_again = len(prompt) + len(made) if end == "release" else 0
    return len(prompt) + looked_up_again + len(last)


@pytest.mark.parametrize("end", ["interrupt", "release"])
def test_an_interrupt_keeps_the_sequence_and_a_release_gives_it_up(server, end):
    queries = metric_value(server.metrics_url, "minions_prefix_cache_queries", model=LLM)
    expected = asyncio.run(_stream_end_and_continue(server.grpc_url, end))
    # The last call's lookup came after the others: once the exported counter includes it, it
    # includes all of them.
    assert metric_above(server.metrics_url, "minions_prefix_cache_queries", queries + expected - 1,
                        timeout=20, model=LLM) == queries + expected
