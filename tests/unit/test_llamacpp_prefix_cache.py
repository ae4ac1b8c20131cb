"""The llama.cpp engine's prefix cache on the real SmolLM2 GGUF (F16): a new request shares the KV cells
of the longest cached prefix, computes only the rest, and decodes as if it had computed everything.

"As if" is checked against an engine without the cache, on the logits to a tolerance far below what a
wrong prefix would cause, and on the tokens up to the first near tie (test_llamacpp_batching.py's
assert_same_draft: llama.cpp's kernels differ with the batch's shape)."""

from __future__ import annotations

import threading

import pytest

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.engines.inflight_batching import joined
from minions.engines.llamacpp_engine import LlamaCppEngine

from test_llamacpp_batching import alone, assert_same_draft, prompts, with_logits

SLOTS = 3


@pytest.fixture(params=[(0, True), (64, True), (64, False)], ids=["idle-in-kv", "host-memory", "stream-per-slot"])
def engine(smollm2_f16_gguf, request):
    """Finished sequences kept idle in the KV buffer, or copied to host memory (prefix_cache_ram_mib); one
    KV buffer, or a stream of cells per slot (kv_unified false: a live prefix is copied, not shared)."""
    ram_mib, unified = request.param
    engine = LlamaCppEngine(smollm2_f16_gguf, num_threads=1, max_sequences=SLOTS, n_ctx=256,
                            prefix_cache_ram_mib=ram_mib, kv_unified=unified)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(smollm2_f16_gguf):
    """Every request computed from scratch."""
    engine = LlamaCppEngine(smollm2_f16_gguf, num_threads=1, max_sequences=1, n_ctx=256, prefix_caching=False)
    yield engine
    assert engine.prefix_stats.queries == 0, "a disabled cache looks nothing up"
    engine.close()


def prompt(n: int = 60, seed: int = 21) -> list[int]:
    return prompts(1, seed=seed)[0][:12] + prompts(1, seed=seed + 1)[0] * 4 + list(range(500, 500 + n))


def test_a_repeated_prompt_computes_only_its_last_token_and_decodes_as_from_scratch(engine, reference):
    tokens = prompt()
    first = engine.generate(EngineRequest("a", tokens, 6))
    engine.release("a")
    assert first.cached_tokens == 0
    computed, stats = engine.stats.tokens, engine.prefix_stats
    queries, hits = stats.queries, stats.hits
    again = with_logits(EngineRequest("b", tokens, 6))
    result = engine.generate(again)
    assert result.cached_tokens == len(tokens) - 1
    assert engine.stats.tokens - computed == 1 + 5  # the last prompt token, then one per further token
    assert (stats.queries - queries, stats.hits - hits) == (len(tokens), len(tokens) - 1)
    assert_same_draft(result, alone(reference, again))


def test_a_conversation_s_next_turn_reuses_the_earlier_turn_and_its_answer(engine, reference):
    turn1 = prompt(seed=31)
    answer = engine.generate(EngineRequest("t1", turn1, 8)).tokens
    engine.release("t1")
    turn2 = with_logits(EngineRequest("t2", turn1 + answer + [7, 8, 9], 5))
    result = engine.generate(turn2)
    # Every token but the answer's last was evaluated (that one was made, not fed back in).
    assert result.cached_tokens == len(turn1) + len(answer) - 1
    assert_same_draft(result, alone(reference, turn2))


def test_a_partial_match_computes_from_where_the_prompts_part(engine, reference):
    base = prompt(seed=41)
    engine.generate(EngineRequest("p1", base, 2))
    engine.release("p1")
    other = with_logits(EngineRequest("p2", base[:30] + [1, 2, 3, 4], 4))
    result = engine.generate(other)
    assert result.cached_tokens == 30
    assert_same_draft(result, alone(reference, other))


def test_a_live_sequence_shares_its_prefix_with_a_new_one_and_neither_disturbs_the_other(engine, reference):
    tokens = prompt(seed=51)
    long = with_logits(EngineRequest("long", tokens, 24, streaming=True))
    twin = with_logits(EngineRequest("twin", tokens, 5))
    results: dict[str, list[EngineResult]] = {"long": [], "twin": []}
    done = threading.Semaphore(0)

    def answer(name: str):
        def record(value: EngineResult | Exception) -> None:
            assert isinstance(value, EngineResult)
            results[name].append(value)
            if name == "long" and len(results["long"]) == 1:  # long's prefill is done: twin joins now
                engine.submit([(twin, answer("twin"))])
            if value.final:
                done.release()
        return record

    engine.submit([(long, answer("long"))])
    for _ in range(2):
        assert done.acquire(timeout=60)
    (twin_result,) = results["twin"]
    assert twin_result.cached_tokens == len(tokens) - 1, "it shared the live sequence's cells"
    assert_same_draft(twin_result, alone(reference, twin))
    long_result = joined(results["long"])
    assert len(long_result.tokens) == 24
    assert_same_draft(long_result, alone(reference, long))


