"""The token streams' SSE response (server/sse.py): sse-starlette's bytes, its pings, and `close` however the
response ends."""

from __future__ import annotations

import asyncio
import re

from neuronmodel_runtime.server.sse import EventStream

#: What sse-starlette 3.7.1's EventSourceResponse (sep="\n", as the server configured it) sent for PAYLOADS.
PAYLOADS = ['{"a":"x\\"y"}', '{"t":"\u2028\u00e9\U0001f600"}', "[DONE]"]
SSE_STARLETTE = [
    {"type": "http.response.start", "status": 200, "headers": [
        (b"cache-control", b"no-store"), (b"connection", b"keep-alive"), (b"x-accel-buffering", b"no"),
        (b"content-type", b"text/event-stream; charset=utf-8")]},
    {"type": "http.response.body", "body": b'data: {"a":"x\\"y"}\n\n', "more_body": True},
    {"type": "http.response.body", "body": b'data: {"t":"\xe2\x80\xa8\xc3\xa9\xf0\x9f\x98\x80"}\n\n',
     "more_body": True},
    {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True},
    {"type": "http.response.body", "body": b"", "more_body": False},
]
#: sse-starlette's ping: a comment with the UTC time.
PING = re.compile(rb": ping - \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{6})?\+00:00\n\n")


class Client:
    """The ASGI server's side: what the response sent, and a disconnect when `leave()` is called."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def leave(self) -> None:
        self.gone.set()


async def respond(response: EventStream, client: Client) -> None:
    await asyncio.wait_for(response({"type": "http", "method": "POST"}, client.receive, client.send), timeout=5)


async def test_the_bytes_match_sse_starlette_and_close_runs_once_the_stream_ends():
    async def events():
        for payload in PAYLOADS:
            yield payload

    closed, client = [], Client()
    await respond(EventStream(events(), lambda: closed.append(True)), client)
    assert client.sent == SSE_STARLETTE and closed == [True]


async def test_an_idle_stream_gets_a_ping_comment():
    async def events():
        await asyncio.sleep(0.25)
        yield "[DONE]"

    client = Client()
    await respond(EventStream(events(), lambda: None, ping_interval_s=0.1), client)
    bodies = [m["body"] for m in client.sent[1:]]
    assert bodies[-2:] == [b"data: [DONE]\n\n", b""] and len(bodies) >= 3
    assert all(PING.fullmatch(body) for body in bodies[:-2]), bodies


async def test_disconnect_before_the_first_event_runs_close():
    async def events():
        await asyncio.Event().wait()  # a choice still waiting for a slot
        yield "never"

    closed, client = [], Client()
    client.leave()
    await respond(EventStream(events(), lambda: closed.append(True)), client)
    assert closed == [True] and [m["type"] for m in client.sent] == ["http.response.start"]


async def test_disconnect_mid_stream_cancels_the_events_and_runs_close():
    ended = []

    async def events():
        try:
            yield "first"
            await asyncio.Event().wait()
            yield "never"
        finally:
            ended.append(True)

    closed, client = [], Client()
    response = asyncio.ensure_future(respond(EventStream(events(), lambda: closed.append(True)), client))
    while not client.sent[1:]:
        await asyncio.sleep(0.01)
    client.leave()
    await response
    assert closed == [True] and ended == [True]
    assert [m.get("body") for m in client.sent[1:]] == [b"data: first\n\n"], "no end of body to a client gone"
