"""Statistical checks that sampled outputs follow an exact law (the lossless-sampling tests)."""

from __future__ import annotations

import numpy as np
from scipy.stats import chisquare


def goodness_of_fit(counts: np.ndarray, law: np.ndarray) -> float:
    """Chi-square p-value of counts against law, bins with expected count < 5 merged into one.

    Any observation where the law is zero is impossible under the null hypothesis: p-value 0.
    """
    n = counts.sum()
    expected = n * law
    if counts[law == 0].sum() > 0:
        return 0.0
    big = expected >= 5
    obs = list(counts[big])
    exp = list(expected[big])
    small_exp = expected[~big].sum()
    if small_exp > 0:
        obs.append(counts[~big].sum())
        exp.append(small_exp)
    return float(chisquare(obs, exp).pvalue)
