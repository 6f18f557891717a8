"""The OpenAI wire format: pydantic models of the requests we accept and the responses and chunks we send.

Requests ignore unknown fields (as OpenAI and vLLM do) and treat an explicit `null` as "use the default".
Range checks live in `SamplingParams.validate` and `serving.py`, so every limit is checked once, against the
server's real capacity, with a message that names the field.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: int64, like OpenAI's `seed`.
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class StreamOptions(_Request):
    #: Send one last chunk with `usage` and empty `choices` before `[DONE]`.
    include_usage: bool = False


class _GenerationRequest(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    #: Must be the served model name when given.
    model: Optional[str] = None
    #: Choices to generate; each is a separate engine request (1..MAX_N).
    n: int = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    #: Makes sampling reproducible; choice i uses `seed + i`.
    seed: Optional[int] = Field(None, ge=_SEED_MIN, le=_SEED_MAX)
    #: Up to a few strings; generation ends before the first match, which is not returned.
    stop: Optional[Union[str, list[str]]] = None
    temperature: float = 1.0
    top_p: float = 1.0
    # vLLM's extensions:
    top_k: int = -1
    min_tokens: int = 0
    ignore_eos: bool = False

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_is_strings(cls, value: Any) -> Any:
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(s, str) for s in value)):
            return value
        raise ValueError("stop must be a string or a list of strings")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return tuple(s for s in stop if s)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_GenerationRequest):
    #: A string, a list of token ids, or a batch of either (one set of `n` choices per prompt).
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int = 16
    #: Top logprobs per token (0..20); needs on-device sampling off.
    logprobs: Optional[int] = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        def ids(v: Any) -> bool:
            return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)

        if isinstance(value, str) or ids(value):
            return value
        if isinstance(value, list) and (all(isinstance(p, str) for p in value) or all(ids(p) for p in value)):
            return value
        raise ValueError("prompt must be a string, a list of token ids, or a list of either")


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    #: A string or a list of text parts (images and audio are not supported).
    content: Union[str, list[TextPart]] = ""
    name: Optional[str] = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    #: Deprecated by OpenAI in favour of max_completion_tokens; either works. None = up to max_model_len.
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    #: Return the chosen token's logprob; needs on-device sampling off.
    logprobs: bool = False
    #: Alternatives per token (0..20); needs `logprobs: true`.
    top_logprobs: Optional[int] = None


# -- responses ------------------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _Response(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[dict[str, Any]] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[str, int]] = None  # vLLM's: the stop string or token id that matched


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: Optional[dict[str, Any]] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[str, int]] = None


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: Optional[dict[str, Any]] = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "neuronmodel"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
