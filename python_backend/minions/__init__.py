"""Minions: speculative decoding served as a Triton model repository.

Subpackages by role: `engines` (what the llm and ssm_* models run), `speculation` (the decode loop
and everything it decides), `text` (prompt, detokenizer, stop strings, bad words), `serving` (a
request's way into and out of the loop), `deploy` (deploy.yaml to a running tritonserver), `distill`
(training the distilled SSMs), and `triton`, the only code that touches Triton's pb_utils: the
adapters the model.py files in `model_repository/` import. `settings.py` holds every default.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
