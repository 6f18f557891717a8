"""`get` and `post` for the tests' polling loops (readiness, metrics, drain probes): one HTTP client per process.

`httpx.get` builds a client per call, and each client an SSL context from the CA bundle: 22 ms of CPU per call, even
to a plain-http port that refuses the connection. A loop probing a starting server every 10 ms spent most of a core
that way, beside the very server it waited for: under `make test`, the 3.12 suite's pytest process used 540 CPU-s
(about 130 alone). Through one client a probe costs 0.2 ms. No keep-alive: each probe opens its own connection, as
`httpx.get` did, so a server that restarted is never asked on a connection of its previous life.
"""

from __future__ import annotations

import httpx

_CLIENT = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def get(url: str, **kwargs) -> httpx.Response:
    return _CLIENT.get(url, **kwargs)


def post(url: str, **kwargs) -> httpx.Response:
    return _CLIENT.post(url, **kwargs)
