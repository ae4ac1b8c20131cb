"""engines/in_process.py and triton/lookups.py: the orchestrator's own lookup drafters answer their calls as
their Triton models would (same drafts, same release), built from the configs the repository holds, and
every other model's calls reach the remote client untouched."""

from __future__ import annotations

import asyncio

import yaml

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.deploy.config import load_deployment
from minions.deploy.render import render_repository
from minions.engines.in_process import InProcessEngines
from minions.engines.ngram_engine import NgramEngine
from minions.engines.suffix_engine import SuffixEngine
from minions.triton.lookups import in_process_lookups

TEXT = [5, 6, 7, 8, 9, 10, 11, 12, 3, 4, 5, 6, 7]
"""Continues as it did after 5 6 7: 8 9 10 11 12 ..."""


class RemoteCalls:
    """The remote client's side: records what reached it, answers one token."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    async def generate(self, model, request):
        self.calls.append(("generate", model, request.request_id))
        return EngineResult([1])

    async def _stream(self, model, request):
        self.calls.append(("stream", model, request.request_id))
        yield EngineResult([1], final=False)
        yield EngineResult([2])

    def stream(self, model, request):
        return self._stream(model, request)

    async def release(self, model, request_id):
        self.calls.append(("release", model, request_id))

    async def interrupt(self, model, request_id):
        self.calls.append(("interrupt", model, request_id))


def suffix() -> SuffixEngine:
    return SuffixEngine(max_match=24, min_match=2, min_prob=0.1, corpus_tokens=1000, max_sequences=4, spec_factor=2)


def ask(sequence: list[int], request_id: str = "r1") -> EngineRequest:
    return EngineRequest(request_id, list(sequence), 4, return_log_probs=True, exclude_input_in_output=True)


def test_a_local_lookup_drafts_as_its_model_would_and_nothing_reaches_the_remote():
    remote, twin = RemoteCalls(), suffix()
    client = InProcessEngines(remote, {"ssm_suffix": suffix()})
    result = asyncio.run(client.generate("ssm_suffix", ask(TEXT)))
    expected = twin.generate(ask(TEXT))
    assert result.tokens == expected.tokens == [8, 9, 10, 11]
    assert result.log_probs == expected.log_probs
    assert remote.calls == []


def test_a_release_ends_the_local_sequence_and_its_text_drafts_for_the_next_request():
    engine = suffix()
    client = InProcessEngines(RemoteCalls(), {"ssm_suffix": engine})

    async def run() -> EngineResult:
        await client.generate("ssm_suffix", ask([20, 21, 22, 23, 24, 25], "first"))
        assert len(engine.cache) == 1
        await client.release("ssm_suffix", "first")
        assert len(engine.cache) == 0
        return await client.generate("ssm_suffix", ask([30, 20, 21], "second"))

    assert asyncio.run(run()).tokens[:3] == [22, 23, 24], "the released request's text joined the corpus"


def test_a_local_stream_is_one_whole_answer_and_a_remote_stream_is_the_remote_own():
    remote = RemoteCalls()
    client = InProcessEngines(remote, {"ssm_ngram": NgramEngine(3, 2, 2.0)})

    async def run() -> tuple[list[list[int]], list[list[int]]]:
        local = [r.tokens async for r in client.stream("ssm_ngram", ask(TEXT))]
        stream = client.stream("llm", ask(TEXT))
        assert stream.ag_code is RemoteCalls._stream.__code__, "the remote's iterator, not a wrapper around it"
        return local, [r.tokens async for r in stream]

    local, streamed = asyncio.run(run())
    assert local == [[8, 9, 10, 11]] and streamed == [[1], [2]]
    assert remote.calls == [("stream", "llm", "r1")]


def test_other_models_calls_go_to_the_remote_and_a_local_engine_has_no_stream_to_interrupt():
    remote = RemoteCalls()
    client = InProcessEngines(remote, {"ssm_ngram": NgramEngine(3, 2, 2.0)})

    async def run() -> None:
        assert (await client.generate("llm", ask(TEXT))).tokens == [1]
        await client.release("llm", "r1")
        await client.interrupt("llm", "r1")
        await client.interrupt("ssm_ngram", "r1")

    asyncio.run(run())
    assert remote.calls == [("generate", "llm", "r1"), ("release", "llm", "r1"), ("interrupt", "llm", "r1")]


def test_lookups_are_built_from_the_rendered_configs_and_an_unreadable_one_is_left_to_triton(tmp_path, tiny_llm):
    llm_dir = tmp_path / "llm"
    tiny_llm.save_pretrained(llm_dir)
    raw = {"cache_dir": str(tmp_path / "cache"),
           "llm": {"name": "llm", "engine": "torch", "source": str(llm_dir)},
           "ssms": [{"name": "ssm_ngram", "engine": "ngram", "max_ngram": 4, "min_ngram": 3},
                    {"name": "ssm_suffix", "engine": "suffix", "suffix_max_match": 7}],
           "orchestrator": {"name": "minions"}}
    (tmp_path / "deploy.yaml").write_text(yaml.safe_dump(raw))
    repo = render_repository(load_deployment(tmp_path / "deploy.yaml"), tmp_path / "repo")
    engines = in_process_lookups(repo, ["ssm_ngram", "ssm_suffix", "ssm_gone"])
    assert set(engines) == {"ssm_ngram", "ssm_suffix"}
    assert (engines["ssm_ngram"].max_ngram, engines["ssm_ngram"].min_ngram) == (4, 3)
    assert engines["ssm_suffix"].max_match == 7
