"""One real tritonserver with the real default deployment (SmolLM2 + llama.cpp + n-gram) per session."""

from __future__ import annotations

import pytest

from benchmarks.server_process import TritonProcess


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    build = tmp_path_factory.mktemp("triton-build")
    with TritonProcess(log_path=build / "tritonserver.log", build=build) as proc:
        yield proc
    assert proc.proc.returncode == 0, f"tritonserver did not shut down cleanly:\n{proc.log_text()[-3000:]}"
