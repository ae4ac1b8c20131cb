"""minions.serving.admission: requests decode only while the LLM has a sequence slot and KV room for
them; the rest wait in order, or are refused once the wait queue is full."""

from __future__ import annotations

import asyncio

import pytest

from minions.errors import InvalidRequest, ServerBusy
from minions.serving.admission import Admission


def test_kv_admission_never_exceeds_its_budget_and_admits_in_order():
    async def scenario():
        admission = Admission(max_sequences=100, capacity_tokens=1000, chunk=100)
        order: list[int] = []

        async def request(i: int, tokens: int):
            reservation = await admission.reserve(tokens)
            order.append(i)
            assert admission.in_use <= admission.capacity
            await asyncio.sleep(0)  # held while the others run up to their own reservations
            reservation.release()

        await asyncio.gather(*(request(i, t) for i, t in enumerate([450, 450, 450, 90, 1000, 10])))
        assert admission.peak <= 1000 and admission.in_use == 0
        assert order == [0, 1, 2, 3, 4, 5], "first come, first served: no overtaking"
        with pytest.raises(InvalidRequest, match="budget is 1000"):
            await admission.reserve(1001)
        first = await admission.reserve(1000)
        waiting = asyncio.ensure_future(admission.reserve(500))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        first.release()
        assert admission.in_use == 0 and admission.waiting == 0

    asyncio.run(scenario())


def test_no_more_requests_decode_than_the_llm_has_sequence_slots():
    async def scenario():
        admission = Admission(max_sequences=2)
        running, most = 0, 0

        async def request():
            nonlocal running, most
            reservation = await admission.reserve(10)
            running += 1
            most = max(most, running)
            await asyncio.sleep(0)  # held while the others run up to their own reservations
            running -= 1
            reservation.release()

        await asyncio.gather(*(request() for _ in range(7)))
        assert most == 2 and admission.running == 0 and admission.in_use == 0

    asyncio.run(scenario())


def test_beyond_a_full_queue_a_request_is_refused_at_once():
    async def scenario():
        admission = Admission(max_sequences=1, max_queued=2)
        held = await admission.reserve(1)
        queued = [asyncio.ensure_future(admission.reserve(1)) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(ServerBusy, match="1 requests decoding, 2 waiting"):
            await admission.reserve(1)
        held.release()
        for q in queued:
            (await q).release()
        assert admission.running == 0 and admission.waiting == 0

    asyncio.run(scenario())


def test_an_answered_request_stops_counting_as_decoding_but_keeps_its_slot_until_released():
    async def scenario():
        admission = Admission(max_sequences=1)
        first = await admission.reserve(1)
        first.answer_sent()
        first.answer_sent()  # said twice, counted once
        assert admission.decoding == 0 and admission.running == 1
        second = asyncio.ensure_future(admission.reserve(1))
        await asyncio.sleep(0)
        assert not second.done(), "the slot is held until the engines' state is freed"
        first.release()
        (await second).release()
        assert admission.decoding == admission.running == admission.answered == 0

    asyncio.run(scenario())


def test_a_request_whose_llm_release_is_queued_gives_its_slot_to_the_next_but_keeps_its_tokens():
    async def scenario():
        admission = Admission(max_sequences=1, capacity_tokens=100)
        first = await admission.reserve(60)
        first.answer_sent()
        second = asyncio.ensure_future(admission.reserve(30))
        third = asyncio.ensure_future(admission.reserve(30))
        await asyncio.sleep(0)
        assert not second.done()
        first.sequence_released()
        first.sequence_released()  # said twice, counted once
        await asyncio.sleep(0)
        assert second.done() and not third.done(), "one slot given back, one request in"
        assert admission.running == 2 and admission.in_use == 90, "the tokens stay held until the release"
        assert admission.holding_slots == 1
        first.release()
        await asyncio.sleep(0)
        assert not third.done(), "the slot is the second's"
        (await second).release()
        (await third).release()
        assert admission.running == admission.in_use == admission.slots_given_back == 0

    asyncio.run(scenario())


def test_it_tells_every_change_of_the_requests_running_and_waiting():
    async def scenario():
        seen: list[tuple[int, int, float]] = []
        admission = Admission(max_sequences=1, on_change=lambda *change: seen.append(change))
        first = await admission.reserve(1)
        second = asyncio.ensure_future(admission.reserve(1))
        await asyncio.sleep(0)
        first.release()
        (await second).release()
        # the waiter takes the slot as it is given back: once; without a token budget, KV use is slots held
        assert seen == [(1, 0, 1.0), (1, 1, 1.0), (1, 0, 1.0), (0, 0, 0.0)]

    asyncio.run(scenario())


def test_kv_usage_is_the_tokens_admitted_requests_may_hold_over_the_budget():
    async def scenario():
        seen: list[float] = []
        admission = Admission(max_sequences=4, capacity_tokens=1000, chunk=100,
                              on_change=lambda running, waiting, kv_usage: seen.append(kv_usage))
        first = await admission.reserve(250)  # 300 tokens, in chunks of 100
        second = await admission.reserve(100)
        first.release()
        second.release()
        assert seen == [0.3, 0.4, 0.1, 0.0]

    asyncio.run(scenario())
