"""speculation.watch: the probe schedule's back-off and where a repeating tail skips it, a found
draft aligned to what the stream made meanwhile, the rests of a request on an LLM that does not
stream, and the watch's probes (one at a time, a found draft
stops the stream, a late one is cancelled). `asyncio.sleep(0)` lets a probe task take its next step;
no time passes."""

from __future__ import annotations

import asyncio

import numpy as np

from minions.engines.ngram_engine import ngram_draft
from minions.speculation.drafters import Proposal
from minions.speculation.watch import DraftRest, DraftWatch, ProbeSchedule, TailRepeats, aligned


def test_the_gap_doubles_after_probes_that_find_nothing_up_to_its_cap():
    schedule = ProbeSchedule(min_gap=4, max_gap=16)
    gaps = []
    for _ in range(4):
        gaps.append(schedule.gap)
        schedule.found_nothing()
    assert gaps == [4, 8, 16, 16]


def test_the_first_probe_waits_the_first_gap_and_backs_off_from_there():
    """Before a request's first probe nothing shows a lookup can draft, so it comes later than the
    probes after a verification that paid (a repeating tail may bring it earlier: DraftWatch)."""
    schedule = ProbeSchedule(min_gap=4, max_gap=64, first_gap=16)
    gaps = []
    for _ in range(3):
        gaps.append(schedule.gap)
        schedule.found_nothing()
    schedule.verified(drafted=6, accepted=3)
    assert gaps + [schedule.gap] == [16, 32, 64, 4]
    assert ProbeSchedule(min_gap=4, max_gap=8, first_gap=16).gap == 8, "never beyond the cap"


def test_a_verification_that_accepted_half_brings_probes_back_and_one_that_did_not_backs_off():
    schedule = ProbeSchedule(min_gap=4, max_gap=64)
    schedule.found_nothing()
    schedule.found_nothing()
    schedule.verified(drafted=6, accepted=3)
    assert schedule.gap == 4
    schedule.verified(drafted=6, accepted=2)
    assert schedule.gap == 8
    schedule.verified(drafted=0, accepted=0)  # plain rounds say nothing about drafts
    assert schedule.gap == 8


def test_a_probe_is_due_once_the_gap_s_tokens_have_arrived():
    schedule = ProbeSchedule(min_gap=4, max_gap=64)
    schedule.arrived(3)
    assert not schedule.due
    schedule.arrived(1)
    assert schedule.due
    schedule.probed()
    assert not schedule.due


def test_tail_repeats_when_the_last_n_tokens_occurred_earlier_as_the_sequence_grows():
    repeats = TailRepeats(3)
    sequence = [1, 2, 3, 4, 5]
    assert not repeats.at_end(sequence)
    sequence += [1, 2]
    assert not repeats.at_end(sequence), "(5, 1, 2) is new"
    sequence += [3]
    assert repeats.at_end(sequence), "(1, 2, 3) began the sequence"
    sequence += [9, 9, 9]
    assert not repeats.at_end(sequence)
    sequence += [9]
    assert repeats.at_end(sequence), "(9, 9, 9) overlaps its earlier occurrence"
    assert not TailRepeats(3).at_end([7, 7, 7])


def test_tail_repeats_says_what_prompt_lookup_says_of_the_same_tail():
    """The same rule as `ngram_draft(sequence, 1, n, n)`, the lookup drafters' match: a tail of n tokens
    with an earlier occurrence that has a continuation. Checked at every length of random sequences."""
    rng = np.random.default_rng(0)
    for n in (1, 2, 3):
        for _ in range(20):
            tokens = [int(t) for t in rng.integers(0, 4, size=40)]
            repeats = TailRepeats(n)
            for end in range(1, len(tokens) + 1):
                prefix = tokens[:end]
                assert repeats.at_end(prefix) == bool(ngram_draft(prefix, 1, n, n)), (n, prefix)


