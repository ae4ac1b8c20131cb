"""Every deployment setting and its default, defined once.

deploy.yaml's entries become these dataclasses (`from_yaml`), are rendered into the string parameters
of each model's config.pbtxt (`params`), and are read back by the Triton adapters (`from_params`).
So a default lives in one place: a field here (settings_fields.py: how fields are declared and
converted). deploy.yaml documents the values a deployment uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from minions.settings_fields import Settings, derived, group, ranged

class EngineKind(StrEnum):
    """What runs a model (deploy.yaml `engine`): the one list of engine kinds."""

    TORCH = "torch"
    DISTILLED = "distilled"
    LLAMACPP = "llamacpp"
    NGRAM = "ngram"
    SUFFIX = "suffix"
    TENSORRTLLM = "tensorrtllm"
    """Served by Triton's own tensorrtllm backend (trtllm_settings.TrtllmSettings), not by minions.engines."""

    @classmethod
    def listed(cls) -> str:
        return ", ".join(kind.value for kind in cls)


PREFIX_CACHING_ENGINES = frozenset({EngineKind.LLAMACPP, EngineKind.TORCH, EngineKind.DISTILLED})
"""The engine kinds that keep finished sequences' KV for later requests (`prefix_caching`,
`prefix_cache_ram_mib`)."""


@dataclass(frozen=True)
class EngineSettings(Settings):
    """One engine model (the llm or an ssm_* entry of deploy.yaml)."""

    model_name: str = derived("")
    engine: str = ""
    """An EngineKind (tensorrtllm models have TrtllmSettings instead)."""
    model_path: str = derived("")
    """Resolved by the renderer from the entry's `source`."""
    num_threads: int = ranged(2, 1)
    max_batch_size: int = ranged(8, 1)
    """Triton's dynamic batcher (or the in-flight batch) hands up to this many requests to one pass."""
    instance_count: int = ranged(1, 1)
    max_sequences: int = ranged(8, 1)
    """Sequences whose state (KV cache, llama.cpp sequence) the engine keeps, LRU beyond."""
    prefix_caching: bool = True
    """llama.cpp and torch: finished sequences stay as prefixes that new requests share
    (engines/prefix_cache.py, engines/torch_engine.py)."""
    prefix_cache_ram_mib: float = ranged(1024.0, 0)
    """llama.cpp: finished sequences' KV cells are kept in host memory up to this size, least recently
    used first, instead of idle in the KV buffer, where every step's attention visits them (llama-server's
    --cache-ram). 0: idle in the KV buffer. torch: finished sequences' KV is kept up to this size where
    the engine computes (host or GPU memory), within `kv_budget_mb`, which evicts it first; 0: not kept
    (a new request still shares a live sequence's prefix)."""
    kv_unified: bool = True
    """llama.cpp: one KV buffer for every sequence (True), where every token's attention spans every
    sequence's cells, or a stream of cells per sequence, as llama-server runs, where a step goes in one
    ubatch per run of sequences with equal token counts (docs/engines.md)."""
    batch_invariant: bool = False
    """llama.cpp: a token's logits the same however its step was batched (alone, beside other sequences,
    in a draft or a prompt chunk), as vLLM's batch-invariant mode, so that verifying a draft keeps
    exactly the tokens plain decoding would emit: the K cache in Q8_0 beside an F16 V cache, so that
    flash attention goes row by row, and the project's patches for the matrix products (Q4_1, Q4_K_M;
    F16's still depend on the batch). Needs `kv_unified: false`. Refused off x86-64 with AVX2/FMA/F16C,
    or without the patches (docs/engines.md, "Batch-invariant Q4_1")."""
    max_context: int = derived(2048)
    """Set from orchestrator.max_context by the renderer."""
    max_draft_tokens: int = derived(16)
    """Set from orchestrator.max_num_draft_tokens by the renderer: lookup drafters take a request's last
    this many tokens for a draft perhaps still being verified (engines/draft_confidence.py)."""
    dtype: str = "float32"
    """torch engines' weights and KV: float32 | float16 | bfloat16."""
    device: str = "cpu"
    """torch engines: cpu | cuda | cuda:N | auto (cuda when a GPU is visible, else cpu)."""
    min_forward_tokens: int = 1
    kv_budget_mb: float = 0.0
    """0: unbounded."""
    cuda_graphs: bool = True
    """torch on CUDA with a kv_budget_mb: steps as graphs captured within cuda_graph_memory_mb (cuda_graphs.py)."""
    cuda_graph_memory_mb: float = ranged(1024.0, 0)
    draft_min_prob: float = ranged(0.0, 0, 1)
    """llama.cpp: stop a greedy draft early below this top-1 probability (0 = never)."""
    max_ngram: int = ranged(3, 1)
    min_ngram: int = ranged(1, 1)
    ngram_spec_factor: float = ranged(2.0, 0)
    """ngram: a match of m tokens (followed back beyond the n-gram) drafts at most this times m (0: no bound)."""
    suffix_max_match: int = 24
    """suffix: the longest suffix of the sequence matched (tokens)."""
    suffix_min_match: int = 2
    """suffix: the shortest match that drafts (the length of the m-grams it indexes)."""
    suffix_min_prob: float = ranged(0.1, 0, 1)
    """suffix: stop a draft once the product of its tokens' shares among the matches falls below this."""
    suffix_corpus_tokens: int = 200_000
    """suffix: tokens of released sequences kept to draft from, oldest sequences evicted first (0: none)."""
    suffix_spec_factor: float = 2.0
    """suffix: a match of m tokens drafts at most this many times m tokens (0: no limit)."""
    lookup_min_confidence: float = ranged(0.0, 0, 1)
    """ngram, suffix: end a draft where the estimated chance that all its tokens so far are right falls
    below this; learnt per match length from earlier drafts' outcomes (engines/draft_confidence.py).
    0: no cut (0.25 measured within the runs' spread; docs/engines.md)."""

    def kv_budget_bytes(self) -> int | None:
        return int(self.kv_budget_mb * 2**20) if self.kv_budget_mb > 0 else None

    def check(self) -> None:
        """Raise ValueError for settings that contradict each other."""
        if self.batch_invariant and self.kv_unified:
            raise ValueError("batch_invariant needs kv_unified: false (in one KV buffer attention sums over "
                             "cells in the order they were filled)")


