"""`make loadtest` in a short bounded form: the make target itself as a user runs it on a clone with
nothing beside it (a fresh server, the shipped prompt sets); Locust's HTTP and gRPC users against the
session's server for about 10 s, then the report files and a summary with no failure and consistent
latencies; and against stand-ins for an overloaded server, whose refusals count as unavailable."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from tritonclient.grpc import service_pb2_grpc

from loadtest.run import main
from harness.triton_process import ROOT


def test_make_loadtest_records_requests_from_the_shipped_prompt_sets(tmp_path, nothing_beside):
    """What failed on a user's clone: every Locust user died on a prompt file outside the project and the
    run recorded nothing. A run that records no request exits non-zero, and fails this test."""
    out = tmp_path / "report"
    args = f"--users 2 --spawn-rate 2 --time 8 --stop-timeout 30 --max-tokens 16 --out {out}"
    run = subprocess.run(["make", "-C", str(ROOT), "loadtest", f"LOADTEST_ARGS={args}"], capture_output=True,
                         text=True, timeout=900, env=os.environ)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    for name in ("summary.md", "summary.json", "loadtest.png", "locust_report.html", "requests.jsonl"):
        assert (out / name).stat().st_size > 0, name
    s = json.loads((out / "summary.json").read_text())
    assert s["requests"] > 0 and s["succeeded"] == s["requests"], s["first_errors"]
    assert s["settings"]["datasets"] == "" and s["server_exit_code"] is None


def test_a_short_loadtest_reports_every_request(server, tmp_path, nothing_beside):
    rc = main(["--host", server.http_url, "--grpc-host", server.grpc_url, "--users", "2", "--spawn-rate", "2",
               "--time", "10", "--stop-timeout", "15", "--max-tokens", "16", "--out", str(tmp_path)])

    for name in ("summary.md", "summary.json", "loadtest.png", "locust_report.html", "locust_stats.csv",
                 "locust_stats_history.csv", "locust_failures.csv", "requests.jsonl"):
        assert (tmp_path / name).stat().st_size > 0, name
    s = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0, s["first_errors"]
    assert s["succeeded"] > 0 and s["failed"] == 0
    assert set(s["by_protocol"]) == {"http", "grpc"}  # one user of each class
    assert 0 < s["output_tokens"] <= 16 * s["succeeded"] and s["output_tokens_per_s"] > 0
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert 0 < s[key]["p50"] <= s[key]["p90"] <= s[key]["p99"], key
    assert s["ttft_ms"]["p99"] <= s["e2e_ms"]["p99"] and s["itl_ms"]["p50"] < s["e2e_ms"]["p50"]
    assert 0 <= s["goodput"]["good_requests"] <= s["succeeded"]
    assert s["goodput"]["requests_per_s"] <= s["requests_per_s"]

    # Locust saw the same requests, through its events: E2E once a request, TTFT and ITL once a success.
    rows = {(r["Type"], r["Name"]): r for r in csv.DictReader((tmp_path / "locust_stats.csv").open())}
    e2e = [r for (kind, name), r in rows.items() if kind == "E2E"]
    assert sum(int(r["Request Count"]) for r in e2e) == s["requests"]
    assert all(int(r["Failure Count"]) == 0 for r in rows.values())
    assert {kind for kind, _ in rows} >= {"E2E", "TTFT", "ITL"}


def test_the_openai_user_loads_an_openai_api_alone(openai_url, tmp_path, nothing_beside):
    """`--protocols openai`: Locust's OpenAI user against Minions' frontend, no Triton endpoint named or
    started (the same run measures llama-server's API)."""
    rc = main(["--protocols", "openai", "--openai-host", openai_url, "--users", "2", "--spawn-rate", "2",
               "--time", "6", "--stop-timeout", "15", "--max-tokens", "16", "--out", str(tmp_path)])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0, s["first_errors"]
    assert set(s["by_protocol"]) == {"openai"} and s["succeeded"] > 0 and s["failed"] == 0
    assert 0 < s["output_tokens"] <= 16 * s["succeeded"]
    assert 0 < s["ttft_ms"]["p50"] <= s["e2e_ms"]["p50"] and s["itl_ms"]["p50"] > 0
    assert s["settings"]["server"] == openai_url and "tritonserver.log" not in {p.name for p in tmp_path.iterdir()}


class _RefusingHttp(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"error": "server overloaded"}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class _RefusingGrpc(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ModelStreamInfer(self, request_iterator, context):
        context.abort(grpc.StatusCode.UNAVAILABLE, "server overloaded")


def test_an_overloaded_server_s_refusals_count_as_unavailable_not_as_errors(tmp_path, nothing_beside):
    """Stand-ins for a server at capacity: HTTP 503 and gRPC UNAVAILABLE on every request."""
    http = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingHttp)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    refusing_grpc = grpc.server(ThreadPoolExecutor(4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_RefusingGrpc(), refusing_grpc)
    grpc_port = refusing_grpc.add_insecure_port("127.0.0.1:0")
    refusing_grpc.start()
    try:
        rc = main(["--host", f"http://127.0.0.1:{http.server_port}", "--grpc-host", f"127.0.0.1:{grpc_port}",
                   "--users", "2", "--spawn-rate", "2", "--time", "3", "--out", str(tmp_path)])
    finally:
        http.shutdown()
        refusing_grpc.stop(None)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0  # refusals are reported, not failed on
    assert s["requests"] > 0 and s["succeeded"] == 0
    assert s["unavailable"] == s["failed"] == s["requests"] and s["errors"] == s["timeouts"] == 0
    assert set(s["by_protocol"]) == {"http", "grpc"}
    assert s["goodput"]["good_requests"] == 0 and s["ttft_ms"]["p50"] is None
    assert "server overloaded" in " ".join(s["first_errors"])
