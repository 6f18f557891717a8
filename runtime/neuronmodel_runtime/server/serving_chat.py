"""POST /v1/chat/completions: messages -> the tokenizer's chat template -> engine requests; outputs -> chat
completion objects and chunks."""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator, Optional, Union

from starlette.requests import Request

from neuronmodel_runtime.engine.outputs import RequestOutput
from neuronmodel_runtime.server.tokenizer import chat_prompt_ids, token_bytes, token_text
from neuronmodel_runtime.runners.base import TokenLogprob
from neuronmodel_runtime.server.errors import invalid
from neuronmodel_runtime.server.limits import check_request_size
from neuronmodel_runtime.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessage,
    ChatMessageOut,
)
from neuronmodel_runtime.server.render import chat_chunks
from neuronmodel_runtime.server.serving import Generation, Serving, SSEStream


class ChatServing:
    def __init__(self, serving: Serving):
        self.serving = serving
        self.tokenizer = serving.engine.tokenizer

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Union[dict, SSEStream]:
        """A chat completion object, or an SSE stream of chat completion chunks when `req.stream`.

        Raises:
            APIError: bad input (4xx naming the field), queue full (429), not accepting (503), engine failure (500).
        """
        serving = self.serving
        serving.check_model(req.model)
        check_request_size(req, serving.config.server)
        if req.top_logprobs is not None and not req.logprobs:
            raise invalid("top_logprobs", "top_logprobs requires logprobs: true")
        use_mct = req.max_completion_tokens is not None
        max_tokens_param = "max_completion_tokens" if use_mct else "max_tokens"
        names = {"max_tokens": max_tokens_param, **({"logprobs": "top_logprobs"} if req.top_logprobs else {})}
        params = serving.sampling_params(
            req,
            max_tokens=req.max_completion_tokens if use_mct else req.max_tokens,
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            names=names,
        )
        prompt_ids = await serving.tokenize(lambda: self._prompt_ids(req.messages))
        serving.check_prompt(prompt_ids, params, "messages", max_tokens_param)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        generation = serving.start(request_id, [prompt_ids], params, req.n)
        if req.stream:
            template = ChatCompletionChunk(id=request_id, model=serving.model_name, choices=[])
            events = self._stream(generation, template, req.n, req.include_usage, req.logprobs, req.top_logprobs or 0)
            return SSEStream(events, generation.close)
        results = await generation.collect(raw.receive)
        choices = [
            ChatChoice(
                index=r.index,
                message=ChatMessageOut(content=r.text),
                logprobs=self._logprobs(r.token_ids, r.logprobs, req.top_logprobs or 0) if req.logprobs else None,
                finish_reason=r.finish_reason,
                stop_reason=r.stop_reason,
            )
            for r in results
        ]
        response = ChatCompletionResponse(
            id=request_id, model=serving.model_name, choices=choices, usage=generation.usage()
        )
        return response.model_dump()

    def _prompt_ids(self, messages: list[ChatMessage]) -> list[int]:
        conversation = [
            {"role": m.role, "content": m.text, **({"name": m.name} if m.name else {})} for m in messages
        ]
        try:
            return chat_prompt_ids(self.tokenizer, conversation)
        except Exception as exc:  # noqa: BLE001 - a template raises what it likes (roles, order); the input is at fault
            raise invalid("messages", f"messages cannot be rendered with the model's chat template: {exc}") from None

    def _stream(self, generation: Generation, template: ChatCompletionChunk, n: int, include_usage: bool,
                with_logprobs: bool, top_logprobs: int) -> AsyncIterator[str]:
        def chunk(index: int, delta: ChatDelta, logprobs: Optional[dict] = None, finish: Optional[str] = None) -> str:
            choice = ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish)
            return template.model_copy(update={"choices": [choice]}).model_dump_json()

        def render_with_logprobs(index: int, out: RequestOutput) -> str:
            logprobs = self._logprobs(out.token_ids, out.logprobs, top_logprobs) if out.logprobs else None
            return chunk(index, ChatDelta(content=out.text or None), logprobs, out.finish_reason)

        # The role comes first, once per choice, as OpenAI sends it.
        roles = [chunk(index, ChatDelta(role="assistant", content="")) for index in range(n)]
        render = render_with_logprobs if with_logprobs else chat_chunks(template, n)
        return generation.events(render, template, include_usage, prelude=roles)

    def _logprobs(self, token_ids: list[int], logprobs: Optional[list[TokenLogprob]], top: int) -> dict[str, Any]:
        """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            raw = list(token_bytes(self.tokenizer, token_id))  # raw bytes, also for part of a character
            return {"token": token_text(self.tokenizer, token_id), "logprob": logprob, "bytes": raw}

        content = []
        for token_id, lp in zip(token_ids, logprobs or []):
            alternatives = sorted(lp.top.items(), key=lambda kv: kv[1], reverse=True)[:top]
            content.append({**entry(token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in alternatives]})
        return {"content": content}
