"""The gates that turn drafting off, or down, by load: where a step's cost grows with its tokens (llama.cpp
on a CPU), every draft token verified slows every request decoding with it.

Worked example, with the default deployment's settings (speculation_max_load 1, probe_max_load 4,
probe_max_draft_cost_ms 1.0, pipeline_max_load 1, pipeline_min_hit 0.5): one request decoding drafts
and its plain stream probes while its lookups cost under 1 ms a token; with a second request decoding
`too_busy` holds both to plain decoding, and their probes are off; a lone request drafts round r+1
while round r verifies (`early_draft_pays`), and under load only while the selector expects that
early draft to be used at least half the time.
"""

from __future__ import annotations

from minions.settings import OrchestratorSettings
from minions.speculation.pricing.draft_length import DraftLengthSelector, FixedLength
from minions.speculation.pricing.length_stats import SharedLengthStats


def too_busy(settings: OrchestratorSettings, batch: int) -> bool:
    """Whether this many requests decoding is beyond `speculation_max_load` (drafting is off)."""
    return 0 < settings.speculation_max_load < batch


def probe_pays(settings: OrchestratorSettings, stats: SharedLengthStats, length: DraftLengthSelector | FixedLength,
               batch: int) -> bool:
    """Whether a request's plain stream may ask its drafters for a draft now (watch.py): only when
    drafting costs next to nothing at this load (prompt lookup, suffix matching, by `stats`) and at
    most `probe_max_load` requests decode (each probe's stop and verification cost a step that every
    request shares)."""
    return (settings.probe.tokens > 0 and batch <= settings.probe.max_load and not too_busy(settings, batch)
            and stats.probe_draft_estimate(batch, length.pipelined, length.drafters)
            <= settings.probe.max_draft_cost_ms / 1000.0)


def early_draft_pays(settings: OrchestratorSettings, length: DraftLengthSelector | FixedLength, batch: int,
                     drafted: int) -> bool:
    """Whether to draft round r+1 during round r's verification of `drafted` tokens, at load `batch`:
    always while at most `pipeline_max_load` requests decode (0: at any load). Above it the other
    requests' drafts keep the SSMs busy while this one verifies, and an early draft, thrown away
    whenever the LLM rejects part of round r, takes SSM time they wait for; so only while the selector
    expects at least `pipeline_min_hit` chance that it is used (the whole draft accepted and the LLM's
    own token guessed), when the SSMs would draft the same tokens after verification anyway. A fixed
    draft length has no such estimate: never above the load limit."""
    if not settings.early_drafts.max_load or batch <= settings.early_drafts.max_load:
        return True
    hit = length.survival(drafted + 1)
    return hit is not None and settings.early_drafts.min_hit > 0 and hit >= settings.early_drafts.min_hit
