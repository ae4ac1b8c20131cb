"""minions.deploy.server's start helpers: a server counts as started only once its metrics endpoint
answers too (tritonserver opens it last, after HTTP already says ready); its ports are distinct."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from minions.deploy.server import ServerPorts, free_ports, wait_ready


class _Endpoint(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, on_request=None) -> None:
        self.hits = 0
        self.on_request = on_request
        super().__init__(("127.0.0.1", port), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.hits += 1
        if self.server.on_request:
            self.server.on_request()
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def running():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def test_ready_waits_for_the_metrics_endpoint_that_opens_after_http_says_ready(running):
    ports = ServerPorts("127.0.0.1", *free_ports(3))
    opened: list[_Endpoint] = []

    def open_metrics() -> None:  # as tritonserver: metrics listens only once HTTP has said ready
        if not opened:
            opened.append(_Endpoint(ports.metrics))

    http = _Endpoint(ports.http, on_request=open_metrics)
    try:
        wait_ready(ports, running, timeout=30)
        assert http.hits >= 1
        assert opened and opened[0].hits >= 1, "wait_ready returned before the metrics endpoint answered"
    finally:
        for endpoint in (http, *opened):
            endpoint.shutdown()
            endpoint.server_close()


def test_a_server_that_exits_before_it_is_ready_is_reported():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    ports = ServerPorts("127.0.0.1", *free_ports(3))
    with pytest.raises(RuntimeError, match="exited with code 3"):
        wait_ready(ports, proc, timeout=30)


def test_ports_picked_together_are_distinct():
    assert len(set(free_ports(64))) == 64
