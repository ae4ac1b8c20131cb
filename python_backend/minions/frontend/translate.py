"""OpenAI requests to the `minions` model's inputs, and its outputs to OpenAI's response objects.

Free of I/O: app.py feeds it the parsed request and each Triton response's outputs.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from minions.frontend.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields

OPENAI_TEMPERATURE = 1.0
"""OpenAI's default: a request without `temperature` samples. Send 0 for greedy decoding."""


def _sampling_inputs(req: SamplingFields) -> dict[str, Any]:
    """The inputs both endpoints send: always streamed from Triton (a non-streamed answer is gathered
    here), the prompt left out of the output."""
    inputs: dict[str, Any] = {
        "stream": True,
        "exclude_input_in_output": True,
        "temperature": OPENAI_TEMPERATURE if req.temperature is None else req.temperature,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
    }
    optional = {"top_p": req.top_p, "seed": req.seed, "speculation": req.speculation,
                "num_draft_tokens": req.num_draft_tokens, "top_k": req.top_k, "min_tokens": req.min_tokens,
                "repetition_penalty": req.repetition_penalty}
    inputs |= {name: value for name, value in optional.items() if value is not None}
    if stop := req.stop_words():
        inputs["stop_words"] = stop
    if req.wants_log_probs:
        inputs["return_log_probs"] = True
    return inputs


def completion_inputs(req: CompletionRequest) -> dict[str, Any]:
    inputs = {"text_input": req.prompt, "chat": False, **_sampling_inputs(req)}
    if req.max_tokens is not None:
        inputs["max_tokens"] = req.max_tokens
    return inputs


def chat_inputs(req: ChatCompletionRequest) -> dict[str, Any]:
    """Messages travel as the JSON list the model's `chat` input takes (its chat template applies)."""
    messages = json.dumps([m.as_minions() for m in req.messages])
    inputs = {"text_input": messages, "chat": True, **_sampling_inputs(req)}
    if req.token_limit is not None:
        inputs["max_tokens"] = req.token_limit
    return inputs


@dataclass
class Generation:
    """One request's answer as Triton's responses arrive: text so far, finish reason, token counts."""

    kind: str
    """"text_completion" or "chat.completion"."""
    model: str
    with_log_probs: bool = False
    """The request asked for each token's log probability (`logprobs`)."""
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Of the prompt's tokens, those the LLM found in its prefix cache."""
    completion_tokens: int = 0
    log_probs: list[tuple[str, float]] = field(default_factory=list)
    """(token text, log probability) of each generated token, when the request asks for them."""
    new_log_probs: list[tuple[str, float]] = field(default_factory=list)
    """Those the latest response brought."""

    def __post_init__(self) -> None:
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    @property
    def chat(self) -> bool:
        return self.kind == "chat.completion"

    def add(self, outputs: dict[str, Any]) -> str:
        """Fold in one response's outputs; returns its new text."""
        chunk = outputs.get("text_output") or ""
        self.text += chunk
        self.finish_reason = outputs.get("finish_reason") or self.finish_reason
        self.completion_tokens = int(outputs.get("num_output_tokens", self.completion_tokens))
        self.prompt_tokens = int(outputs.get("num_input_tokens", self.prompt_tokens))
        self.cached_tokens = int(outputs.get("num_cached_tokens", self.cached_tokens))
        tokens, values = _listed(outputs.get("output_tokens")), _listed(outputs.get("output_log_probs"))
        self.new_log_probs = list(zip(tokens, (float(v) for v in values)))
        self.log_probs += self.new_log_probs
        return chunk

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage object, with the prompt's cached tokens as OpenAI, vLLM and llama-server report them."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def _head(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}

    def body(self, prefix: str = "") -> dict[str, Any]:
        """The whole answer (non-streamed); `prefix` goes before the text (a completion's `echo`)."""
        text = prefix + self.text
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.finish_reason,
                                  "logprobs": self._log_probs(self.log_probs) if self.with_log_probs else None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(self.kind), "choices": [choice], "usage": self.usage()}

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False,
              log_probs: list[tuple[str, float]] | None = None) -> dict[str, Any]:
        """One streamed chunk: new text and/or the finish reason (a chat stream's first chunk carries
        the assistant's role), with the log probabilities of the tokens it brought when asked."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason,
                                  "logprobs": self._log_probs(log_probs) if log_probs is not None else None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return {**self._head(f"{self.kind}.chunk" if self.chat else self.kind), "choices": [choice]}

    def _log_probs(self, entries: list[tuple[str, float]]) -> dict[str, Any]:
        """OpenAI's logprobs object for `entries`, the latest of the answer's tokens: chat's `content`
        list, or a completion's parallel lists (with each token's offset in the generated text). Only
        the chosen token's: no alternatives."""
        if self.chat:
            return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                                for t, lp in entries], "refusal": None}
        offset = sum(len(t) for t, _ in self.log_probs) - sum(len(t) for t, _ in entries)
        offsets = []
        for t, _ in entries:
            offsets.append(offset)
            offset += len(t)
        return {"tokens": [t for t, _ in entries], "token_logprobs": [lp for _, lp in entries],
                "top_logprobs": None, "text_offset": offsets}

    def usage_chunk(self) -> dict[str, Any]:
        """The last chunk of a stream that asked for usage (`stream_options.include_usage`): no choices."""
        return {**self._head(f"{self.kind}.chunk" if self.chat else self.kind), "choices": [], "usage": self.usage()}


def _listed(value: Any) -> list:
    """An output as a list (a one-element output arrives as its element)."""
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event: a JSON object, or the stream's closing `[DONE]`."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()
