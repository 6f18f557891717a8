"""The OpenAI protocol over ASGI: response and chunk shapes, n, seeds, stop, usage, logprobs, models, probes.

The app runs the real AsyncEngine over EchoRunner: greedy requests echo the prompt and end with EOS (finish
"stop"); sampled requests draw letters from a per-choice seeded RNG and never stop on their own.
"""

import json

import httpx

from runtime_tests.helpers.fakes import MODEL, asgi_client, make_config, make_engine

CHAT = [{"role": "user", "content": "hi"}]
CHAT_PROMPT = "<user>hi\n<assistant>"


def sse_payloads(text: str) -> list:
    """The `data:` payloads of an SSE body, JSON-decoded except the final [DONE]."""
    lines = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", "a stream ends with data: [DONE]"
    return [json.loads(x) for x in lines[:-1]]


async def test_completion_greedy_echo_with_usage_and_stop_finish():
    async with asgi_client() as (client, _):
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "temperature": 0})
        assert r.status_code == 200
        body = r.json()
        assert body["object"] == "text_completion" and body["model"] == MODEL and body["id"].startswith("cmpl-")
        assert body["choices"] == [
            {"index": 0, "text": "hello", "logprobs": None, "finish_reason": "stop", "stop_reason": 256}
        ]
        assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}  # EOS counts


async def test_completion_max_tokens_gives_length_and_default_is_16():
    async with asgi_client() as (client, _):
        r = await client.post("/v1/completions", json={"prompt": "abcdefgh", "max_tokens": 3, "temperature": 0})
        assert r.json()["choices"][0]["text"] == "abc" and r.json()["choices"][0]["finish_reason"] == "length"
        r = await client.post("/v1/completions", json={"prompt": "x", "seed": 1})
        assert r.json()["usage"]["completion_tokens"] == 16


async def test_token_id_prompt_and_batch_of_prompts():
    async with asgi_client() as (client, _):
        r = await client.post("/v1/completions", json={"prompt": [104, 105], "temperature": 0})
        assert r.json()["choices"][0]["text"] == "hi"
        r = await client.post("/v1/completions", json={"prompt": ["ab", "cde"], "n": 2, "temperature": 0})
        body = r.json()
        assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "ab"), (1, "ab"), (2, "cde"), (3, "cde")]
        assert body["usage"]["prompt_tokens"] == 5, "each prompt is counted once, not once per choice"


async def test_stop_strings_ignore_eos_and_min_tokens():
    async with asgi_client() as (client, _):
        r = await client.post("/v1/completions", json={"prompt": "one two three", "stop": ["two"], "temperature": 0})
        choice = r.json()["choices"][0]
        assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == ("one ", "stop", "two")
        r = await client.post("/v1/completions", json={"prompt": "ab", "stop": "b", "temperature": 0})
        assert r.json()["choices"][0]["text"] == "a"
        r = await client.post(
            "/v1/completions", json={"prompt": "ab", "ignore_eos": True, "max_tokens": 5, "temperature": 0}
        )
        assert r.json()["choices"][0]["finish_reason"] == "length"
        r = await client.post(
            "/v1/completions", json={"prompt": "ab", "min_tokens": 4, "max_tokens": 6, "temperature": 0}
        )
        assert r.json()["usage"]["completion_tokens"] >= 4


async def test_seed_reproducible_and_distinct_per_choice():
    async with asgi_client() as (client, _):
        req = {"prompt": "x", "max_tokens": 12, "temperature": 0.9, "seed": 42, "n": 2}
        a = (await client.post("/v1/completions", json=req)).json()["choices"]
        b = (await client.post("/v1/completions", json=req)).json()["choices"]
        assert [c["text"] for c in a] == [c["text"] for c in b]
        assert a[0]["text"] != a[1]["text"], "choice i is seeded with seed + i"


async def test_chat_completion_uses_the_template_and_max_completion_tokens():
    async with asgi_client() as (client, _):
        r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "temperature": 0})
        body = r.json()
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        assert body["choices"][0]["message"] == {"role": "assistant", "content": CHAT_PROMPT}
        assert body["usage"]["prompt_tokens"] == len(CHAT_PROMPT)
        r = await client.post(
            "/v1/chat/completions", json={"messages": CHAT, "temperature": 0, "max_completion_tokens": 2}
        )
        assert r.json()["choices"][0]["message"]["content"] == "<u"
        parts = [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]
        r = await client.post("/v1/chat/completions", json={"messages": parts, "temperature": 0})
        assert r.json()["choices"][0]["message"]["content"] == CHAT_PROMPT


