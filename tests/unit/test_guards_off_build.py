"""A llama.cpp built with the patches' guards off (`-DGGML_AVX2=OFF`: AVX and F16C, no AVX2 or FMA) carries
every patch compiled out, refuses a batch-invariant engine with the reason, and decodes with batch
invariance off (issue 66). The build takes about 8 minutes on 2 cores, beyond `make test`'s budget:
`make check-guards` builds it into .cache/guards-off and runs this file with MINIONS_GUARDS_OFF set;
without it the test is skipped. The engine runs in a subprocess that imports that build's llama_cpp."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minions.deploy.artifacts import smollm2_gguf
from minions.engines.llamacpp_patches import PATCHES

ROOT = Path(__file__).resolve().parents[2]
BUILD = os.environ.get("MINIONS_GUARDS_OFF")

SCRIPT = """
import json, sys
import llama_cpp
from minions.decoding.engine_call import EngineRequest
from minions.engines.llamacpp_engine import LlamaCppEngine
from minions.engines.llamacpp_patches import build_flags, carried

out = {"llama_cpp": llama_cpp.__file__, "carried": carried(), "built": sorted(build_flags() or [])}
settings = dict(num_threads=2, max_sequences=1, n_ctx=512, kv_unified=False)
try:
    LlamaCppEngine(sys.argv[1], batch_invariant=True, **settings)
    out["refusal"] = None
except ValueError as exc:
    out["refusal"] = str(exc)
engine = LlamaCppEngine(sys.argv[1], batch_invariant=False, **settings)
out["tokens"] = engine.generate(EngineRequest("plain", [1, 2, 3, 4, 5], 8)).tokens
engine.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(not BUILD, reason="make check-guards builds the guards-off llama.cpp and runs this")
def test_a_build_with_the_guards_off_refuses_batch_invariance_and_decodes_without_it():
    build = Path(BUILD).resolve()
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(build), str(ROOT / "python_backend"), str(ROOT)])}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(smollm2_gguf())], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["llama_cpp"].startswith(str(build)), "the subprocess must run the guards-off build"
    assert out["carried"] == dict.fromkeys(PATCHES, False), "every patch carried, none compiled in"
    assert "avx2" not in out["built"] and "fma" not in out["built"]
    assert out["refusal"] and "compiled without" in out["refusal"], out["refusal"]
    assert len(out["tokens"]) == 8
