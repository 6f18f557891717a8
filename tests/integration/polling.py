"""`wait`: poll until something is true. The integration tests' one wait (conftest's `wait_until` fixture is it)."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional


def wait(what: str, fn: Callable[[], Any], timeout: float = 60.0, diagnose: Optional[Callable[[], str]] = None,
         period: float = 0.2) -> Any:
    """Call `fn` every `period` seconds until it returns something truthy, and return that.

    Raises:
        TimeoutError: not within `timeout` seconds; the message names `what` and ends with `diagnose()`, the state
            worth seeing (a status, Events, logs), read only then.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = fn()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}" +
                               (f"\n{diagnose()}" if diagnose else ""))
        time.sleep(period)
