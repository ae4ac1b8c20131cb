"""llama.cpp's `llama-server` as a peer: the process on a free loopback port, and one streamed chat
completion through its OpenAI-compatible endpoint, measured the way the Minions client measures.

The request is the OpenAI one a user would send: the prompt as one user message (the server applies
the GGUF's own chat template, as the Minions orchestrator applies the same template from the same
file), greedy (`temperature: 0`), `max_tokens`; the server stops at EOS or there, as Minions does.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from minions.deploy.server import free_port, wait_http_ok
from harness.triton_process import stop_process

from .streams import Sample


@dataclass(frozen=True)
class ServerConfig:
    """One llama-server configuration: a label, the model file and any further flags (speculation)."""

    label: str
    model: Path
    extra: tuple[str, ...] = ()
    anchor: str = "pinned"
    """Which llama.cpp source the server is built from (llama_server_build.ANCHORS)."""


class LlamaServer:
    """Context manager: start llama-server, wait until /health answers, stop it on exit."""

    def __init__(self, binary: Path, config: ServerConfig, threads: int, parallel: int, slot_context: int,
                 log_path: Path) -> None:
        self.config = config
        self.host, self.port = "127.0.0.1", free_port()
        self.log_path = log_path
        self.command = [
            str(binary), "-m", str(config.model), "-t", str(threads), "-np", str(parallel),
            "-c", str(parallel * slot_context), "--host", self.host, "--port", str(self.port),
            "--jinja",  # the GGUF's own chat template (with its default system prompt), as transformers applies it
            *config.extra,
        ]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> LlamaServer:
        self._log = open(self.log_path, "w")
        self._log.write(" ".join(self.command) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready()
        except Exception:
            self.stop()
            raise RuntimeError(f"llama-server ({self.config.label}) did not start; log tail:\n"
                               f"{self.log_path.read_text(errors='replace')[-3000:]}") from None
        return self

    def _wait_ready(self, timeout: float = 300.0) -> None:
        wait_http_ok(f"{self.url}/health", self.proc, "llama-server", timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGTERM, timeout)
        self._log.close()

    def __exit__(self, *exc) -> None:
        self.stop()


def chat_completion(url: str, prompt: str, max_tokens: int, timeout_s: float = 180.0) -> Sample:
    """One greedy streamed chat completion of one user message."""
    return conversation_turn(url, [{"role": "user", "content": prompt}], max_tokens, timeout_s)


def conversation_turn(url: str, messages: list[dict], max_tokens: int, timeout_s: float = 180.0) -> Sample:
    """One greedy streamed chat completion of a conversation; output tokens as the server counted them (`usage`)."""
    body = {"messages": messages, "stream": True, "temperature": 0.0,
            "max_tokens": max_tokens, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    parts: list[str] = []
    ttft = last = None
    tokens: int | None = None
    usage: dict = {}
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            for raw in response:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                for choice in event.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        last = time.perf_counter() - start
                        ttft = last if ttft is None else ttft
                        parts.append(piece)
                if event.get("usage"):
                    usage = event["usage"]
                    tokens = int(usage["completion_tokens"])
    except urllib.error.HTTPError as exc:
        raise RuntimeError(exc.read().decode("utf-8", errors="replace")) from None
    if tokens is None or ttft is None:
        raise RuntimeError(f"llama-server streamed {len(parts)} pieces and no usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Sample("".join(parts), tokens, ttft, last, int(usage.get("prompt_tokens") or 0), int(cached))
