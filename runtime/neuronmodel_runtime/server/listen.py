"""Whether the server can listen where its config says, checked before the (slow) model load."""

from __future__ import annotations

import errno
import socket

from neuronmodel_runtime.config import ConfigError, named


def check_listen_address(host: str, port: int) -> None:
    """Fail before the (slow) model load when the server could not listen on host:port.

    Binds and closes a socket per address, with SO_REUSEADDR as uvicorn binds, so only a port that is really in
    use (or not permitted) fails.

    Raises:
        ConfigError: names server.host or server.port and the fix.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"{named('server.host')}: cannot resolve {host!r} ({exc.strerror}); "
                          "use an address such as 127.0.0.1, or 0.0.0.0 inside a pod") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    raise ConfigError(f"{named('server.port')}: cannot listen on {host}:{port} ({exc.strerror}); "
                                      "stop the process that holds it or choose another port") from None
                raise ConfigError(f"{named('server.host')}: cannot listen on {host}:{port} ({exc.strerror}); "
                                  "use an address of this host, such as 127.0.0.1 or 0.0.0.0") from None
