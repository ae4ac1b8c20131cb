"""Minions: speculative decoding served as a Triton model repository.

Subpackages by role, bottom floor first (imports only point down; tests/unit/test_layers.py checks):
`settings.py` (every default) and `errors.py`; `text` (prompt, detokenizer, stop strings, bad words,
prompt sets); `decoding` (sampling, penalties, verification, the engine call); `engines` (what the llm
and ssm_* models run) beside `speculation` (the decode loop and everything it decides); `serving` (a
request's way into and out of the loop); `triton`, the only code that touches Triton's pb_utils (the
adapters the model.py files in `model_repository/` import); `deploy` (deploy.yaml to a running
tritonserver); `distill` (training the distilled SSMs) and `frontend` (the OpenAI-compatible API).
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