def test_a_repeating_tail_brings_the_probe_min_gap_after_the_last_one_whatever_the_back_off():
    async def run():
        drafters = Drafters([[], [], [4, 5, 6]])
        drafters.release.set()
        schedule = ProbeSchedule(min_gap=2, max_gap=64)
        watch = DraftWatch(schedule, 3, drafters.ask, drafters.stop, TailRepeats(3))
        sequence = [10, 11, 12, 1, 2, 3]
        watch.arrived(sequence, 2, allowed=True)  # due by the schedule: probe 1 finds nothing
        await asyncio.sleep(0)
        sequence += [20, 21]
        watch.arrived(sequence, 2, allowed=True)  # no repeat, gap 4 now: no probe
        sequence += [22, 23]
        watch.arrived(sequence, 2, allowed=True)  # due by the doubled gap: probe 2 finds nothing
        await asyncio.sleep(0)
        assert len(drafters.asked) == 2
        sequence += [1, 2]
        watch.arrived(sequence, 2, allowed=True)
        assert schedule.gap == 8 and len(drafters.asked) == 2, "(23, 1, 2) is new: the back-off holds"
        sequence += [3]
        watch.arrived(sequence, 1, allowed=True)  # (1, 2, 3) repeats, 3 tokens since probe 2
        await asyncio.sleep(0)
        assert len(drafters.asked) == 3 and drafters.stops == 1
        found = await watch.settle(sequence)
        assert found is not None and found.draft == [4, 5, 6]
    asyncio.run(run())


def test_before_the_first_probe_a_repeating_tail_brings_it_at_the_first_token():
    """A conversation's prompt ends as its earlier answers began (the chat template's assistant
    header): the answer's first token repeating that tail is probed at once, not `min_gap` later."""
    async def run():
        drafters = Drafters([[7, 8, 9], []])
        drafters.release.set()
        schedule = ProbeSchedule(min_gap=8, max_gap=64, first_gap=32)
        watch = DraftWatch(schedule, 3, drafters.ask, drafters.stop, TailRepeats(3))
        prompt = [1, 2, 3, 4, 7, 8, 9, 5, 1, 2]
        watch.arrived(prompt + [3], 1, allowed=True)  # (1, 2, 3) began the prompt
        await asyncio.sleep(0)
        assert drafters.asked == [prompt + [3]] and drafters.stops == 1
        assert (await watch.settle(prompt + [3])).draft == [7, 8, 9]
        watch.arrived(prompt + [3, 7, 8, 9, 5, 1, 2, 3], 5, allowed=True)
        assert len(drafters.asked) == 1, "after the first probe, a repeat waits min_gap tokens again"
        await watch.close()
    asyncio.run(run())


def test_before_the_first_probe_a_new_tail_waits_for_the_first_gap():
    async def run():
        drafters = Drafters([[]])
        drafters.release.set()
        watch = DraftWatch(ProbeSchedule(min_gap=8, max_gap=64, first_gap=32), 3, drafters.ask, drafters.stop,
                           TailRepeats(3))
        watch.arrived([1, 2, 3, 4, 5], 1, allowed=True)
        watch.arrived([1, 2, 3, 4, 5, 6], 1, allowed=True)
        assert drafters.asked == []
        await watch.close()
    asyncio.run(run())


def test_without_repeats_the_back_off_alone_decides():
    async def run():
        drafters = Drafters([[]])
        drafters.release.set()
        watch = DraftWatch(ProbeSchedule(min_gap=2, max_gap=64), 3, drafters.ask, drafters.stop)
        watch.arrived([1, 2, 3, 1, 2], 2, allowed=True)
        await asyncio.sleep(0)
        watch.arrived([1, 2, 3, 1, 2, 3, 1], 2, allowed=True)
        assert len(drafters.asked) == 1, "the tail repeats, but the doubled gap (4) has not passed"
        await watch.close()
    asyncio.run(run())


def _asks(rest: DraftRest, rounds: list[tuple[list[int], bool | None]]) -> list[bool]:
    """Whether each round asks; a round that asks finds a draft or not (its bool), each emits one token."""
    asked = []
    for sequence, found in rounds:
        asked.append(rest.asks(sequence))
        if asked[-1]:
            rest.asked(found=bool(found))
        rest.arrived(1)
    return asked


