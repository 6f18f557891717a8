"""A bounded loopback load generator: `load(url, clients=..., duration_s=..., shapes=...)` runs that many streaming
clients against a server on this machine and returns one `Record` per request.

Each client sends one streaming request after another (a shape drawn from `shapes`, seeded per client) until
`duration_s` has passed, then stops: none starts after the deadline, and those in flight then may run to their
end for `finish_grace_s` more; any still running after that is cut (closed, its record says so), so a run never
outlasts duration_s + finish_grace_s, however the server behaves.
A refused request (429, 503) is followed by a pause of `retry_pause_s` before the client's next one, so refused
clients keep the pressure on without spinning on the machine's cores. The first `disconnect_fraction` of the
clients close every stream of theirs after its first token arrives, as a client that gives up does.

Only loopback URLs are accepted: this is a test and benchmark tool, never a way to load someone else's server.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

import httpx

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class Shape:
    """One kind of request: `route` "chat" (chat/completions, one user message) or "completions"; greedy."""

    route: str
    prompt: str
    max_tokens: int

    def body(self) -> dict:
        common = {"max_tokens": self.max_tokens, "temperature": 0, "stream": True}
        if self.route == "chat":
            return {"messages": [{"role": "user", "content": self.prompt}], **common}
        return {"prompt": self.prompt, **common}


@dataclass
class Record:
    """What one client saw of one request. `status` is None when no HTTP answer came (connection refused or
    reset: `transport_error` says which)."""

    client: int
    shape: Shape
    started_at: float  # time.monotonic() when it was sent
    status: Optional[int] = None
    retry_after: Optional[str] = None
    error: Optional[dict] = None  # the JSON body of a non-200 answer, or a stream's error event
    text: str = ""
    finish_reason: Optional[str] = None
    done: bool = False  # the stream ended with data: [DONE]
    ttft_s: Optional[float] = None
    latency_s: Optional[float] = None
    disconnected: bool = False  # the client closed the stream itself, mid-way
    transport_error: Optional[str] = None


def check_loopback(url: str) -> None:
    """Refuse any URL whose host is not this machine's loopback."""
    host = urlsplit(url).hostname
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"the load generator only targets loopback ({sorted(LOOPBACK_HOSTS)}), not {host!r}")


def load(url: str, *, clients: int, duration_s: float, shapes: list[Shape], disconnect_fraction: float = 0.1,
         seed: int = 0, retry_pause_s: float = 0.1, finish_grace_s: float = 30.0) -> list[Record]:
    """Run the load (blocking) and return every request's record, in the order they ended."""
    check_loopback(url)
    return asyncio.run(_run(url.rstrip("/"), clients, duration_s, shapes, disconnect_fraction, seed,
                            retry_pause_s, finish_grace_s))


async def _run(url: str, clients: int, duration_s: float, shapes: list[Shape], disconnect_fraction: float,
               seed: int, retry_pause_s: float, finish_grace_s: float) -> list[Record]:
    records: list[Record] = []
    deadline = time.monotonic() + duration_s
    disconnectors = math.ceil(clients * disconnect_fraction)
    # A connection per request: a pooled connection that the server closes as idle just when a client picks it
    # up fails that request without any fault of the server's (the keep-alive race), and muddles what is measured.
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=None, limits=limits) as http:  # the cut bounds every request

        async def client(index: int) -> None:
            rng = random.Random(seed * 1_000_003 + index)
            while time.monotonic() < deadline:
                record = Record(index, rng.choice(shapes), time.monotonic())
                cut_in = deadline + finish_grace_s - time.monotonic()
                try:
                    await asyncio.wait_for(_request(http, url, record, index < disconnectors), cut_in)
                except asyncio.TimeoutError:
                    record.transport_error = f"cut: still running {finish_grace_s:g} s after the deadline"
                records.append(record)
                if record.status != 200:
                    await asyncio.sleep(retry_pause_s)

        await asyncio.gather(*(client(i) for i in range(clients)))
    return records


async def _request(http: httpx.AsyncClient, url: str, record: Record, disconnect: bool) -> None:
    """Send one streaming request and fill `record` in."""
    path = "/v1/chat/completions" if record.shape.route == "chat" else "/v1/completions"
    sent = time.monotonic()
    try:
        async with http.stream("POST", url + path, json=record.shape.body()) as response:
            record.status = response.status_code
            record.retry_after = response.headers.get("retry-after")
            if response.status_code != 200:
                body = await response.aread()
                record.error = json.loads(body) if body.startswith(b"{") else {"raw": body.decode(errors="replace")}
            else:
                await _read_events(response, record, sent, disconnect)
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: an event that is not JSON
        record.transport_error = f"{type(exc).__name__}: {exc}"
    finally:
        record.latency_s = time.monotonic() - sent


async def _read_events(response: httpx.Response, record: Record, sent: float, disconnect: bool) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            record.done = True
            return
        event = json.loads(payload)
        if "error" in event:
            record.error = event
            continue
        for choice in event.get("choices") or ():
            piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
            if piece:
                record.text += piece
                if record.ttft_s is None:
                    record.ttft_s = time.monotonic() - sent
            record.finish_reason = choice.get("finish_reason") or record.finish_reason
        if disconnect and record.text and record.finish_reason is None:
            record.disconnected = True  # leaving the `async with` closes the connection mid-stream
            return
