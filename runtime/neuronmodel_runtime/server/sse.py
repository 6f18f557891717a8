"""`EventStream`: a token stream's server-sent-event response, with little between a payload and the socket.

It replaces sse-starlette's response, which cost per response an anyio task group of four tasks and per event a
ServerSentEvent encode (a regex split and a StringIO) and its own send wrappers, a large part of the event loop's
time per streamed token with 64 streams (bench/serving.py host_ms_per_step_b64). What the server used of it stays,
with the same headers and the same bytes: each payload as `data: <payload>\\n\\n` (a payload is one line: JSON
escapes line breaks), a `: ping - <UTC time>` comment every 15 s (proxies close connections that stay silent), the
stream cancelled when the client disconnects (the events' own `finally` then aborts the generation), and `close`
run however the response ends, also when the client left before the first event, so the events never started.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

#: sse-starlette's interval, which the server kept.
PING_INTERVAL_S = 15.0


class EventStream(Response):
    """A response that sends `events` (SSE `data:` payloads) and runs `close` when it ends."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], close: Callable[[], None],
                 ping_interval_s: float = PING_INTERVAL_S):
        # Not Response.__init__, which renders a body: a stream has none (nor a content-length).
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-store", "connection": "keep-alive", "x-accel-buffering": "no"})
        self.events = events
        self.close = close
        self.ping_interval_s = ping_interval_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await self._until_ended_or_gone(receive, send)
        finally:
            self.close()

    async def _until_ended_or_gone(self, receive: Receive, send: Send) -> None:
        streaming = asyncio.ensure_future(self._stream(send))
        watching = asyncio.ensure_future(_disconnect(receive))
        pinging = asyncio.ensure_future(self._ping(send))
        try:
            await asyncio.wait((streaming, watching), return_when=asyncio.FIRST_COMPLETED)
            if streaming.done():
                pinging.cancel()  # before the last message: a ping after it would be refused by the server
                streaming.result()  # the events' error, if any, goes to Starlette's error middleware
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            tasks = (streaming, watching, pinging)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)  # a cancelled stream has run the events' own `finally`

    async def _stream(self, send: Send) -> None:
        async for payload in self.events:
            await send({"type": "http.response.body", "body": b"data: %b\n\n" % payload.encode(), "more_body": True})

    async def _ping(self, send: Send) -> None:
        while True:
            await asyncio.sleep(self.ping_interval_s)
            ping = f": ping - {datetime.now(timezone.utc)}\n\n".encode()
            await send({"type": "http.response.body", "body": ping, "more_body": True})


async def _disconnect(receive: Receive) -> None:
    """Returns once the client has gone."""
    while (await receive())["type"] != "http.disconnect":
        pass
