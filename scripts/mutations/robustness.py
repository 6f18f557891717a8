"""Mutations of what fuzzing, chaos and overload runs found: a spec refused while building the children, the
sweep of pruned revisions' ConfigMaps, request limits, malformed input, streamed chunks' bytes, dropped streams and
the SIGTERM drain."""

from .definition import OPERATOR, Mutation
from .selections import ABORT_FREES_SLOT, FUZZ, LIVE_DRAIN, RECONCILE, RENDER, REQUEST_LIMITS, SSE

ENGINE_PROCESS = ("tests/runtime_tests/server/test_engine_process.py",)
ENGINE = ("tests/runtime_tests/engine/test_engine.py",)

MUTATIONS = [
    Mutation(
        "async scheduling: a call's text made before the next call runs, not beside it", "engine/engine.py",
        "            text = self._texter.submit(self._text, untexted, emit) if self._texter and untexted else None\n",
        "            self._finish(self._text(untexted, emit))\n            text = None\n",
        ENGINE + ("-k", "while_the_next_call_runs"),
    ),
    Mutation(
        "detokenize: the tokens a step returned after a stop string reach the client", "engine/request.py",
        "                self._drop_after(self._texted)\n", "", ENGINE + ("-k", "multi_token_steps"),
    ),
    Mutation(
        "engine process: a dead core goes unnoticed (its streams hang, the server serves on)",
        "engine/core_client.py", "        if not self._closing:\n            self._died(",
        "        if False:\n            self._died(", ENGINE_PROCESS + ("-k", "killed_engine"),
    ),
    Mutation(
        "engine process: the core dies of the Ctrl+C its server drains on", "core_process.py",
        "        signal.signal(sig, signal.SIG_IGN)", "        pass", ENGINE_PROCESS + ("-k", "ctrl_c"),
    ),
    Mutation(
        "engine process: the idle core's last stats never sent (the metrics miss the last step of a busy spell)",
        "engine/step_loop.py", "            if self._on_idle is not None and not self.engine.has_work:",
        "            if False:", ENGINE_PROCESS + ("-k", "count_every_step"),
    ),
    Mutation(
        "engine process: a silent core is never stalled (its last outputs' time not kept)", "engine/core_client.py",
        "self._heard_at, self._stats = time.monotonic(), message[2]", "self._stats = message[2]",
        ENGINE_PROCESS + ("-k", "steps_for_longer"),
    ),
    Mutation(
        "reconcile: a SpecError found while building the children left to the handler (no status, retried forever)",
        "reconcile.py", "except api.SpecError as exc:  # found only once the children are built",
        "except NotImplementedError as exc:  # found only once the children are built",
        RECONCILE + ("-k", "spec_error_fails"), package=OPERATOR,
    ),
    Mutation(
        "reconcile: a pruned ReplicaSet's runtime ConfigMap kept (no sweep on its watch event)", "reconcile.py",
        "if any(live is None and key[0] in REVISION_HOLDERS", "if False and any(live is None",
        RECONCILE + ("-k", "kept_while_used"), package=OPERATOR,
    ),
    Mutation(
        "body limit: a chunked body's bytes not counted (no Content-Length, no limit)", "server/limits.py",
        "if size > self.max_bytes:", "if False:", REQUEST_LIMITS + ("-k", "chunked"),
    ),
    Mutation(
        "body limit: Content-Length not checked (the server waits for a gigabyte before refusing it)",
        "server/limits.py", "if declared is not None and declared > self.max_bytes:", "if False:",
        REQUEST_LIMITS + ("-k", "declared_length"),
    ),
    Mutation(
        "request limits: the stop count not checked", "server/limits.py",
        "if len(stop) > limits.max_stop_sequences:", "if False:", REQUEST_LIMITS + ("-k", "over_its_limit"),
    ),
    Mutation(
        "protocol: a lone surrogate accepted as text (the tokenizer fails: a 500)", "server/protocol.py",
        'text.encode("utf-8")', 'text.encode("utf-8", "surrogatepass")', FUZZ + ("-k", "surrogate"),
    ),
    Mutation(
        "errors: invalid requests answered with FastAPI's 422 body, not OpenAI's error", "server/errors.py",
        "app.add_exception_handler(RequestValidationError, _on_validation_error)", "pass",
        FUZZ + ("-k", "generated_requests"),
    ),
    Mutation(
        "render: a streamed completion's text spliced in unescaped (a quote or a newline breaks the chunk's JSON)",
        "server/render.py", "starts[index] + encode_basestring(out.text) + end",
        "starts[index] + '\"' + out.text + '\"' + end", RENDER,
    ),
    Mutation(
        "render: streamed text escaped as ASCII (valid JSON, but not the bytes pydantic writes for the same chunk)",
        "server/render.py", "from json.encoder import encode_basestring\n",
        "from json.encoder import encode_basestring_ascii as encode_basestring\n", RENDER,
    ),
    Mutation(
        "sse: a client's disconnect not watched (its stream runs on to max_tokens, holding its slot)",
        "server/sse.py", "watching = asyncio.ensure_future(_disconnect(receive))",
        "watching = asyncio.ensure_future(asyncio.Event().wait())", SSE + ("-k", "disconnect"),
    ),
    Mutation(
        "sse: close left to the events' own finally (a client gone before the first event leaves its choices "
        "running)", "server/sse.py", "            self.close()\n", "            pass\n",
        SSE + ("-k", "before_the_first_event"),
    ),
    Mutation(
        "scheduler: an aborted request leaves the batch without its slot freed (each dropped stream leaks a slot)",
        "engine/scheduler.py", "for req in out.aborted:\n            self._release(req)",
        "for req in out.aborted:\n            self.running.pop(req.slot, None)", ABORT_FREES_SLOT,
    ),
    Mutation(
        "serving: a stream its client dropped not aborted (its slot stays busy until max_tokens)", "server/serving.py",
        "self._closed = True\n        self.abort()", "self._closed = True", LIVE_DRAIN,
    ),
    Mutation(
        "drain: SIGTERM does not wait for the requests in flight (uvicorn's 5 s close, then the engine stops)",
        "server/serving.py", "if await self._wait_live(timeout):", "if True:", LIVE_DRAIN,
    ),
    Mutation(
        "drain: the draining flag never set (/ready and new requests answer the engine's 'not_ready', not 'draining')",
        "server/serving.py", "self.draining = True\n        self.engine.stop_accepting()",
        "self.engine.stop_accepting()", LIVE_DRAIN,
    ),
]
