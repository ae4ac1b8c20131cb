"""The decode loop (loop.py) and everything it decides: drafters (single, vote, bandit), the vote's
weights, SSM health, the adaptive draft length, pipelining and the draft pool. The rules it
shares with the engines (verification, sampling) are decoding's. Pure Python: tested against
in-process engines."""