def test_a_rest_begins_at_an_empty_draft_and_each_empty_ask_doubles_it_up_to_the_cap():
    """Until a draft comes back empty every round asks; then min_gap tokens pass before the next ask,
    and each ask that finds nothing doubles the rest (4, 8, 16, 16)."""
    rest = DraftRest(ProbeSchedule(min_gap=4, max_gap=16))
    asked = _asks(rest, [([9], True)] * 3 + [([9], False)] * 70)
    assert asked[:4] == [True] * 4
    where = [i for i, a in enumerate(asked) if a][3:]
    assert [b - a for a, b in zip(where, where[1:])] == [4, 8, 16, 16, 16]


def test_a_draft_found_ends_the_rest_and_a_good_verification_shortens_the_next():
    rest = DraftRest(ProbeSchedule(min_gap=4, max_gap=64))
    assert _asks(rest, [([9], False)] + [([9], None)] * 3 + [([9], False)] + [([9], None)] * 7) == (
        [True] + [False] * 3 + [True] + [False] * 7)
    assert _asks(rest, [([9], True), ([9], True)]) == [True, True], "found after a rest of 8: asks every round"
    rest.verified(drafted=6, accepted=5)
    assert _asks(rest, [([9], False)] + [([9], None)] * 4) == [True, False, False, False, True]


def test_a_repeating_tail_ends_a_rest_min_gap_tokens_after_the_last_ask():
    rest = DraftRest(ProbeSchedule(min_gap=2, max_gap=64), TailRepeats(3))
    for _ in range(3):  # rests of 2, 4, 8 tokens now
        rest.asked(found=False)
    sequence = [1, 2, 3, 10, 11, 1, 2]
    rest.arrived(1)
    assert not rest.asks(sequence + [3]), "(1, 2, 3) occurred earlier, but 1 token since the last ask"
    rest.arrived(1)
    assert not rest.asks(sequence + [3, 12]), "2 tokens since the last ask, but (2, 3, 12) is new"
    rest.arrived(3)
    assert rest.asks(sequence + [3, 12, 1, 2, 3]), "(1, 2, 3) occurred earlier: 5 tokens of a rest of 8"
    assert not DraftRest(ProbeSchedule(min_gap=2, max_gap=64)).resting, "a request starts asking every round"


def test_aligned_drops_the_tokens_the_stream_made_when_the_draft_predicted_them():
    logits = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    proposal = Proposal([1, 2, 3, 4, 5], logits, "a", {"a": [1, 2, 3, 4, 5], "b": [1, 9, 9]})
    got = aligned(proposal, [1, 2])
    assert got is not None and got.draft == [3, 4, 5]
    assert got.logits.tolist() == logits[2:].tolist()
    assert got.drafts == {"a": [3, 4, 5]}


def test_aligned_is_nothing_when_the_stream_made_other_tokens_or_overtook_the_draft():
    assert aligned(Proposal([1, 2, 3]), [1, 7]) is None
    assert aligned(Proposal([1, 2, 3]), [1, 2, 3]) is None
    assert aligned(Proposal([1, 2, 3]), [1, 2, 3, 4]) is None


class Drafters:
    """Answers probes from a script, each when the test releases it; records the sequences asked."""

    def __init__(self, drafts: list[list[int]]) -> None:
        self.drafts = drafts
        self.asked: list[list[int]] = []
        self.release = asyncio.Event()
        self.stops = 0

    async def ask(self, sequence: list[int]) -> Proposal:
        self.asked.append(sequence)
        await self.release.wait()
        return Proposal(self.drafts[len(self.asked) - 1])

    async def stop(self) -> None:
        self.stops += 1