@dataclass(frozen=True)
class LimitSettings(Settings):
    """What one request may ask, and how many the server takes at once. deploy.yaml: `max_<name>`."""

    num_draft_tokens: int = 16
    """Draft tokens one round may verify (a request's `num_draft_tokens` up to it; lookups' whole drafts)."""
    tokens_limit: int = ranged(1024, 1)
    """A request's `max_tokens` at most."""
    context: int = ranged(2048, 1)
    """Tokens of prompt and output one request may hold."""
    stop_strings: int = ranged(4, 0)
    """Stop strings (`stop_words`) one request may send at most, as OpenAI and TGI allow; each is matched
    against the generated text at every token. The OpenAI frontend's `--max-stop-strings` defaults to it."""
    stop_chars: int = ranged(256, 1)
    """Characters of one stop string at most: matching one costs up to its length squared per token.
    The OpenAI frontend's `--max-stop-chars` defaults to it."""
    active_requests: int = 0
    """Requests decoding at once at most; later ones wait for a slot (0: the LLM's max_sequences, so that
    no live sequence is evicted and recomputed; `active_requests_limit`)."""
    queued_requests: int = 64
    """Requests waiting for a slot at most; beyond, a request is refused at once with UNAVAILABLE (0: no bound)."""


@dataclass(frozen=True)
class EarlyDraftSettings(Settings):
    """When a request drafts round r+1 while the LLM verifies round r (its `pipeline`), by load
    (speculation/pricing/gates.py, early_draft_pays). deploy.yaml: `pipeline_<name>`."""

    max_load: int = 1
    """Early drafts only while at most this many requests decode (0: always)..."""
    min_hit: float = ranged(0.5, 0, 1)
    """...or while the selector expects an early draft to be used at least this often (0: never)."""


@dataclass(frozen=True)
class VoteSettings(Settings):
    """The weighted vote over SSMs (speculation/vote_drafter.py). deploy.yaml: `vote_<name>`."""

    deadline_ms: float = 500.0
    """A vote with no dominant SSM waits at most this long for its SSMs; a late one is dropped from the round."""
    explore_every: int = 8
    """When one SSM outweighs all others only it drafts, but every this many rounds one challenger (in
    turn) drafts beside it, so that the weights stay measured."""

    @property
    def deadline_s(self) -> float:
        return self.deadline_ms / 1000.0


