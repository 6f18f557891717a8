"""Every OpenAI / vLLM request field is honoured or refused by name; hostile values are a 400 naming the field.

Runs the real server and engine over the EchoRunner fake (see fakes.py), whose declared capabilities are what the
server enforces: it samples without penalties or logit_bias, so those are refused naming the runner.
"""

from __future__ import annotations

import json

import pytest

from runtime_tests.helpers.fakes import asgi_client, make_config

C, CHAT = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


async def post_raw(client, path, text):
    return await client.post(path, content=text.encode(), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("field", ["temperature", "top_p", "presence_penalty", "frequency_penalty",
                                   "repetition_penalty"])
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
async def test_non_finite_literals_are_a_400_on_every_float_field(field, literal):
    async with asgi_client() as (client, _):
        r = await post_raw(client, C, f'{{"prompt": "x", "{field}": {literal}}}')
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field


@pytest.mark.parametrize("body, param, needle", [
    ({"temperature": 1e39}, "temperature", "float32"),  # finite in JSON, overflows float32
    ({"top_p": 1e-50}, None, None),  # underflows float32 to 0: below SAMPLING_EPS it is greedy (200)
    ({"temperature": 1e-40}, None, None),  # subnormal in float32: greedy (200)
    ({"repetition_penalty": 1e-30}, "repetition_penalty", "[1e-05, 2.0]"),
    ({"logit_bias": {"5": float("1e39")}}, "logit_bias", "float32"),
    ({"logit_bias": {"x": 1}}, "logit_bias", "token ids"),
    ({"stop_token_ids": [10**20]}, "stop_token_ids", None),
    ({"top_k": 10**30}, "top_k", None),
    ({"seed": 2**70}, "seed", None),
    ({"max_tokens": 10**30}, "max_tokens", None),
    ({"n": 10**9}, "n", None),
])
async def test_values_that_do_not_survive_float32_or_ranges(body, param, needle):
    async with asgi_client() as (client, _):
        r = await post_raw(client, C, json.dumps({"prompt": "ab", "max_tokens": 3, **body}))
        if param is None:
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == "ab"  # greedy echo
            return
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and (needle is None or needle in err["message"]), err


@pytest.mark.parametrize("path, field, value, why", [
    (C, "suffix", "end", "suffix"),
    (C, "best_of", 3, "best_of > 1"),
    (CHAT, "response_format", {"type": "json_object"}, "structured output"),
    (CHAT, "tools", [{"type": "function", "function": {"name": "f"}}], "tool calling"),
    (CHAT, "tool_choice", "auto", "tool calling"),
    (C, "guided_json", {"type": "object"}, "structured output"),
    (C, "min_p", 0.1, "min_p"),
    (C, "use_beam_search", True, "beam search"),
    (CHAT, "echo", True, "/v1/completions only"),
    (C, "frobnicate", 1, "unknown field"),
    (CHAT, "temprature", 0.5, "unknown field"),
])
async def test_unimplemented_and_unknown_fields_are_refused_by_name(path, field, value, why):
    async with asgi_client() as (client, _):
        base = {"prompt": "x"} if path == C else {"messages": MSG}
        r = await client.post(path, json={**base, field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and why in err["message"], err


async def test_neutral_values_of_refused_fields_are_accepted():
    async with asgi_client() as (client, _):
        r = await client.post(C, json={"prompt": "ab", "temperature": 0, "best_of": 1, "suffix": None, "min_p": 0,
                                       "use_beam_search": False, "skip_special_tokens": True})
        assert r.status_code == 200, r.text
        r = await client.post(CHAT, json={"messages": MSG, "temperature": 0, "response_format": {"type": "text"},
                                          "tools": [], "tool_choice": "none", "parallel_tool_calls": False})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("body, param", [
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -1}, "frequency_penalty"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"),
    ({"logit_bias": {"5": 3}}, "logit_bias"),
])
async def test_what_the_runner_cannot_honour_is_refused_naming_the_runner(body, param):
    async with asgi_client() as (client, _):
        r = await client.post(C, json={"prompt": "x", **body})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == param and "the fake runner" in err["message"], err
        # neutral values of the same fields pass
        r = await client.post(C, json={"prompt": "x", "presence_penalty": 0, "repetition_penalty": 1})
        assert r.status_code == 200


async def test_logprobs_refusal_names_the_runner_and_the_fix():
    async with asgi_client() as (client, _):
        r = await client.post(CHAT, json={"messages": MSG, "logprobs": True})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "logprobs"
        assert "the fake runner" in err["message"] and "sampling.on_device=false" in err["message"]


async def test_top_k_zero_means_disabled_like_vllm():
    async with asgi_client() as (client, _):
        r = await client.post(C, json={"prompt": "ab", "top_k": 0, "seed": 3, "max_tokens": 4})
        assert r.status_code == 200, r.text


async def test_stop_token_ids_end_generation_and_count_as_stop():
    async with asgi_client() as (client, _):
        r = await client.post(C, json={"prompt": "abcdef", "temperature": 0, "stop_token_ids": [ord("d")]})
        choice = r.json()["choices"][0]
        assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == ("abc", "stop", ord("d"))


async def test_include_stop_str_in_output_keeps_the_stop_string():
    async with asgi_client() as (client, _):
        body = {"prompt": "one two three", "stop": ["two"], "temperature": 0}
        r = await client.post(C, json={**body, "include_stop_str_in_output": True})
        choice = r.json()["choices"][0]
        assert (choice["text"], choice["stop_reason"]) == ("one two", "two")
        r = await client.post(C, json={**body, "stream": True, "include_stop_str_in_output": True})
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert "".join(c["choices"][0]["text"] for c in chunks) == "one two"


async def test_echo_returns_the_prompt_before_the_completion():
    async with asgi_client() as (client, _):
        r = await client.post(C, json={"prompt": "hey", "temperature": 0, "echo": True, "n": 2})
        assert [c["text"] for c in r.json()["choices"]] == ["heyhey", "heyhey"]
        r = await client.post(C, json={"prompt": [[104, 105]], "temperature": 0, "echo": True})
        assert r.json()["choices"][0]["text"] == "hihi"
        r = await client.post(C, json={"prompt": "hey", "temperature": 0, "echo": True, "stream": True})
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert chunks[0]["choices"][0]["text"] == "hey"
        assert "".join(c["choices"][0]["text"] for c in chunks) == "heyhey"
        r = await client.post(C, json={"prompt": "hey", "echo": True, "logprobs": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] in ("echo", "logprobs")


async def test_min_tokens_masks_eos_instead_of_emitting_it():
    """The fake masks EOS like a device would: the output runs past the prompt without an EOS in it."""
    async with asgi_client() as (client, _):
        r = await client.post(C, json={"prompt": "ab", "min_tokens": 4, "max_tokens": 6, "temperature": 0})
        body = r.json()
        assert body["choices"][0]["text"].startswith("ab..") and body["usage"]["completion_tokens"] >= 4


async def test_one_pathological_row_never_fails_the_normal_rows():
    """Hostile rows are refused at admission while normal ones, sent at the same time, all succeed."""
    import asyncio

    async with asgi_client(make_config(), delay=0.01) as (client, _):
        bad = [{"prompt": "x", "temperature": 1e39}, {"prompt": "x", "top_p": 1e-50, "seed": 1},
               {"prompt": "x", "temperature": 1e-45, "top_k": 5}]
        good = [{"prompt": f"row{i}", "temperature": 0, "max_tokens": 8} for i in range(6)]
        replies = await asyncio.gather(*(client.post(C, json=b) for b in bad + good))
        assert replies[0].status_code == 400
        for r, b in zip(replies[3:], good):
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == b["prompt"][:8]


async def test_generation_config_defaults_apply_when_a_request_omits_them(tmp_path):
    """vLLM's default: generation_config.json's temperature / top_p / top_k / repetition_penalty fill omitted fields."""
    import httpx

    from runtime_tests.helpers.fakes import ChatByteTokenizer, EchoRunner, MODEL
    from runtime_tests.helpers.fakes_runner import EOS
    from neuronmodel_runtime.engine.async_engine import AsyncEngine
    from neuronmodel_runtime.engine.engine import Engine
    from neuronmodel_runtime.sampling.defaults import generation_defaults
    from neuronmodel_runtime.server.app import create_app

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.0, "top_p": 0.9, "top_k": 20, "eos_token_id": 2, "min_p": 0.1}))
    defaults = generation_defaults(tmp_path)
    assert defaults == {"temperature": 0.0, "top_p": 0.9, "top_k": 20}  # min_p is not implemented: ignored
    config = make_config()
    engine = Engine(EchoRunner(), ChatByteTokenizer(), {EOS}, 64, sampling_defaults=defaults)
    app = create_app(AsyncEngine(engine, tokenizer=ChatByteTokenizer(), model_name=MODEL, max_queue=8), config)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            r = await client.post(C, json={"prompt": "same"})  # temperature omitted: the default 0 (greedy)
            assert r.json()["choices"][0]["text"] == "same"
            r = await client.post(C, json={"prompt": "same", "temperature": 1.0, "seed": 1, "max_tokens": 4})
            assert r.json()["choices"][0]["text"] != "same"  # explicit wins: sampled letters
            r = await client.post(C, json={"prompt": "x", "top_k": 300})
            assert r.status_code == 400  # a default never hides the request's own bad value


