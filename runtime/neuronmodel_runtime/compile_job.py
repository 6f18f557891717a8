"""`neuronmodel-runtime compile --config FILE`: what the operator's compile Job runs.

A hit (the artifacts are already in `compile_cache.url`) exits 0 at once; a miss compiles, stores and exits 0.
Cold Neuron compiles fail intermittently (a compiler crash, exit 70 under load: aws-neuron-sdk#1369), so a failed
compile is retried with exponential backoff; a configuration error (RunnerError: the message names the setting) is
not, since it would fail the same way. The summary is one JSON line on stdout, for the Job's log.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any, Callable, Optional

from neuronmodel_runtime.config import ConfigError
from neuronmodel_runtime.runners.base import ModelRunner, RunnerError

log = logging.getLogger(__name__)

#: Compile attempts in one Job pod (the Job's own backoffLimit retries the pod on top).
ATTEMPTS = 3
#: Seconds before the second attempt; doubled before each further one.
BACKOFF_S = 30.0


class CompileFailed(RuntimeError):
    """Every attempt failed; the message names the last error."""


def run_compile(make_runner: Callable[[], ModelRunner], attempts: int = ATTEMPTS, backoff_s: float = BACKOFF_S,
                sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Compile (or find) the artifacts of the runner `make_runner` builds; returns the summary.

    Raises:
        RunnerError / ConfigError: a configuration the runner cannot compile (not retried).
        CompileFailed: `attempts` compiles failed.
    """
    delay = backoff_s
    last: Optional[BaseException] = None
    for attempt in range(1, attempts + 1):
        started = time.monotonic()
        runner = make_runner()
        try:
            artifacts = runner.compile()
        except (RunnerError, ConfigError):
            raise
        except Exception as exc:  # the compiler's failures: retried
            last = exc
            log.warning("compile attempt %d of %d failed after %.0f s: %s: %s", attempt, attempts,
                        time.monotonic() - started, type(exc).__name__, exc)
            if attempt < attempts:
                sleep(delay)
                delay *= 2
            continue
        finally:
            runner.shutdown()
        summary: dict[str, Any] = {"framework": runner.framework, "attempts": attempt,
                                   "seconds": round(time.monotonic() - started, 3)}
        if artifacts is None:
            summary["compiled"] = False
            summary["note"] = f"the {runner.framework} runner compiles nothing with this config"
        else:
            summary.update(folder=str(artifacts.folder), **asdict(artifacts.outcome))
        return summary
    raise CompileFailed(f"compile failed {attempts} times; last error: {type(last).__name__}: {last}")


__all__ = ["ATTEMPTS", "BACKOFF_S", "CompileFailed", "run_compile"]