@dataclass(frozen=True)
class StreamSettings(Settings):
    """How often the LLM's streamed plain tokens reach the orchestrator. deploy.yaml: `llm_stream_<name>`."""

    interval_ms: float = 100.0
    """The first token at once, later ones at most this often (0: every token): each response crosses two
    Python stubs and tritonserver, so fewer of them leave the cores to the engine (docs/engines.md, the
    per-token hop). Other clients of an engine model get every token, as from tensorrt_llm..."""
    max_responses_per_s: float = 80.0
    """...and with many streams the interval grows, so that all of them together send at most this
    many responses a second (0: no bound): at 80, 100 ms up to 8 streams, 200 ms at 16."""


@dataclass(frozen=True)
class SsmHealthSettings(Settings):
    """How a failing SSM is skipped and brought back (speculation/health.py). deploy.yaml: `ssm_<name>`."""

    call_timeout_s: float = 10.0
    """An SSM's draft not back in this long counts as the SSM's failure, and the round goes on without it."""
    breaker_threshold: int = 3
    """Failures in a row after which every request skips the SSM..."""
    breaker_cooldown_s: float = 30.0
    """...for this long (a dead stub's model is also reloaded: `reload`)."""
    reload: bool = True
    """Reload an SSM's model through Triton's repository API when its stub has died (the server must run
    with --model-control-mode=explicit, as minions.deploy.server starts it)."""


@dataclass(frozen=True)
class ProbeSettings(Settings):
    """How a drafting request's plain stream asks its drafters for a draft now and then (probes;
    speculation/watch.py), and where that stops paying (pricing/gates.py, probe_pays). deploy.yaml:
    `probe_<name>`."""

    tokens: int = 8
    """When the LLM streams (a decoupled in-flight engine), a drafting request's plain tokens stream from
    one call while its drafters are asked now and then (probes) for this many tokens (0: never)..."""
    min_draft: int = 4
    """...and a proposal at least this long ends the stream to be verified."""
    first_gap: int = ranged(32, 1)
    """Tokens before a request's first probe; the gap doubles after each probe that found nothing..."""
    min_gap: int = ranged(8, 1)
    """...and falls to this many after a verification that accepted at least half its draft..."""
    max_gap: int = ranged(64, 1)
    """...up to this many."""
    repeat_tokens: int = ranged(3, 0)
    """...but a probe comes `min_gap` tokens after the last one (before a request's first probe: at the
    next token), whatever the back-off, once the sequence's last this many tokens occurred earlier in it
    (where a lookup can draft; 0: by the back-off alone)."""
    max_draft_cost_ms: float = 1.0
    """Drafting counts as nearly free below this many milliseconds per token (the server's measure, per
    set of SSMs, over drafts of at least `min_draft` tokens)."""
    max_load: int = 4
    """Probes only while at most this many requests decode: a probe's stop and verification cost a step
    every request shares. A vote asks its lookups ahead of its model SSMs only as long: each ask delays
    the round's model draft and LLM call, and under load the LLM's passes then hold fewer requests."""


ADAPTIVE = "adaptive"