async def test_tokenization_runs_off_the_event_loop():
    """A prompt whose tokenization blocks must not stall the server: /health answers meanwhile (on the event loop
    this would deadlock: the blocked encode would hold the loop the health check needs)."""
    import asyncio
    import threading

    from runtime_tests.helpers.fakes import ChatByteTokenizer

    release = threading.Event()
    original = ChatByteTokenizer.encode

    def slow_encode(self, text, add_special_tokens=True):
        if "SLOW" in text:
            assert release.wait(10), "never released"
        return original(self, text, add_special_tokens)

    ChatByteTokenizer.encode = slow_encode
    try:
        async with asgi_client() as (client, _):
            slow = asyncio.ensure_future(client.post(CHAT, json={"messages": [{"role": "user", "content": "SLOW"}],
                                                                  "temperature": 0, "max_tokens": 2}))
            await asyncio.sleep(0.05)
            health = await asyncio.wait_for(client.get("/health"), 5)
            assert health.status_code == 200 and not slow.done()
            release.set()
            assert (await slow).status_code == 200
    finally:
        ChatByteTokenizer.encode = original
        release.set()


def test_a_greedy_only_runner_refuses_sampled_requests_naming_temperature():
    """NxDI's fused speculation verifies by argmax: such a runner declares sampled=False."""
    from neuronmodel_runtime.sampling.params import SamplingCapabilities, SamplingParams, SamplingParamsError

    caps = SamplingCapabilities("nxdi", max_top_k=64, top_p_rule="drop", sampled=False,
                                fixes={"sampled": "serve without speculation for sampled requests"})
    for greedy in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=1),
                   SamplingParams(temperature=0.8, top_p=1e-6), SamplingParams(temperature=1e-6)):
        assert greedy.validate(caps, max_model_len=64).greedy
    with pytest.raises(SamplingParamsError) as refused:
        SamplingParams(temperature=0.8).validate(caps, max_model_len=64)
    assert refused.value.param == "temperature"
    assert str(refused.value) == ("temperature: the nxdi runner decodes greedily only; "
                                  "serve without speculation for sampled requests")


async def test_the_body_vllms_benchmark_client_sends_streams_its_tokens_and_usage():
    """`vllm bench serve --backend openai --ignore-eos` (bench/serve_sweep.py) posts this body (vLLM 0.32,
    vllm/benchmarks/lib/endpoint_request_func.py, async_request_openai_completions): a neutral
    repetition_penalty and `logprobs: null` are no request for penalties or logprobs, so even a runner without
    penalties serves it. It sends no temperature: both servers sample at their default."""
    body = {"model": "fake-model", "prompt": "abcd", "repetition_penalty": 1.0, "max_tokens": 3, "logprobs": None,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    async with asgi_client() as (client, _):
        r = await post_raw(client, C, json.dumps(body))
        assert r.status_code == 200, r.text
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert len("".join(e["choices"][0]["text"] for e in events if e["choices"])) == 3  # sampled: no temperature
        assert events[-1]["usage"]["completion_tokens"] == 3 and r.text.rstrip().endswith("data: [DONE]")
