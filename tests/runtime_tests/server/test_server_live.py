"""A real uvicorn server (on a thread, or as its own process) driven by the official `openai` client and by
clients that disconnect: completions, chat, streaming with usage, n=2, seeds, disconnects, SIGTERM drain."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from runtime_tests.helpers import probe
from runtime_tests.helpers.fakes import MODEL, live_server, make_config
from neuronmodel_runtime.config import default_model_path
from neuronmodel_runtime.runners.cpu_threads import cgroup_cpu_quota

TESTS = Path(__file__).resolve().parents[2]  # tests/: runtime_tests.helpers is imported from there
CHAT = [{"role": "user", "content": "hi"}]


def wait_until(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_openai_client_completions_chat_streaming_n_and_seeds():
    config = make_config(**{"server.api_key": "k-123"})
    with live_server(config) as (url, _, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k-123", max_retries=0)
        assert [m.id for m in client.models.list()] == [MODEL]

        done = client.completions.create(model=MODEL, prompt="hello", temperature=0)
        assert done.choices[0].text == "hello" and done.choices[0].finish_reason == "stop"
        assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (5, 6)

        chat = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=3)
        assert chat.choices[0].message.content == "<us" and chat.choices[0].finish_reason == "length"

        stream = client.chat.completions.create(
            model=MODEL, messages=CHAT, stream=True, n=2, max_tokens=5, temperature=1, seed=11,
            stream_options={"include_usage": True},
        )
        texts, usage = {0: "", 1: ""}, None
        for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
            usage = chunk.usage or usage
        assert all(len(t) == 5 for t in texts.values()) and texts[0] != texts[1]
        assert usage.completion_tokens == 10 and usage.prompt_tokens == len("<user>hi\n<assistant>")

        again = client.chat.completions.create(
            model=MODEL, messages=CHAT, n=2, max_tokens=5, temperature=1, seed=11
        )
        assert [c.message.content for c in again.choices] == [texts[0], texts[1]], "same seed, same text"

        extras = client.completions.create(
            model=MODEL, prompt="abc", max_tokens=4, extra_body={"top_k": 1, "ignore_eos": True, "min_tokens": 4}
        )
        assert extras.choices[0].text == "abc" and extras.usage.completion_tokens == 4

        streamed = client.completions.create(model=MODEL, prompt="xyz", stream=True, temperature=0)
        assert "".join(c.choices[0].text for c in streamed) == "xyz"

        with pytest.raises(openai.BadRequestError, match="top_p must be in"):
            client.completions.create(model=MODEL, prompt="x", top_p=2)
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            client.completions.create(model="other", prompt="x")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()


def aborts_counted(app) -> float:
    for line in app.state.metrics.render().decode().splitlines():
        if line.startswith('vllm:request_success_total{finished_reason="abort"'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_streaming_client_disconnect_aborts_and_frees_the_slot():
    with live_server(delay=0.02) as (url, app, _):
        engine = app.state.serving.engine
        body = {"prompt": "x", "max_tokens": 240, "temperature": 1, "stream": True}  # ~5 s if not aborted
        with httpx.Client(base_url=url) as client:
            with client.stream("POST", "/v1/completions", json=body) as r:
                first = next(r.iter_lines())
                assert first.startswith("data: ") and engine.num_unfinished == 1
        started = time.monotonic()
        wait_until(lambda: engine.num_unfinished == 0 and engine.stats().num_running == 0, what="slot freed")
        assert time.monotonic() - started < 2
        wait_until(lambda: aborts_counted(app) == 1, what="abort counted")
        assert not app.state.serving._live


def test_non_streaming_client_disconnect_aborts_and_frees_the_slot():
    with live_server(delay=0.02) as (url, app, _):
        engine = app.state.serving.engine
        host, port = url.removeprefix("http://").split(":")
        payload = json.dumps({"prompt": "x", "max_tokens": 240, "temperature": 1}).encode()
        conn = socket.create_connection((host, int(port)))
        conn.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
        )
        wait_until(lambda: engine.stats().num_running == 1, what="request running")
        conn.close()
        started = time.monotonic()
        wait_until(lambda: engine.num_unfinished == 0 and engine.stats().num_running == 0, what="slot freed")
        assert time.monotonic() - started < 2
        wait_until(lambda: not app.state.serving._live and aborts_counted(app) == 1, what="generation closed")


def test_disconnect_while_waiting_for_a_slot_leaves_the_queue():
    with live_server(make_config(max_num_seqs=1), delay=0.02) as (url, app, _):
        engine = app.state.serving.engine
        results = {}
        busy = _post_in_background(url, {"prompt": "x", "max_tokens": 40, "temperature": 1}, results, "busy")
        wait_until(lambda: engine.stats().num_running == 1, what="slot taken")
        with httpx.Client(base_url=url) as client:
            body = {"prompt": "y", "max_tokens": 40, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                wait_until(lambda: engine.stats().num_waiting == 1, what="waiting")
        wait_until(lambda: engine.stats().num_waiting == 0 and engine.num_unfinished == 1, what="left the queue")
        busy.join(timeout=10)
        assert results["busy"][0] == 200


def _post_in_background(url, body, results, key, timeout=30.0):
    def run():
        with httpx.Client(base_url=url, timeout=timeout) as client:
            r = client.post("/v1/completions", json=body)
            results[key] = (r.status_code, r.text)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_drain_finishes_in_flight_requests_refuses_new_ones_then_exits():
    with live_server(delay=0.01) as (url, app, server):
        engine = app.state.serving.engine
        results = {}
        threads = [
            _post_in_background(url, {"prompt": "x", "max_tokens": 60, "temperature": 1}, results, "plain"),
            _post_in_background(url, {"prompt": "x", "max_tokens": 60, "temperature": 1, "stream": True},
                                results, "stream"),
        ]
        wait_until(lambda: engine.num_unfinished == 2, what="both in flight")
        server.handle_exit(signal.SIGTERM, None)
        wait_until(lambda: app.state.serving.draining, what="draining")
        with httpx.Client(base_url=url) as client:
            assert client.get("/ready").status_code == 503
            refused = client.post("/v1/completions", json={"prompt": "x"})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        for thread in threads:
            thread.join(timeout=10)
        status, text = results["plain"]
        assert status == 200 and json.loads(text)["choices"][0]["finish_reason"] == "length"
        assert json.loads(text)["usage"]["completion_tokens"] == 60
        status, text = results["stream"]
        assert status == 200 and '"finish_reason":"length"' in text and text.rstrip().endswith("data: [DONE]")
        wait_until(lambda: server.should_exit, what="server exit")


def test_drain_timeout_aborts_what_is_left():
    config = make_config(**{"server.drain_timeout_s": 0.3})
    with live_server(config, delay=0.02) as (url, app, server):
        results = {}
        thread = _post_in_background(url, {"prompt": "x", "max_tokens": 240, "temperature": 1}, results, "slow")
        wait_until(lambda: app.state.serving.engine.num_unfinished == 1, what="in flight")
        server.handle_exit(signal.SIGTERM, None)
        thread.join(timeout=10)
        status, text = results["slow"]
        assert status == 200 and json.loads(text)["choices"][0]["finish_reason"] == "abort"
        wait_until(lambda: server.should_exit, what="server exit")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server_process(cmd: list[str], port: int, startup_timeout: float) -> Iterator[tuple[str, subprocess.Popen]]:
    """A server started as its own process, ready; killed at the end if still running."""
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": path})
    url = f"http://127.0.0.1:{port}"

    def ready():
        try:
            return probe.get(f"{url}/ready", timeout=1).status_code == 200
        except httpx.TransportError:
            assert proc.poll() is None, proc.stdout.read()
            return False

    try:
        wait_until(ready, timeout=startup_timeout, what="server ready")
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def assert_sigterm_drains(proc: subprocess.Popen, url: str, body: dict, requests: int = 4) -> None:
    """Put requests in flight (half streaming), SIGTERM: each completes in full, and the process exits 0."""
    results = {}
    threads = [_post_in_background(url, {**body, "stream": i % 2 == 1}, results, i) for i in range(requests)]

    def in_flight() -> float:
        return _gauge(url, "vllm:num_requests_running") + _gauge(url, "vllm:num_requests_waiting")

    wait_until(lambda: in_flight() == requests, timeout=30, what="requests in flight")
    proc.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(timeout=60)
    assert proc.wait(timeout=60) == 0
    log = proc.stdout.read()
    assert "drain complete" in log, log
    for i in range(requests):
        status, text = results[i]
        assert status == 200 and '"finish_reason":"length"' in text.replace(" ", ""), text


def test_sigterm_drains_in_flight_requests_and_exits_0():
    port = _free_port()
    cmd = [sys.executable, "-m", "runtime_tests.helpers.fake_server", str(port), "0.01"]
    with server_process(cmd, port, startup_timeout=30) as (url, proc):
        assert_sigterm_drains(proc, url, {"prompt": "x", "max_tokens": 50, "temperature": 1})


TINY = TESTS / "assets" / "tiny" / "target"
NO_TINY = pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="no tiny test model (make tiny-models)")
MODELS = [
    pytest.param(TINY, 128, {}, marks=NO_TINY, id="tiny"),
    pytest.param(TINY, 128, {"engine_process": True, "async_scheduling": True}, marks=NO_TINY,
                 id="tiny-engine-process-async-scheduling"),
    pytest.param(default_model_path(), 24, {}, marks=[
        pytest.mark.smollm2, pytest.mark.skipif(not (default_model_path() / "config.json").is_file(),
                                                reason="no embedded default model (make default-model)")],
        id="smollm2"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "drain_tokens", "server"), MODELS)
def test_cli_server_on_a_real_model(tmp_path, model, drain_tokens, server):
    """The real process (`neuronmodel-runtime serve --config`), engine and reference runner (in the server's
    process, or in its engine core process, with each step's text made beside the next step), driven by the openai
    client, then SIGTERM with requests in flight."""
    port = _free_port()
    max_model_len = min(256, json.loads((model / "config.json").read_text()).get("max_position_embeddings", 256))
    config = {"model": str(model), "framework": "torch", "max_num_seqs": 4, "max_model_len": max_model_len,
              "max_context_length": max_model_len // 2,
              "server": {"port": port, "served_model_name": "served", **server}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "neuronmodel_runtime.cli", "serve", "--config", str(tmp_path / "config.json")]
    with server_process(cmd, port, startup_timeout=120) as (url, proc):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["served"]
        # the runner's process (the server's or its engine core) takes every CPU it may use
        quota = cgroup_cpu_quota()
        cpus = len(os.sched_getaffinity(0)) if quota is None else min(len(os.sched_getaffinity(0)), int(quota))
        assert httpx.get(f"{url}/v1/info").json()["cpu_threads"] == max(1, cpus)
        prompt = "Once upon a time"
        greedy = client.completions.create(model="served", prompt=prompt, max_tokens=24, temperature=0)
        assert greedy.choices[0].finish_reason in ("stop", "length") and greedy.usage.completion_tokens <= 24
        streamed = client.completions.create(
            model="served", prompt=prompt, max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(streamed)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == greedy.choices[0].text
        assert chunks[-1].usage.completion_tokens == greedy.usage.completion_tokens

        sampled = dict(model="served", prompt=prompt, max_tokens=16, temperature=1.0, top_p=0.9, n=2, seed=5)
        first = [c.text for c in client.completions.create(**sampled).choices]
        assert [c.text for c in client.completions.create(**sampled).choices] == first, "seeded: reproducible"

        chat_template = (model / "chat_template.jinja").is_file() or "chat_template" in json.loads(
            (model / "tokenizer_config.json").read_text()
        )
        messages = [{"role": "user", "content": "Hello"}]
        if chat_template:
            chat = client.chat.completions.create(model="served", messages=messages, max_tokens=8, temperature=0)
            assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 8
        else:
            with pytest.raises(openai.BadRequestError, match="chat template"):
                client.chat.completions.create(model="served", messages=messages, max_tokens=8)
        with pytest.raises(openai.BadRequestError, match="max_context_length"):
            client.completions.create(model="served", prompt=list(range(1, max_model_len)), max_tokens=1)

        assert_extreme_rows_never_fail_normal_rows(url, prompt)

        body = {"prompt": prompt, "max_tokens": drain_tokens, "temperature": 1, "ignore_eos": True}
        assert_sigterm_drains(proc, url, body)


def assert_extreme_rows_never_fail_normal_rows(url: str, prompt: str) -> None:
    """Hostile and extreme-but-valid rows, sent together with normal rows into the same batches: each hostile one
    is a 400 naming its field, each extreme one a 200, and every normal row gets exactly its greedy output."""
    base = {"prompt": prompt, "max_tokens": 8}
    expected = httpx.post(f"{url}/v1/completions", json={**base, "temperature": 0}, timeout=60).json()
    hostile = [({"temperature": 1e39}, "temperature"), ({"repetition_penalty": 1e-30}, "repetition_penalty"),
               ({"logit_bias": {"1": 1e39}}, "logit_bias"), ({"stop_token_ids": [10**9]}, "stop_token_ids")]
    vocab = [1, 2, 3, 50, 60, 70]
    extreme = [{"temperature": 1e-45}, {"top_p": 1e-50, "seed": 1}, {"temperature": 1e-4, "top_k": 5, "seed": 2},
               {"temperature": 3e38, "seed": 3}, {"repetition_penalty": 1e-5, "presence_penalty": 2,
                                                  "frequency_penalty": -2, "seed": 4},
               {"logit_bias": {str(t): 100 for t in vocab}, "min_tokens": 8, "seed": 5},
               {"logit_bias": {str(t): -100 for t in vocab}, "temperature": 0}]
    bodies = [{**base, **b} for b, _ in hostile] + [{**base, **b} for b in extreme] + [{**base, "temperature": 0}] * 4
    results: dict = {}
    threads = [_post_in_background(url, body, results, i, timeout=300) for i, body in enumerate(bodies)]
    for thread in threads:
        thread.join(timeout=300)
    for i, (_, field) in enumerate(hostile):
        status, text = results[i]
        assert status == 400 and json.loads(text)["error"]["param"] == field, text
    for i in range(len(hostile), len(hostile) + len(extreme)):
        status, text = results[i]
        assert status == 200, (bodies[i], text)
    for i in range(len(hostile) + len(extreme), len(bodies)):
        status, text = results[i]
        assert status == 200 and json.loads(text)["choices"][0]["text"] == expected["choices"][0]["text"], text
