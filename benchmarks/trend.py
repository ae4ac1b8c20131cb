"""Does a resource grow steadily over a soak run? The rule `make soak` fails on.

A leak climbs all the time; an allocator arena, a cache filling once, or a shared-memory region
growing by a step climbs once and stays. So the samples taken after warm-up are cut into thirds
and a series counts as growing only when the median rises from each third to the next and by more
than a tolerance over the run, never for one increase.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Trend:
    name: str
    first: float
    """Median of the first third of the samples."""
    last: float
    """Median of the last third."""
    growing: bool

    def __str__(self) -> str:
        verdict = "GROWING" if self.growing else "flat"
        return f"{self.name}: {self.first / 2**20:.1f} -> {self.last / 2**20:.1f} MiB ({verdict})"


def trend(name: str, samples: list[float], tolerance: float, min_samples: int = 6) -> Trend:
    """`samples` in order; `tolerance`: growth (same unit) below which a rise is not a leak."""
    if len(samples) < min_samples:
        raise ValueError(f"{name}: {len(samples)} samples after warm-up, need {min_samples} to see a trend")
    third = len(samples) // 3
    medians = [statistics.median(part) for part in
               (samples[:third], samples[third:len(samples) - third], samples[len(samples) - third:])]
    rising = medians[0] < medians[1] < medians[2] and medians[2] - medians[0] > tolerance
    return Trend(name, medians[0], medians[2], rising)
