"""The decode loop (loop.py) and everything it decides: drafters (single, vote, bandit), the vote's
weights, SSM health, the adaptive draft length, pipelining and the draft pool, lossless verification
and sampling. Pure Python: tested against in-process engines."""
