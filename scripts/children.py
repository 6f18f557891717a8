"""What the setup's and the tests' helper processes share about the children they start."""

from __future__ import annotations

import ctypes
import signal


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the thread that started it dies (even by SIGKILL), also where it runs
    in a session of its own and so hears no Ctrl+C."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
