"""The engine core in its own process (`server.engine_process`): what a client and the kubelet see when it works,
when it dies, when the server dies, and when it cannot load. The everyday path (streaming, seeds, chat, the
SIGTERM drain) runs in test_server_live.py::test_cli_server_on_a_real_model[tiny-engine-process]."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest

from runtime_tests.helpers import probe
from runtime_tests.helpers.fakes import ChatByteTokenizer, make_config
from runtime_tests.server.test_server_live import TINY, _free_port, server_process, wait_until
from neuronmodel_runtime.engine.core_client import EngineCoreClient, EngineCoreFailed
from neuronmodel_runtime.server.app import create_app

TESTS = Path(__file__).resolve().parents[2]
FAKE_ENGINE = "runtime_tests.helpers.core_fakes:echo_engine"
pytestmark = pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="no tiny test model (make tiny-models)")


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def serve_command(tmp_path: Path, port: int, model: Path = TINY, **server) -> list[str]:
    config = {"model": str(model), "framework": "torch", "max_num_seqs": 4, "max_model_len": 1024,
              "max_context_length": 128, "server": {"port": port, "engine_process": True, **server}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return [sys.executable, "-m", "neuronmodel_runtime.cli", "serve", "--config", str(tmp_path / "config.json")]


LONG = {"prompt": "Once upon a time", "max_tokens": 120, "temperature": 1, "ignore_eos": True, "stream": True}
DRAINED_TOKENS = 900  # the Ctrl+C test's requests: seconds of decoding, in flight when Ctrl+C lands


def test_a_killed_engine_process_ends_the_stream_with_an_error_and_the_server_exits_1(tmp_path):
    port = _free_port()
    with server_process(serve_command(tmp_path, port), port, startup_timeout=120) as (url, proc):
        (core,) = children(proc.pid)
        with httpx.stream("POST", f"{url}/v1/completions", json=LONG, timeout=30) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))  # in flight
            os.kill(core, signal.SIGKILL)
            rest, deadline = "", time.monotonic() + 30  # an idle stream gets a ping every 15 s: never a timeout
            for line in lines:
                rest += line + "\n"
                if time.monotonic() > deadline:
                    break
        assert "the engine process exited unexpectedly (signal SIGKILL)" in rest, rest
        assert proc.wait(timeout=30) == 1
        assert "failing 1 request(s) in flight" in proc.stdout.read()


def test_the_engine_process_dies_with_the_server(tmp_path):
    port = _free_port()
    with server_process(serve_command(tmp_path, port), port, startup_timeout=120) as (url, proc):
        (core,) = children(proc.pid)
        proc.kill()
        proc.wait()
        wait_until(lambda: gone(core), timeout=5, what="the engine process gone with its server")


def test_ctrl_c_to_the_whole_process_group_still_drains_in_flight_requests(tmp_path):
    """Ctrl+C reaches every process of the terminal's group: the core ignores it, so the front's drain completes
    what is in flight."""
    port = _free_port()
    # The drain waits as long as the requests take on a machine busy with other suites (900 tokens took over the
    # default 30 s once beside them).
    command = serve_command(tmp_path, port, drain_timeout_s=300)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(url, proc), timeout=120, what="server ready")

        async def two_requests():
            """Both streamed, Ctrl+C once each has its first token (a fixed wait could find them done). Each asks
            for 900 tokens (seconds of decoding): 120 took a fraction of a second, which a busy machine's late
            first read could miss, and a request done before Ctrl+C proves nothing of the drain."""
            started = [asyncio.Event(), asyncio.Event()]
            async with httpx.AsyncClient(timeout=60) as client:
                async def one(started):
                    body = {**LONG, "max_tokens": DRAINED_TOKENS, "stream_options": {"include_usage": True}}
                    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                        events = []
                        async for line in response.aiter_lines():
                            if line.startswith("data: "):
                                events.append(line[len("data: "):])
                                started.set()
                        return response.status_code, events
                tasks = [asyncio.ensure_future(one(event)) for event in started]
                await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), timeout=60)
                os.killpg(proc.pid, signal.SIGINT)
                return await asyncio.gather(*tasks)

        responses = asyncio.run(two_requests())
        assert [status for status, _ in responses] == [200, 200], responses
        assert all(events[-1] == "[DONE]" for _, events in responses), responses
        assert all(json.loads(events[-2])["usage"]["completion_tokens"] == DRAINED_TOKENS
                   for _, events in responses), \
            [events[-2] for _, events in responses]
        assert proc.wait(timeout=60) == 0
        log = proc.stdout.read()
        assert "draining: 2 request(s) in flight" in log and "drain complete" in log, log[-3000:]
        # The core shares the front's output: a core that Ctrl+C reached has printed its KeyboardInterrupt, also
        # where it had decoded every token before dying (the front then drains what it holds and exits 0)
        assert "KeyboardInterrupt" not in log, log[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _ready(url: str, proc: subprocess.Popen) -> bool:
    assert proc.poll() is None, proc.stdout.read()
    try:
        return probe.get(f"{url}/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_a_model_the_engine_process_cannot_load_is_one_line_and_exit_2(tmp_path):
    model = tmp_path / "broken"
    shutil.copytree(TINY, model)
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    result = subprocess.run(serve_command(tmp_path, _free_port(), model), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"neuronmodel-runtime: {model}/model.safetensors: not a complete safetensors file") \
        and last.endswith("re-download or re-convert the model"), result.stderr  # the core's reason, one line


@asynccontextmanager
async def app_over_core(monkeypatch, config, **build_args) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    core = EngineCoreClient(config.model_dump_json(), tokenizer=ChatByteTokenizer(), model_name="fake-model",
                            max_queue=8, build=FAKE_ENGINE, build_args=build_args)
    app = create_app(core, config)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=30) as client:
            yield client


async def test_health_is_503_while_the_engine_process_makes_no_progress(monkeypatch):
    config = make_config(**{"server.liveness_timeout_s": 0.5})
    async with app_over_core(monkeypatch, config, delay=2.0) as client:
        assert (await client.get("/health")).status_code == 200, "an idle core is not hung"
        request = asyncio.ensure_future(
            client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0}))
        await asyncio.sleep(1.2)  # inside the first 2 s runner call
        r = await client.get("/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stalled", r.text
        done = await request
        assert done.status_code == 200 and done.json()["choices"][0]["text"] == "hi"
        assert (await client.get("/health")).status_code == 200


async def test_a_core_that_fails_to_load_raises_its_own_line(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    with pytest.raises(EngineCoreFailed, match="^no such weights: check the folder$"):
        EngineCoreClient(make_config().model_dump_json(), tokenizer=ChatByteTokenizer(), model_name="fake-model",
                         max_queue=8, build=FAKE_ENGINE, build_args={"fail": "no such weights:\n check the folder"})
    assert time.monotonic() - started < 60


async def test_health_stays_200_while_the_engine_process_steps_for_longer_than_the_timeout(monkeypatch):
    config = make_config(**{"server.liveness_timeout_s": 0.5})
    async with app_over_core(monkeypatch, config, delay=0.1) as client:
        request = asyncio.ensure_future(client.post("/v1/completions", json={
            "prompt": "hi", "max_tokens": 20, "temperature": 1}))
        for _ in range(3):
            await asyncio.sleep(0.5)
            assert (await client.get("/health")).status_code == 200, "each step's outputs are progress"
        assert not request.done()
        assert (await request).json()["usage"]["completion_tokens"] == 20


async def test_the_metrics_count_every_step_of_the_engine_process(monkeypatch):
    """One request of 4 tokens alone: 4 steps with work (a prefill, then 3 decodes), as in one process; the last
    step counts itself after its outputs are out, and the core sends its stats when it goes idle."""
    async with app_over_core(monkeypatch, make_config()) as client:
        def counters(text: str) -> dict[str, float]:
            return {line.split("_total{")[0].removeprefix("neuronmodel:"): float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines() if line.startswith("neuronmodel:") and "_total{" in line}

        before = counters((await client.get("/metrics")).text)
        await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4, "temperature": 0})
        for _ in range(200):
            after = counters((await client.get("/metrics")).text)
            if after["engine_steps"] - before["engine_steps"] >= 4:
                break
            await asyncio.sleep(0.01)
        moved = {name: after[name] - before[name] for name in after}
        assert [moved[n] for n in ("engine_steps", "prefill_calls", "decode_calls", "decode_rows")] == [4, 1, 3, 3]
        assert 0 < moved["runner_seconds"] <= moved["engine_step_seconds"]