def test_a_probe_that_finds_nothing_ends_nothing_and_the_next_waits_a_doubled_gap():
    async def run():
        drafters = Drafters([[5], [6, 7, 8, 9]])
        drafters.release.set()
        watch = DraftWatch(ProbeSchedule(2, 64), 3, drafters.ask, drafters.stop)
        sequence = [1, 2]
        watch.arrived(sequence, 2, allowed=True)  # due: probe 1 from [1, 2]
        await asyncio.sleep(0)
        sequence += [3, 4]
        watch.arrived(sequence, 2, allowed=True)  # probe 1 found one token: too short; gap 4, 2 since
        assert len(drafters.asked) == 1 and watch.schedule.gap == 4
        sequence += [5, 6]
        watch.arrived(sequence, 2, allowed=True)  # 4 since: probe 2 from [1..6]
        await asyncio.sleep(0)
        assert drafters.asked[-1] == [1, 2, 3, 4, 5, 6]
        assert drafters.stops == 1, "a draft at least min_draft long stops the stream"
        sequence += [6]
        found = await watch.settle(sequence)
        assert found is not None and found.draft == [7, 8, 9]
    asyncio.run(run())


def test_no_probe_while_not_allowed_nor_while_one_runs():
    async def run():
        drafters = Drafters([[1, 2, 3, 4]] * 3)
        watch = DraftWatch(ProbeSchedule(1, 64), 3, drafters.ask, drafters.stop)
        watch.arrived([1], 1, allowed=False)
        assert drafters.asked == []
        watch.arrived([1, 2], 1, allowed=True)
        await asyncio.sleep(0)
        watch.arrived([1, 2, 3], 1, allowed=True)
        assert len(drafters.asked) == 1, "one probe at a time"
        drafters.release.set()
        await asyncio.sleep(0)
        await watch.close()
    asyncio.run(run())


def test_a_probe_still_drafting_when_the_stream_ends_is_cancelled():
    async def run():
        drafters = Drafters([[1, 2, 3, 4]])
        watch = DraftWatch(ProbeSchedule(1, 64), 3, drafters.ask, drafters.stop)
        watch.arrived([1], 1, allowed=True)
        await asyncio.sleep(0)
        assert await watch.settle([1, 2]) is None
        assert drafters.stops == 0
    asyncio.run(run())


def test_without_a_stop_a_found_draft_waits_for_the_stream_s_own_end():
    """An LLM that cannot be stopped mid-stream (TensorRT-LLM) streams a stretch; a draft found meanwhile
    is verified after it, less what the stretch made."""
    async def run():
        drafters = Drafters([[3, 4, 5, 6]])
        drafters.release.set()
        watch = DraftWatch(ProbeSchedule(1, 64), 3, drafters.ask, None)
        watch.arrived([1, 2], 1, allowed=True)
        await asyncio.sleep(0)
        found = await watch.settle([1, 2, 3])
        assert found is not None and found.draft == [4, 5, 6]
    asyncio.run(run())


def test_each_probe_s_outcome_is_told_once_as_it_ends():
    """Too short a draft is `empty`, or `priced_out` where it was long enough before the costs cut it,
    one at least min_draft long `found`, one cancelled by the stream's own end `cancelled`; a probe
    still running has told nothing."""
    async def run():
        outcomes: list[str] = []
        drafters = Drafters([[5], [4], [6, 7, 8], [9, 9, 9]])
        drafters.release.set()
        ask = drafters.ask

        async def cut_by_costs(sequence: list[int]) -> Proposal:
            proposal = await ask(sequence)
            if len(drafters.asked) == 2:  # drafted [4, 4, 4]: the costs left one token
                proposal.priced_out = 2
            return proposal

        watch = DraftWatch(ProbeSchedule(1, 1), 3, cut_by_costs, drafters.stop, on_end=outcomes.append)
        watch.arrived([1], 1, allowed=True)
        await asyncio.sleep(0)
        assert outcomes == ["empty"]
        watch.arrived([1], 1, allowed=True)
        await asyncio.sleep(0)
        assert outcomes == ["empty", "priced_out"]
        watch.arrived([1, 2], 1, allowed=True)
        await asyncio.sleep(0)
        assert outcomes[2:] == ["found"]
        assert await watch.settle([1, 2, 6]) is not None
        drafters.release.clear()
        watch.arrived([1, 2, 6, 7], 1, allowed=True)
        await asyncio.sleep(0)
        assert outcomes[2:] == ["found"], "still drafting"
        assert await watch.settle([1, 2, 6, 7, 8]) is None
        assert outcomes[2:] == ["found", "cancelled"]
    asyncio.run(run())
