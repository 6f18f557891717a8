"""Tensor parallelism across real processes, through the HTTP API: a group of two (a leader serving HTTP and a
worker, started with LeaderWorkerSet's variables as two pods would be, or one `serve` that starts its host's
second rank itself) answers token for token as one process does: greedy, with per-request seeds, with
concurrent requests, with speculation. Killing the worker ends the leader (status 3) and killing the leader ends
the worker, within seconds; neither hangs. Between the loss and its exit the leader is unready: /ready and new
requests answer 503 while /health stays 200 (its process and step loop live; it exits by itself)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

from runtime_tests.helpers import probe

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
TARGET = ROOT / "tests" / "assets" / "tiny" / "target"
DRAFT = ROOT / "tests" / "assets" / "tiny" / "draft"
PROMPTS = ["def add(a, b):", "Return the", "import os\n", "class Config:", "The function", "for i in range(",
           "if x is None:", "raise ValueError("]
#: The exit status of a rank whose group was lost (distributed/leader.py's EXIT_GROUP_LOST).
GROUP_LOST = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runtime(command: str, *args: str, env: Optional[dict] = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "neuronmodel_runtime.cli", command, "--model", str(TARGET),
                             "--framework", "torch", "--max-num-seqs", "4", "--max-model-len", "256", *args],
                            env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def wait_ready(url: str, procs: list[subprocess.Popen], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[3]} exited {proc.returncode} before the group was ready"
        with contextlib.suppress(httpx.HTTPError):
            if probe.get(url + "/ready", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready in {timeout:.0f} s")


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def two_pods(*args: str) -> Iterator[tuple[str, subprocess.Popen, subprocess.Popen]]:
    """nodes 2, TP 2: the leader pod's `serve` and the worker pod's `worker`, as LeaderWorkerSet starts them."""
    port = free_port()
    lws = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "NEURONMODEL_GROUP_PORT": str(free_port())}
    shape = ("--tensor-parallel-degree", "2", "--nodes", "2", *args)
    leader = runtime("serve", "--port", str(port), *shape, env={**lws, "LWS_WORKER_INDEX": "0"})
    worker = runtime("worker", *shape, env={**lws, "LWS_WORKER_INDEX": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, [leader, worker])
        yield url, leader, worker
    finally:
        stop([leader, worker])


@contextlib.contextmanager
def one_pod(*args: str) -> Iterator[str]:
    port = free_port()
    proc = runtime("serve", "--port", str(port), *args, env={"NEURONMODEL_GROUP_PORT": str(free_port())})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, [proc])
        yield url
    finally:
        stop([proc])


def complete(url: str, prompt: str, **body) -> str:
    body = {"model": "target", "prompt": prompt, "max_tokens": 20, "temperature": 0, **body}
    response = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def answers(url: str, at_once: bool = False, **body) -> list[str]:
    if not at_once:
        return [complete(url, p, **body) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda p: complete(url, p, **body), PROMPTS))


@pytest.fixture(scope="module")
def single() -> Iterator[str]:
    with one_pod() as url:
        yield url


@pytest.fixture(scope="module")
def single_answers(single) -> dict[str, list[str]]:
    return {"greedy": answers(single), "seeded": answers(single, temperature=0.8, top_p=0.95, seed=1234)}


def test_two_pods_answer_as_one_process_greedy_seeded_and_concurrently(single_answers):
    with two_pods() as (url, _, _):
        info = httpx.get(url + "/v1/info").json()
        assert info["runner"]["group"]["world_size"] == 2 and info["runner"]["tensor_parallel"]["world"] == 2
        assert answers(url) == single_answers["greedy"]
        assert answers(url, at_once=True) == single_answers["greedy"], "a batch of 4 slots, refilled"
        assert answers(url, temperature=0.8, top_p=0.95, seed=1234) == single_answers["seeded"], \
            "per-request seeds: the leader samples, as one process does"


def test_one_pod_of_two_ranks_speculates_as_one_process_decodes(single_answers):
    for speculation in (("--speculation-mode", "draft", "--draft-model", str(DRAFT)),
                        ("--speculation-mode", "promptLookup")):
        with one_pod("--tensor-parallel-degree", "2", *speculation) as url:
            assert answers(url, at_once=True) == single_answers["greedy"], speculation


def probes_until_exit(url: str, proc: subprocess.Popen, timeout: float = 15.0) -> list[tuple[int, int, str, int]]:
    """(/ready status, /health status, /ready's error code, a new completion's status) every few milliseconds until
    `proc` exits; a probe that cannot connect (the process is going) ends the list."""
    seen, deadline = [], time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            ready = probe.get(url + "/ready", timeout=2)
            health = probe.get(url + "/health", timeout=2)
            request = probe.post(url + "/v1/completions", json={"model": "target", "prompt": "x", "max_tokens": 1},
                                 timeout=5)
        except httpx.HTTPError:
            break
        code = ready.json()["error"].get("code", "") if ready.status_code != 200 else ""
        seen.append((ready.status_code, health.status_code, code, request.status_code))
        time.sleep(0.02)
    return seen


def test_a_killed_worker_ends_the_leader_and_a_killed_leader_ends_the_worker():
    with two_pods() as (url, leader, worker):
        started = time.monotonic()
        worker.send_signal(signal.SIGKILL)
        seen = probes_until_exit(url, leader)
        assert leader.wait(15) == GROUP_LOST
        assert time.monotonic() - started < 10, "the leader's heartbeat finds the lost worker within seconds"
        lost = [probe for probe in seen if probe[0] != 200]
        assert lost, f"the leader never turned unready before it exited: {seen}"
        assert seen[len(seen) - len(lost):] == lost, "once unready, never ready again"
        assert all(probe == (503, 200, "not_ready", 503) for probe in lost), \
            f"unready (readiness 503, new requests 503) while alive (liveness 200: it exits by itself): {lost}"
        assert all(probe[3] in (500, 503) for probe in seen), f"a request answered without its group: {seen}"
    with two_pods() as (url, leader, worker):
        assert complete(url, "def add(a, b):")
        started = time.monotonic()
        leader.send_signal(signal.SIGKILL)
        assert worker.wait(30) == GROUP_LOST
        assert time.monotonic() - started < 15
