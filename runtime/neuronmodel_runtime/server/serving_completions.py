"""POST /v1/completions: prompts (text or token ids) -> engine requests; outputs -> completion objects and chunks."""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator, Optional, Union

from starlette.requests import Request

from neuronmodel_runtime.engine.outputs import RequestOutput
from neuronmodel_runtime.server.tokenizer import token_text
from neuronmodel_runtime.runners.base import TokenLogprob
from neuronmodel_runtime.server.errors import invalid
from neuronmodel_runtime.server.limits import check_request_size
from neuronmodel_runtime.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse
from neuronmodel_runtime.server.render import Render, completion_chunks
from neuronmodel_runtime.server.serving import Generation, Serving, SSEStream


class CompletionServing:
    def __init__(self, serving: Serving):
        self.serving = serving
        self.tokenizer = serving.engine.tokenizer

    async def create(self, req: CompletionRequest, raw: Request) -> Union[dict, SSEStream]:
        """A completion object, or an SSE stream of completion chunks when `req.stream`.

        Raises:
            APIError: bad input (4xx naming the field), queue full (429), not accepting (503), engine failure (500).
        """
        serving = self.serving
        serving.check_model(req.model)
        check_request_size(req, serving.config.server)
        params = serving.sampling_params(req, max_tokens=req.max_tokens, logprobs=req.logprobs)
        if req.echo and req.logprobs is not None:
            raise invalid("echo", "echo with logprobs needs prompt logprobs, which this server does not compute")
        prompts = await serving.tokenize(lambda: self._prompt_ids(req.prompt))
        for i, ids in enumerate(prompts):
            serving.check_prompt(ids, params, "prompt" if len(prompts) == 1 else f"prompt[{i}]", "max_tokens")
        echoed = await serving.tokenize(lambda: self._echoed(req.prompt, prompts)) if req.echo else None
        request_id = f"cmpl-{uuid.uuid4().hex}"
        generation = serving.start(request_id, prompts, params, req.n)
        template = CompletionResponse(id=request_id, model=serving.model_name, choices=[])
        if req.stream:
            return SSEStream(self._stream(generation, template, req, echoed), generation.close)
        results = await generation.collect(raw.receive)
        choices = [
            CompletionChoice(
                index=r.index,
                text=(echoed[r.index // req.n] if echoed else "") + r.text,
                logprobs=self._logprobs(r.token_ids, r.logprobs, 0) if req.logprobs is not None else None,
                finish_reason=r.finish_reason,
                stop_reason=r.stop_reason,
            )
            for r in results
        ]
        return template.model_copy(update={"choices": choices, "usage": generation.usage()}).model_dump()

    def _prompt_ids(self, prompt: Union[str, list[str], list[int], list[list[int]]]) -> list[list[int]]:
        """One token-id list per prompt (an empty list is one empty prompt, refused by check_prompt)."""
        if isinstance(prompt, str):
            return [list(self.tokenizer.encode(prompt))]
        if not prompt or isinstance(prompt[0], int):
            return [list(prompt)]
        return [list(self.tokenizer.encode(p)) if isinstance(p, str) else list(p) for p in prompt]

    def _echoed(self, prompt: Union[str, list[str], list[int], list[list[int]]], ids: list[list[int]]) -> list[str]:
        """The text `echo` returns per prompt: the prompt as sent, or the decoded token ids."""
        texts = [prompt] if isinstance(prompt, str) else [p for p in prompt if isinstance(p, str)]
        if len(texts) == len(ids):
            return texts
        return [self.tokenizer.decode(p, skip_special_tokens=True) for p in ids]

    def _stream(self, generation: Generation, template: CompletionResponse, req: CompletionRequest,
                echoed: Optional[list[str]]) -> AsyncIterator[str]:
        if req.logprobs is None:
            render = completion_chunks(template, generation.num_choices)
        else:
            render = self._chunks_with_logprobs(template)
        prelude = []
        if echoed:  # the prompt first, one chunk per choice (as vLLM streams echo)
            for index in range(len(echoed) * req.n):
                choice = CompletionChoice(index=index, text=echoed[index // req.n])
                prelude.append(template.model_copy(update={"choices": [choice]}).model_dump_json())
        return generation.events(render, template, req.include_usage, prelude=prelude)

    def _chunks_with_logprobs(self, template: CompletionResponse) -> Render:
        text_len: dict[int, int] = {}  # choice -> characters sent (logprobs' text_offset)

        def render(index: int, out: RequestOutput) -> str:
            offset = text_len.get(index, 0)
            text_len[index] = offset + len(out.text)
            choice = CompletionChoice(
                index=index,
                text=out.text,
                logprobs=self._logprobs(out.token_ids, out.logprobs, offset) if out.logprobs is not None else None,
                finish_reason=out.finish_reason,
                stop_reason=out.stop_reason,
            )
            return template.model_copy(update={"choices": [choice]}).model_dump_json()

        return render

    def _logprobs(self, token_ids: list[int], logprobs: Optional[list[TokenLogprob]], offset: int) -> dict[str, Any]:
        """OpenAI's legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
        tokens = [token_text(self.tokenizer, t) for t in token_ids]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs or []],
            "top_logprobs": [{token_text(self.tokenizer, t): v for t, v in lp.top.items()} for lp in logprobs or []],
            "text_offset": offsets,
        }
