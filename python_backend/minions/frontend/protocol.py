"""The OpenAI API's request bodies (the fields Minions reads, with OpenAI's defaults) and its error body.

Fields OpenAI defines but Minions cannot honour are accepted at their neutral value and refused
otherwise (`OpenAIError`, 400, naming the field), as the `minions` model does for tensorrt_llm_bls's
inputs. Unknown fields are ignored, as vLLM's and Triton's own OpenAI frontends do; a string anywhere
in the body that is not Unicode text (a lone UTF-16 surrogate, `"\ud800"`, which JSON can spell but
UTF-8 cannot) is refused, since the prompt must reach the model as UTF-8. `speculation`,
`num_draft_tokens`, `top_k`, `min_tokens` and `repetition_penalty` are extensions (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from minions.text.surrogates import lone_surrogate, surrogate_message

ERROR_TYPES = {404: "not_found_error", 499: "request_cancelled", 503: "service_unavailable"}
"""An error's HTTP status -> its `type` in OpenAI's error JSON; any other 4xx is an
`invalid_request_error`, any other 5xx a `server_error`."""

INT32_MAX = 2**31 - 1
"""The largest value of the model's INT32 inputs (max_tokens, top_k, ...): the model checks its own
limits, the frontend only that a number reaches it."""


class OpenAIError(Exception):
    """An error answered as OpenAI's error JSON with an HTTP status (and headers, e.g. Retry-After)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = dict(headers or {})

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status) or ("invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

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
    num_draft_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    min_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    repetition_penalty: float | None = Field(None, gt=0.0)

    @model_validator(mode="before")
    @classmethod
    def _unicode_text(cls, body: Any) -> Any:
        """Raises OpenAIError (not ValueError) so that the answer names the string's path as `param`."""
        if (where := lone_surrogate(body)) is not None:
            path, index = where
            raise OpenAIError(400, surrogate_message(path or "body", index), path or None)
        return body

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("n: one choice per request is supported; send n 1")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported; leave it out")
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
    max_tokens: int | None = Field(16, ge=1, le=INT32_MAX)
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

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message. Its content is required, for every role: OpenAI lets an assistant message carry
    tool calls instead (content null), and Minions serves no tool calls."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart]

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        if content is None:
            raise ValueError("content is required: a string or a list of text parts, not null (null content "
                             "goes with tool calls, which are not supported)")
        if isinstance(content, list) and not all(
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                for part in content):
            raise ValueError('only text content parts are supported: {"type": "text", "text": "..."}')
        if not isinstance(content, str | list):
            raise ValueError("content must be a string or a list of text parts")
        return content

    def as_minions(self) -> dict[str, str]:
        """{role, content} as the model's chat template takes it: text parts joined, `developer` as
        `system` (OpenAI's newer name for it)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
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
