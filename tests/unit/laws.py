"""Statistical checks that sampled outputs follow an exact law (the lossless-sampling tests)."""

from __future__ import annotations

import numpy as np
from scipy.stats import chisquare

from minions.decoding.engine_call import EngineRequest
from minions.decoding.sampling import SamplingParams, target_probs


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


def batched_first_tokens(engine, prompts: list[list[int]], draft_logits: list[np.ndarray], params: SamplingParams,
                         passes: int, rng: np.random.Generator) -> np.ndarray:
    """How often each token came first out of each prompt's request, over `passes` calls in which the
    engine verifies all the prompts' sampled drafts together, each request with a seed of its own. A
    request's draft has a token per row of its draft logits, drawn from that row's law under `params`
    (what an SSM sampling with the request's parameters sends). Counts per prompt and token; every
    request is released after its call."""
    draft_probs = [[target_probs(row, params) for row in q] for q in draft_logits]
    counts = np.zeros((len(prompts), draft_logits[0].shape[1]), dtype=np.int64)
    for n in range(passes):
        requests = [EngineRequest(f"r{i}", prompt, len(q) + 1, sampling=params, seed=n * len(prompts) + i,
                                  draft=[int(rng.choice(len(probs), p=probs)) for probs in draft_probs[i]],
                                  draft_logits=q, exclude_input_in_output=True)
                    for i, (prompt, q) in enumerate(zip(prompts, draft_logits))]
        for i, result in enumerate(engine.generate_batch(requests)):
            assert not isinstance(result, Exception), result
            counts[i, result.tokens[0]] += 1
        for request in requests:
            engine.release(request.request_id)
    return counts