async def test_chat_stream_shapes_roles_interleaved_choices_and_usage_chunk():
    async with asgi_client() as (client, _):
        req = {"messages": CHAT, "stream": True, "n": 2, "max_tokens": 4, "temperature": 1, "seed": 7,
               "stream_options": {"include_usage": True}}
        r = await client.post("/v1/chat/completions", json=req)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = sse_payloads(r.text)
        assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
        assert len({c["id"] for c in chunks}) == 1
        assert [c["choices"][0]["delta"]["role"] for c in chunks[:2]] == ["assistant", "assistant"]
        texts = {0: "", 1: ""}
        finishes = {}
        for c in chunks[2:-1]:
            choice = c["choices"][0]
            texts[choice["index"]] += choice["delta"]["content"] or ""
            if choice["finish_reason"]:
                finishes[choice["index"]] = choice["finish_reason"]
        assert finishes == {0: "length", 1: "length"} and all(len(t) == 4 for t in texts.values())
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
        again = await client.post("/v1/chat/completions", json={**req, "stream": False, "stream_options": None})
        assert [c["message"]["content"] for c in again.json()["choices"]] == [texts[0], texts[1]]


async def test_completion_stream_without_usage():
    async with asgi_client() as (client, _):
        r = await client.post("/v1/completions", json={"prompt": "hey", "stream": True, "temperature": 0})
        chunks = sse_payloads(r.text)
        assert "".join(c["choices"][0]["text"] for c in chunks) == "hey"
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert all(c["usage"] is None and c["object"] == "text_completion" for c in chunks)


async def test_logprobs_pass_through_when_on_device_sampling_is_off():
    config = make_config(**{"sampling.on_device": False})
    async with asgi_client(config) as (client, _):
        r = await client.post("/v1/completions", json={"prompt": "ab", "logprobs": 2, "temperature": 0})
        lp = r.json()["choices"][0]["logprobs"]
        assert lp["tokens"][:2] == ["a", "b"] and lp["token_logprobs"][:2] == [-0.25, -0.25]
        assert lp["top_logprobs"][0] == {"a": -0.25, "?": -1.5} and lp["text_offset"][:2] == [0, 1]
        r = await client.post(
            "/v1/chat/completions", json={"messages": CHAT, "logprobs": True, "top_logprobs": 1, "max_tokens": 2,
                                          "temperature": 0}
        )
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert content[0] == {"token": "<", "logprob": -0.25, "bytes": [60],
                              "top_logprobs": [{"token": "<", "logprob": -0.25, "bytes": [60]}]}
        r = await client.post(
            "/v1/chat/completions", json={"messages": CHAT, "logprobs": True, "max_tokens": 2, "stream": True}
        )
        assert all(c["choices"][0]["logprobs"] for c in sse_payloads(r.text)[1:])


async def test_models_info_and_probes():
    config = make_config(**{"server.api_key": "sekret"})
    async with asgi_client(config) as (client, app):
        auth = {"Authorization": "Bearer sekret"}
        models = (await client.get("/v1/models", headers=auth)).json()
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
        assert models["data"][0]["max_model_len"] == 256
        assert (await client.get(f"/v1/models/{MODEL}", headers=auth)).json()["id"] == MODEL
        assert (await client.get("/v1/models/other", headers=auth)).status_code == 404
        info = (await client.get("/v1/info", headers=auth)).json()
        assert info["framework"]["selected"]["framework"] == "fake" and info["runner"]["framework"] == "fake"
        assert info["config"]["server"]["api_key"] == "********" and "sekret" not in json.dumps(info)
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).json() == {"status": "ready"}
        app.state.serving.engine.stop_accepting()
        r = await client.get("/ready")
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"


async def test_probes_before_the_engine_runs_are_503():
    from neuronmodel_runtime.server.app import create_app

    config = make_config()
    app = create_app(make_engine(config), config)  # lifespan not run: the step thread never started
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        health, ready = await client.get("/health"), await client.get("/ready")
        assert health.status_code == 503 and health.json()["error"]["code"] == "engine_dead"
        assert ready.status_code == 503 and "loading" in ready.json()["error"]["message"]
        r = await client.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
