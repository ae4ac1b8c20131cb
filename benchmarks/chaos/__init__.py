"""Chaos: load on a fresh server while stubs are killed and models reloaded at seeded random intervals.

What must never happen fails the run; what may happen under faults (refusals, errors) is counted.

    python -m benchmarks.chaos [--minutes 15] [--seed 1] [--faults ssm_kill,llm_kill,minions_kill,reload]
                               [--cover [--max-minutes 30]]

Load: `--users` client threads, each a closed loop of streamed requests (gRPC ModelStreamInfer, HTTP
SSE generate_stream, or a streamed chat completion through the OpenAI frontend; speculation `off` or
`vote`; picked at random per request), made through the client library exactly as the Locust users
of loadtest/ make them, and through the `openai` package. They are threads here rather than
headless Locust because the verdict needs each request's own ending (an incomplete stream must not be
folded into "error") and a mix of modes in one run. Each request ends in one of:

- served: its final response arrived;
- refused: the server said to retry later (UNAVAILABLE, 503/429, `minions.errors.is_refusal`);
- failed: the server (or the transport) returned an error message;
- incomplete: the stream ended without a final response and without an error;
- hung: silent for `--hang-s` s (then cancelled), or still running when the load was told to stop and
  `--hang-s` more passed;
- orphaned: a gRPC or HTTP request hung that was under way when the orchestrator's stub was killed.
  Triton 2.51 (and 25.12) never answers those: python_backend ends a decoupled request only through
  its stub, and nothing else in the server holds it. They are counted, not failed on; the OpenAI
  frontend ends its own (minions/frontend/orphans.py), so an OpenAI request that hangs is a problem.

Faults are dealt from a shuffled deck of every (kind, model) pair, reshuffled when empty, so a run meets
each before any repeats: `ssm_kill` (SIGKILL an SSM's stub, at a moment it holds no shared-memory lock:
harness/stub_kill.py), `llm_kill`, `minions_kill`, `reload`
(touch the model's files and load it through the repository API, as an operator after an edit). After
each fault the tool waits until the model has recovered (a new stub of it runs and Triton logged it
loaded again), for at most `--recovery-s`, then until a request sent after the fault has been served
(the service is back: the orchestrator finds a dead SSM or LLM through the calls and polls of requests,
so the next fault waits for traffic), for at most `--hang-s` + `--recovery-s`; then it waits the fault's
gap (drawn from the seed) before the next. A stub still dead at the deadline is a problem; the tool then
loads the model itself, as an operator would, so the run goes on. The server runs as `make serve` runs
it: tritonserver, with `make serve`'s watchdog of the orchestrator's stub (deploy/watchdog.py) and the
OpenAI frontend beside it.

It fails (exit 1, one line per problem) on a hung or incomplete request, a request that took more
than `--slow-s` to end however it ended (a crawl is not a hang: its stream is never silent), a
tritonserver exit or a crash in its log ("Signal (", "Fatal Python error"), a stub left dead beyond
`--recovery-s`, a reload that failed, no request sent after a fault served within `--slow-s` of it
(the tool still waits up to its deadline, so that the run goes on), shared-memory regions of
the server's stubs in /dev/shm that no live process maps once the load has stopped, regions left
once tritonserver has stopped (but a killed stub's: Triton 2.51 holds a dead stub's instance, and
its region, until it exits, and leaves it to the launcher's sweep), a stub still running after
tritonserver exited, a stop that needed SIGKILL, and steady growth of the total RSS of tritonserver
and its stubs after warm-up (benchmarks/trend.py; samples taken while a fault has not settled are
left out). The llama.cpp engines' host-memory prefix store, a cache that fills up to its bound as
requests finish, is held to LEAK_CHECK_RAM_MIB for the run, so that its filling is not read as
growth. Refusals and failures with an error message are counted, not failed on.

It writes bench_results/chaos/<timestamp>.json (every figure, each fault with its recovery and how the
requests under way at it and sent during it ended, the memory samples), <timestamp>.txt (the summary
it prints) and <timestamp>.tritonserver.log.

Its parts: `schedule` (the faults and their seeded order), `load` (the users' requests), `injector`
(a fault at a time, and its recovery), `processes` (the server's stubs, memory, the watchdog),
`verdict` (each request's ending and the run's problems), `report` (the summary) and `run` (the run
and its command line).
"""
