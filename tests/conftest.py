"""Every server the suite starts runs each engine on one thread (harness.triton_process's
ENGINE_THREADS_ENV; a value the caller set wins): llama.cpp's threads meet at a barrier after every
operation, so with another process on the second core two threads decode at a fraction of their
speed and the suite takes hours, where one thread keeps its speed (docs/architecture.md, "The test
suite on a busy machine")."""

import os

from harness.triton_process import ENGINE_THREADS_ENV

os.environ.setdefault(ENGINE_THREADS_ENV, "1")