def test_a_request_stopped_before_or_after_its_prefill_leaves_the_cache_sound(engine, reference):
    """A prefill is one decode step, so a cancellation lands before it or after it: a stop sent with the
    call ends it before its first step (nothing cached), one sent after its first token ends it there
    (its prompt cached). A request sharing the prompt, running beside it, decodes as from scratch."""
    tokens = prompt(seed=61)
    early = EngineRequest("early", tokens, 40, streaming=True)
    beside = with_logits(EngineRequest("beside", tokens, 6))
    outcome = engine.generate_batch([early, beside, EngineRequest.release("early")])
    assert outcome[0].tokens == [], "stopped before its first step"
    assert_same_draft(outcome[1], alone(reference, beside))

    later = EngineRequest("later", tokens + [3], 40, streaming=True)
    first_token = threading.Event()
    finished = threading.Event()

    def stop_after_first_token(value: EngineResult | Exception) -> None:
        assert isinstance(value, EngineResult)
        if not value.final and not first_token.is_set():
            first_token.set()
            engine.submit([(EngineRequest.release("later"), lambda _: None)])
        if value.final:
            finished.set()

    engine.submit([(later, stop_after_first_token)])
    assert finished.wait(60)
    after = with_logits(EngineRequest("after", tokens + [3, 4], 6))
    result = engine.generate(after)
    assert result.cached_tokens == len(tokens) + 1, "the stopped request's prompt stayed cached"
    assert_same_draft(result, alone(reference, after))


def test_idle_prefixes_make_room_oldest_first_within_the_slots(engine):
    if engine.stepper.slots.stored_bytes:
        pytest.skip("with a host-memory tier no prefix stays idle in a slot")
    prompts_ = [prompt(seed=70 + i) for i in range(SLOTS + 1)]
    for i, tokens in enumerate(prompts_):
        engine.generate(EngineRequest(f"e{i}", tokens, 2))
        engine.release(f"e{i}")
    slots = engine.stepper.slots
    assert len(slots) == SLOTS and not slots.free
    assert engine.generate(EngineRequest("old", prompts_[0], 2)).cached_tokens < len(prompts_[0]) - 1, \
        "the oldest prefix was evicted"
    assert engine.generate(EngineRequest("new", prompts_[-1], 2)).cached_tokens == len(prompts_[-1]) - 1


def test_with_a_host_memory_tier_finished_cells_leave_the_kv_buffer_and_come_back(smollm2_f16_gguf, reference):
    """Idle cells would slow every step of the live sequences (attention visits every cell up to the
    highest in use): a finished sequence's cells are stored and cleared, and a later request that
    shares its prefix gets them back."""
    import llama_cpp

    engine = LlamaCppEngine(smollm2_f16_gguf, num_threads=1, max_sequences=SLOTS, n_ctx=256, prefix_cache_ram_mib=64)
    try:
        memory = llama_cpp.llama_get_memory(engine.stepper._ctx.ctx)
        tokens = prompt(seed=90)
        engine.generate(EngineRequest("a", tokens, 4))
        engine.release("a")
        slots = engine.stepper.slots
        assert len(slots.free) == SLOTS and not slots.idle and len(slots.stored) == 1
        assert all(llama_cpp.llama_memory_seq_pos_max(memory, s) == -1 for s in range(SLOTS)), "no cell is left"
        again = with_logits(EngineRequest("b", tokens + [7, 8], 4))
        result = engine.generate(again)
        assert result.cached_tokens == len(tokens)  # the stored prompt, up to where the new one differs
        assert_same_draft(result, alone(reference, again))
    finally:
        engine.close()


def test_the_warm_up_at_load_leaves_no_cells_and_counts_no_work(smollm2_f16_gguf):
    """The stepper decodes a few tokens at load (llama-server's warm-up: the mapped weights are read
    before the first request, not during it); none of them may stay in the KV cache, where a request
    in their slot would attend to them, nor count as served work."""
    import llama_cpp

    engine = LlamaCppEngine(smollm2_f16_gguf, num_threads=1, max_sequences=SLOTS, n_ctx=256)
    try:
        stepper = engine.stepper
        memory = llama_cpp.llama_get_memory(stepper._ctx.ctx)
        assert [llama_cpp.llama_memory_seq_pos_max(memory, seq) for seq in range(SLOTS)] == [-1] * SLOTS
        assert stepper.stats.passes == 0 and stepper.stats.tokens == 0
    finally:
        engine.close()
