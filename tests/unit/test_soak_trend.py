"""benchmarks.trend: a steady climb fails a soak run; a single step, noise or a plateau do not."""

from __future__ import annotations

import pytest

from benchmarks.trend import trend

MIB = 2**20


def test_a_steady_climb_is_growing():
    samples = [100 * MIB + i * 2 * MIB for i in range(12)]
    assert trend("llm", samples, tolerance=8 * MIB).growing


def test_one_step_up_is_not_a_leak():
    samples = [100 * MIB] * 4 + [140 * MIB] * 8  # an arena grew once and stayed
    assert not trend("llm", samples, tolerance=8 * MIB).growing


def test_noise_and_a_climb_within_tolerance_are_flat():
    noisy = [100 * MIB + (3 * MIB if i % 2 else -3 * MIB) for i in range(12)]
    assert not trend("llm", noisy, tolerance=8 * MIB).growing
    slow = [100 * MIB + i * MIB // 4 for i in range(12)]
    assert not trend("llm", slow, tolerance=8 * MIB).growing


def test_too_few_samples_to_judge_is_an_error():
    with pytest.raises(ValueError, match="need 6"):
        trend("llm", [1.0, 2.0, 3.0], tolerance=0.0)
