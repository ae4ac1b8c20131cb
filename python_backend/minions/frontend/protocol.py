"""The OpenAI API's request bodies (the fields Minions reads, with OpenAI's defaults) and its error body.

Fields OpenAI defines but Minions cannot honour are accepted at their neutral value and refused
otherwise (`OpenAIError`, 400, naming the field), as the `minions` model does for tensorrt_llm_bls's
inputs. Unknown fields are ignored, as vLLM's and Triton's own OpenAI frontends do. `speculation`,
`num_draft_tokens`, `top_k`, `min_tokens` and `repetition_penalty` are extensions (docs/api.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 499: "request_cancelled",
               503: "service_unavailable", 500: "server_error"}
"""An error's HTTP status -> its `type` in OpenAI's error JSON."""


class OpenAIError(Exception):
    """An error answered as OpenAI's error JSON with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    """OpenAI's default is 1.0 (sampling); send 0 for greedy decoding."""
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    n: int = 1
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # extensions
    speculation: str | None = None
    num_draft_tokens: int | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0.0)

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("n: one choice per request is supported; send n 1")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported; leave it out")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop: at most 4 sequences")
        return self

    @property
    def wants_log_probs(self) -> bool:
        """Whether the answer carries each token's log probability (the endpoints' own fields say)."""
        return False

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def stop_words(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingFields):
    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1)
    """OpenAI's default for completions is 16 tokens."""
    echo: bool = False
    best_of: int | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    """0: each generated token's log probability; above 0 (its most likely alternatives) is refused."""
    suffix: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self):
        if isinstance(self.prompt, list):
            if len(self.prompt) != 1:
                raise ValueError(f"prompt: one prompt per request is supported, got {len(self.prompt)}")
            self.prompt = self.prompt[0]
        if self.best_of not in (None, 1):
            raise ValueError("best_of: one candidate per request is supported; send best_of 1")
        if self.logprobs:
            raise ValueError("logprobs: only the chosen token's log probability is returned; send logprobs 0")
        if self.logprobs is not None and self.echo:
            raise ValueError("logprobs with echo (the prompt's log probabilities) are not returned")
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported; leave it out")
        return self

    @property
    def wants_log_probs(self) -> bool:
        return self.logprobs is not None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    @model_validator(mode="after")
    def _text_only(self):
        if isinstance(self.content, list) and any(part.type != "text" for part in self.content):
            raise ValueError("only text content parts are supported")
        return self

    def as_minions(self) -> dict[str, str]:
        """{role, content} as the model's chat template takes it: text parts joined, `developer` as
        `system` (OpenAI's newer name for it)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text or "" for part in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    """OpenAI's newer name for max_tokens; either bounds the answer (the server's default otherwise)."""
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _supported_chat(self):
        if self.top_logprobs:
            raise ValueError("top_logprobs: only the chosen token's log probability is returned; send 0")
        if self.tools:
            raise ValueError("tools (function calling) are not supported; leave them out")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ValueError("response_format: only text is supported")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def wants_log_probs(self) -> bool:
        return self.logprobs
