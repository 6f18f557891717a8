"""The OpenAI wire format: pydantic models of the requests we accept and the responses and chunks we send.

Every OpenAI / vLLM request field is implemented or refused: the fields below are implemented; `REFUSED_FIELDS`
lists the ones this server does not implement, each with why (a request may still send their neutral value);
`IGNORED_FIELDS` change nothing about the output; anything else is an unknown field. The server answers 400
naming the field for the last two kinds (`serving.check_fields`). An explicit `null` means "use the default".
Range checks live in `SamplingParams.validate` and `serving.py`, so every limit is checked once, against the
loaded runner's capabilities and capacity, with a message that names the field.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

#: int64, like OpenAI's `seed`.
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1


def _unicode(text: str) -> str:
    """JSON can carry a lone UTF-16 surrogate ("\\ud800"), which is no character: the tokenizer cannot encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"must be valid Unicode text; it holds a lone surrogate {text[exc.start]!r} at index "
                         f"{exc.start}") from None
    return text


#: Text that reaches the tokenizer or the chat template.
Text = Annotated[str, AfterValidator(_unicode)]


#: Fields accepted and ignored: they do not change the output (OpenAI's end-user id and bookkeeping).
IGNORED_FIELDS = frozenset({"user", "metadata", "service_tier", "parallel_tool_calls"})

_NO_TOOLS = "tool calling is not supported by this server"
_NO_STRUCTURED = "structured output (JSON schema, regex, grammar, choice) is not supported by this server"
#: field -> (values that mean "not used", why the field is refused otherwise).
REFUSED_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "suffix": ((None, ""), "suffix (insertion) is not supported: completions only append to the prompt"),
    "best_of": ((None, 1), "best_of > 1 is not supported; use n"),
    "response_format": (({"type": "text"},), _NO_STRUCTURED),
    "guided_json": ((None,), _NO_STRUCTURED),
    "guided_regex": ((None,), _NO_STRUCTURED),
    "guided_choice": ((None,), _NO_STRUCTURED),
    "guided_grammar": ((None,), _NO_STRUCTURED),
    "structured_outputs": ((None,), _NO_STRUCTURED),
    "tools": ((None, []), _NO_TOOLS),
    "tool_choice": ((None, "none"), _NO_TOOLS),
    "functions": ((None, []), _NO_TOOLS),
    "function_call": ((None, "none"), _NO_TOOLS),
    "min_p": ((None, 0, 0.0), "min_p is not supported; use top_p or top_k"),
    "use_beam_search": ((None, False), "beam search is not supported"),
    "length_penalty": ((None, 1, 1.0), "length_penalty applies to beam search, which is not supported"),
    "prompt_logprobs": ((None,), "prompt logprobs are not computed"),
    "allowed_token_ids": ((None,), "allowed_token_ids is not supported; use logit_bias"),
    "bad_words": ((None, []), "bad_words is not supported; use logit_bias"),
    "skip_special_tokens": ((None, True), "special tokens are always skipped in the output text"),
    "spaces_between_special_tokens": ((None, True), "special tokens are always skipped in the output text"),
    "truncate_prompt_tokens": ((None,), "prompts are never truncated; shorten the prompt"),
    "chat_template": ((None,), "the model's own chat template is always used"),
    "chat_template_kwargs": ((None, {}), "the model's own chat template is always used"),
    "add_generation_prompt": ((None, True), "the assistant's turn is always opened"),
    "continue_final_message": ((None, False), "continuing the final message is not supported"),
    "documents": ((None, []), "documents (RAG templates) are not supported"),
    "logits_processors": ((None, []), "custom logits processors are not supported"),
    "priority": ((None, 0), "priority scheduling is not supported: requests are served first come, first served"),
    "return_tokens_as_token_ids": ((None, False), "tokens are returned as text"),
    "store": ((None, False), "completions are never stored"),
    "echo": ((None, False), "echo is supported by /v1/completions only"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "modalities": ((None, ["text"]), "only text output is supported"),
    "audio": ((None,), "only text output is supported"),
    "reasoning_effort": ((None,), "reasoning effort is not supported"),
    "web_search_options": ((None,), "web search is not supported"),
}


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
    """Fields shared by /v1/completions and /v1/chat/completions. Unknown fields are kept (`model_extra`) so
    that the server can refuse them by name."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

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
    #: 0 = greedy; below 1e-5 is greedy too. Omitted: the model's generation_config.json default, else 1.
    temperature: float = 1.0
    #: Nucleus mass kept, (0, 1]. Omitted: generation_config.json, else 1.
    top_p: float = 1.0
    #: [-2, 2]: minus this once for every token already in the output.
    presence_penalty: float = 0.0
    #: [-2, 2]: minus this per occurrence in the output.
    frequency_penalty: float = 0.0
    #: Token id (as a string) -> bias in [-100, 100] added to its logit.
    logit_bias: Optional[dict[str, float]] = None
    # vLLM's extensions:
    #: Candidates kept; -1 or 0 = no limit. Omitted: generation_config.json, else -1.
    top_k: int = -1
    #: (0, 2]: divides positive / multiplies negative logits of tokens in the prompt or output; 1 = none.
    repetition_penalty: float = 1.0
    #: EOS and stop_token_ids are masked, and stop strings ignored, until this many tokens.
    min_tokens: int = 0
    ignore_eos: bool = False
    #: Token ids that end generation, besides EOS.
    stop_token_ids: Optional[list[int]] = None
    #: Keep the matched stop string in the output text.
    include_stop_str_in_output: bool = False

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

    def bias_ids(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias); raises ValueError naming a key that is not a token id."""
        out = []
        for key, bias in (self.logit_bias or {}).items():
            try:
                out.append((int(key), bias))
            except ValueError:
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
        return tuple(out)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_GenerationRequest):
    #: A string, a list of token ids, or a batch of either (one set of `n` choices per prompt).
    prompt: Union[Text, list[Text], list[int], list[list[int]]]
    max_tokens: int = 16
    #: Top logprobs per token (0..20); needs on-device sampling off.
    logprobs: Optional[int] = None
    #: Return the prompt before the completion.
    echo: bool = False

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
    text: Text


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    #: A string or a list of text parts (images and audio are not supported).
    content: Union[Text, list[TextPart]] = ""
    name: Optional[Text] = None

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
