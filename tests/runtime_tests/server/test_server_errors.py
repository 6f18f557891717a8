"""Bad input, auth, back-pressure and failures: each is an OpenAI error body with the right status and `param`,
never a 5xx for bad input, and the server keeps serving afterwards."""

import asyncio
import logging

import pytest

from runtime_tests.helpers.fakes import asgi_client, make_config

C, CHAT = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]

# (path, body, status, param, words the message must contain)
BAD_INPUT = [
    (C, b"{not json", 400, None, "not valid JSON"),
    (C, b"[1, 2]", 400, None, "JSON object"),
    (C, {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens", "integer"),
    (C, {"prompt": "x", "temperature": "hot"}, 400, "temperature", "number"),
    (C, {"prompt": "x", "n": 1.5}, 400, "n", "integer"),
    (C, {"prompt": "x", "seed": "s"}, 400, "seed", "integer"),
    (C, {"prompt": "x", "seed": 2**70}, 400, "seed", "seed"),
    (C, {"prompt": 5}, 400, "prompt", "prompt must be a string"),
    (C, {"prompt": "x", "model": "gpt-4"}, 404, "model", "'gpt-4' does not exist; this server serves 'fake-model'"),
    (C, {"max_tokens": 5}, 400, "prompt", "prompt is required"),
    (C, {"prompt": ""}, 400, "prompt", "empty"),
    (C, {"prompt": []}, 400, "prompt", "empty"),
    (C, {"prompt": [300]}, 400, "prompt", "vocabulary"),
    (C, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "max_tokens must be in [1, 256]"),
    (C, {"prompt": "x", "max_tokens": -3}, 400, "max_tokens", "max_tokens"),
    (C, {"prompt": "x", "max_tokens": 10**6}, 400, "max_tokens", "max_model_len"),
    (C, {"prompt": "x" * 129}, 400, "prompt", "129 tokens; this server accepts at most 128"),
    (C, {"prompt": ["ok", "x" * 129]}, 400, "prompt[1]", "129 tokens"),
    (C, {"prompt": "x" * 100, "max_tokens": 200}, 400, "max_tokens", "(100 tokens) + max_tokens (200) exceeds max_model_len (256)"),
    (C, {"prompt": "x", "temperature": -0.5}, 400, "temperature", ">= 0"),
    (C, {"prompt": "x", "top_p": 0}, 400, "top_p", "(0, 1]"),
    (C, {"prompt": "x", "top_p": 1.5}, 400, "top_p", "(0, 1]"),
    (C, {"prompt": "x", "top_k": -2}, 400, "top_k", "-1"),
    (C, {"prompt": "x", "top_k": 257}, 400, "top_k", "<= 256"),
    (C, {"prompt": "x", "n": 0}, 400, "n", "[1, 16]"),
    (C, {"prompt": "x", "n": 1000}, 400, "n", "[1, 16]"),
    (C, {"prompt": "x", "stop": 5}, 400, "stop", "string or a list of strings"),
    (C, {"prompt": "x", "stop": ["a", 1]}, 400, "stop", "string or a list of strings"),
    (C, {"prompt": "x", "min_tokens": 20, "max_tokens": 10}, 400, "min_tokens", "min_tokens"),
    (C, {"prompt": "x", "logprobs": 1}, 400, "logprobs", "samples on the device"),
    (C, {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", "stream: true"),
    (CHAT, {"model": "fake-model"}, 400, "messages", "messages is required"),
    (CHAT, {"messages": []}, 400, "messages", "must not be empty"),
    (CHAT, {"messages": "hi"}, 400, "messages", "list"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", "'user'"),
    (CHAT, {"messages": [{"content": "hi"}]}, 400, "messages[0].role", "required"),
    (CHAT, {"messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content", "string"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
     400, "messages[0].content[0].type", "'text'"),
    (CHAT, {"messages": [{"role": "assistant", "content": "hi"}]}, 400, "messages", "chat template"),
    (CHAT, {"messages": [{"role": "user", "content": "x" * 200}]}, 400, "messages", "at most 128"),
    (CHAT, {"messages": MSG, "logprobs": True}, 400, "logprobs", "samples on the device"),
    (CHAT, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs", "logprobs: true"),
    (CHAT, {"messages": MSG, "max_completion_tokens": 0}, 400, "max_completion_tokens", "max_completion_tokens must"),
    (CHAT, {"messages": MSG, "max_tokens": 250}, 400, "max_tokens", "exceeds max_model_len"),
]


@pytest.mark.parametrize(("path", "body", "status", "param", "words"), BAD_INPUT)
async def test_bad_input_is_a_4xx_naming_the_field_and_the_server_keeps_serving(path, body, status, param, words):
    async with asgi_client() as (client, _):
        if isinstance(body, bytes):
            r = await client.post(path, content=body, headers={"Content-Type": "application/json"})
        else:
            r = await client.post(path, json=body)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["param"] == param and words in error["message"], error
        assert error["type"] == "invalid_request_error"
        ok = await client.post(C, json={"prompt": "still serving", "temperature": 0})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "still serving"


async def test_null_means_default_and_user_is_accepted():
    async with asgi_client() as (client, _):
        body = {"prompt": "ok", "temperature": 0, "user": "u1", "top_p": None, "n": None, "stop": None}
        r = await client.post(C, json=body)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"


async def test_unknown_route_and_wrong_method_use_the_error_body():
    async with asgi_client() as (client, _):
        r = await client.get("/v1/nothing")
        assert r.status_code == 404 and "/v1/nothing" in r.json()["error"]["message"]
        assert (await client.get(C)).status_code == 405


async def test_api_key_guards_v1_only_and_is_never_logged(caplog):
    caplog.set_level(logging.DEBUG)
    async with asgi_client(make_config(**{"server.api_key": "sekret-key"})) as (client, _):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret-key"}):
            r = await client.post(C, json={"prompt": "x"}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert r.headers["WWW-Authenticate"] == "Bearer"
        r = await client.post(C, content=b"{bad", headers={"Content-Type": "application/json"})
        assert r.status_code == 401, "auth is checked before the body is parsed"
        assert (await client.get("/v1/models")).status_code == 401
        good = {"Authorization": "Bearer sekret-key"}
        assert (await client.post(C, json={"prompt": "x", "max_tokens": 2}, headers=good)).status_code == 200
        for open_path in ("/health", "/ready", "/metrics"):
            assert (await client.get(open_path)).status_code == 200
    assert "sekret-key" not in caplog.text


async def _wait_for(predicate, timeout=5.0):
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_full_queue_answers_429_with_retry_after_and_admits_all_or_nothing():
    config = make_config(max_num_seqs=1, **{"server.max_queue": 1})
    async with asgi_client(config, delay=0.01) as (client, app):
        engine = app.state.serving.engine
        slow = {"prompt": "x", "max_tokens": 30, "temperature": 1}
        running = [asyncio.ensure_future(client.post(C, json=slow)) for _ in range(2)]
        await _wait_for(lambda: engine.num_unfinished == 2)
        r = await client.post(C, json={"prompt": "x"})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error" and "retry" in r.json()["error"]["message"]
        assert [x.status_code for x in await asyncio.gather(*running)] == [200, 200]
        r = await client.post(C, json={"prompt": "x", "n": 3, "max_tokens": 30})
        assert r.status_code == 429, "3 choices do not fit 1 slot + 1 waiting"
        await _wait_for(lambda: engine.num_unfinished == 0)  # the admitted ones were aborted
        assert (await client.post(C, json={"prompt": "x", "max_tokens": 2})).status_code == 200


async def test_not_accepting_or_draining_is_503():
    async with asgi_client() as (client, app):
        app.state.serving.draining = True
        r = await client.post(C, json={"prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
        app.state.serving.draining = False
        app.state.serving.engine.stop_accepting()
        r = await client.post(CHAT, json={"messages": MSG})
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"


async def test_runner_failure_is_500_or_a_stream_error_event_and_the_server_keeps_serving():
    async with asgi_client() as (client, _):
        r = await client.post(C, json={"prompt": "FAIL now"})
        assert r.status_code == 500 and "injected runner failure" in r.json()["error"]["message"]
        r = await client.post(C, json={"prompt": "FAIL now", "stream": True})
        events = [line for line in r.text.splitlines() if line.startswith("data: ")]
        assert '"error"' in events[-2] and "injected runner failure" in events[-2] and events[-1] == "data: [DONE]"
        assert (await client.post(C, json={"prompt": "ok", "temperature": 0})).json()["choices"][0]["text"] == "ok"


async def test_request_timeout_aborts_with_finish_reason_abort():
    config = make_config(**{"server.request_timeout_s": 0.2})
    async with asgi_client(config, delay=0.02) as (client, app):
        r = await client.post(C, json={"prompt": "x", "max_tokens": 200, "temperature": 1})
        choice = r.json()["choices"][0]
        assert r.status_code == 200 and choice["finish_reason"] == "abort" and 0 < len(choice["text"]) < 200
        assert app.state.serving.engine.num_unfinished == 0