@dataclass(frozen=True)
class OrchestratorSettings(Settings):
    """The `minions` orchestrator model: request defaults and limits, and the speculation machinery's knobs.
    The request defaults are the shipped deployment's (deploy.yaml repeats them to document them)."""

    model_name: str = derived("minions")
    """deploy.yaml's orchestrator `name`."""
    instance_count: int = ranged(1, 1)
    default_speculation: str = "vote"
    """off | vote | bandit | single:<ssm> (vote:<ssm>,<ssm> for a subset); a deployment that serves no
    SSM must say `off` (the renderer refuses a vote over none)."""
    default_num_draft_tokens: str = ADAPTIVE
    """`adaptive` or a fixed number of draft tokens per round."""
    draft_length_candidates: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8)
    """What the adaptive selector chooses from (0 = plain decoding)."""
    limits: LimitSettings = group(LimitSettings, "max_")
    default_max_tokens: int = ranged(128, 1)
    default_chat: bool = False
    default_use_draft_logits: bool = True
    """Sampled requests: a lone SSM samples its draft and sends its logits (the min(1, p/q) rule)."""
    pipeline: bool = True
    """Draft round r+1 while the LLM verifies round r (a request's `pipeline` overrides)."""
    early_drafts: EarlyDraftSettings = group(EarlyDraftSettings, "pipeline_")
    vote: VoteSettings = group(VoteSettings, "vote_")
    llm_stream: StreamSettings = group(StreamSettings, "llm_stream_")
    engine_stall_timeout_s: float = 60.0
    """An engine call, or a stream between two tokens, silent this long fails its request with an error
    instead of hanging it (a dead or stalled engine stub)."""
    ssm_health: SsmHealthSettings = group(SsmHealthSettings, "ssm_")
    model_poll_interval_s: float = 1.0
    """How often the orchestrator asks Triton which SSM models are ready (unloaded or reloading: skipped)."""
    plain_stretch_tokens: int = ranged(16, 1)
    """When the LLM streams but cannot be stopped mid-stream (a TensorRT-LLM engine: tensorrtllm_backend
    has no `stop` for a running request), plain decoding of a request that drafts streams this many
    tokens from one call before the next plan; other streaming LLMs stream until a probe finds a draft."""
    lookups_in_process: bool = True
    """The lookup drafters (ngram, suffix) answer the orchestrator's calls in its own process, built from
    their models' configs, not through Triton (engines/in_process.py); their models stay loaded."""
    probe: ProbeSettings = group(ProbeSettings, "probe_")
    speculation_max_load: int = ranged(0, 0)
    """Above this many requests decoding, a drafting request decodes plainly (0: no limit), as
    TensorRT-LLM's `max_concurrency` and vLLM's `speculative_disable_by_batch_size` do: where a step's
    cost grows with its tokens (llama.cpp on a CPU), every draft token verified slows every request's
    step, and drafts pay only when nearly all of them are accepted. A running request takes its
    drafting up again when the load falls (its plain stream's probes)."""
    draft_pool_size: int = 0
    """Drafts waiting for the LLM at most (0: the LLM's max_batch_size; `draft_pool`)."""
    # Derived by the renderer from the rest of the deployment:
    llm_model_name: str = derived("llm")
    ssm_model_names: tuple[str, ...] = derived(())
    decoupled_model_names: tuple[str, ...] = derived(())
    llm_max_batch_size: int = derived(EngineSettings.max_batch_size)
    """The LLM's batch (TensorRT-LLM's max_batch_size, else its EngineSettings')."""
    llm_max_sequences: int = derived(EngineSettings.max_sequences)
    """Sequences the LLM keeps live (for TensorRT-LLM: its max_batch_size)."""
    trtllm_model_names: tuple[str, ...] = derived(())
    """Engine models served by TensorRT-LLM's own backend: they take tensorrt_llm's inputs only
    (engines/tensors.py OWN_INPUTS are not sent) and keep no sequence between calls (nothing to release)."""
    lookup_model_names: tuple[str, ...] = derived(())
    """SSMs served by a lookup engine (ngram, suffix): their drafts carry each token's learnt chance of
    being right as log probs, and are cut to the length worth verifying (pricing/worth.py, worth_verifying)."""
    engine_grpc_url: str = derived("127.0.0.1:8001")
    """tritonserver's own gRPC endpoint, through which the orchestrator calls the engine models
    (triton/engine_client.py says why not Python-backend BLS)."""
    tokenizer_path: str = derived("")
    kv_budget_tokens: int = derived(0)
    """The LLM's KV budget in tokens (0: none; admission counts sequences only)."""
    kv_chunk_tokens: int = derived(1)

    @property
    def num_draft_tokens(self) -> int | None:
        """The default draft length; None: adaptive."""
        return None if self.default_num_draft_tokens == ADAPTIVE else int(self.default_num_draft_tokens)

    @property
    def draft_pool(self) -> int:
        """Drafts waiting for the LLM at most: at most one LLM batch of them unless set."""
        return self.draft_pool_size or self.llm_max_batch_size

    @property
    def active_requests_limit(self) -> int:
        """Requests decoding at once at most: one live sequence each in the LLM, never evicted, unless set."""
        return self.limits.active_requests or self.llm_max_sequences

    def check(self) -> None:
        """Raise ValueError for values no request could be served with."""
        text = self.default_num_draft_tokens.strip()
        if text != ADAPTIVE and not text.isdigit():
            raise ValueError(f"default_num_draft_tokens must be `{ADAPTIVE}` or a number, got {text!r}")


DEFAULTS = OrchestratorSettings()
"""The defaults, for code that runs without a deployment (tests, benchmarks' in-process loops)."""
