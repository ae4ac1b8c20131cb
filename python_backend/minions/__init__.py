"""Minions: speculative decoding served as a Triton model repository.

Everything in this package except `minions.triton` is plain Python (numpy, optionally torch /
llama.cpp) so the algorithms can be unit-tested without a server. `minions.triton` holds the thin
adapters that the model.py files in `model_repository/` import.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
