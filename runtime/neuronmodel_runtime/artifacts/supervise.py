"""The engine of a compile Job under watch: `python supervise.py HANDOFF -- vllm serve ...`.

Engine vllm's compile Job runs AWS's vLLM Neuron image, which has python but none of our code, beside our runtime's
`artifacts store` container. `neuronmodel-runtime artifacts supervisor PATH` (an init container) copies this file
into the pod's /tmp emptyDir, which both containers mount, and the vLLM container runs it with the image's python
(3.10 to 3.14; the standard library only). It starts the command as its child and:

- the child exits on its own (a flag vLLM refuses, a compiler error, too little memory): it writes HANDOFF/exited.json
  with the child's status, so that `artifacts store` stops waiting for a health URL that never answers, and exits
  with that status. The pod fails (restartPolicy Never), the Job counts the failure and retries under its
  backoffLimit, and the container's termination message is vLLM's last log lines (FallbackToLogsOnError), followed
  by the one line this prints;
- `artifacts store` writes HANDOFF/stored (stored, or failed for a reason of its own): it stops the child with
  SIGTERM (SIGKILL after STOP_GRACE_S) and exits 0, so the pod ends with the store container's status;
- SIGTERM or SIGINT (the kubelet stopping the pod): passed on to the child, then its status is this process's.

It also writes HANDOFF/engine.json before it starts the child: whether the image has vLLM Neuron's plugin
(`vllm_neuron`), whose compiled graphs are NEFFs (`artifacts store` checks the native line's folder holds some).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ENGINE = "engine.json"
EXITED = "exited.json"
STORED = "stored"
#: How often the child's exit and the store's marker are looked at.
POLL_S = 0.5
#: How long the child may take to exit after SIGTERM once its folder is stored.
STOP_GRACE_S = 60.0


def write_json(path: Path, value: dict) -> None:
    """`value` at `path`, whole or not at all (renamed into place)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def _status(code: int) -> int:
    """A child's returncode as a shell reports it (-N, killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


def supervise(handoff: Path, command: list[str]) -> int:
    """Run `command` under the protocol above; returns this process's exit status."""
    handoff.mkdir(parents=True, exist_ok=True)
    write_json(handoff / ENGINE, {"neuron_plugin": importlib.util.find_spec("vllm_neuron") is not None})
    child = subprocess.Popen(command)
    signalled: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        signalled.append(signum)
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            code = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if (handoff / STORED).exists() and not signalled:
            child.terminate()
            try:
                child.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            print(f"neuronmodel: {command[0]} stopped: its compiled folder is stored", file=sys.stderr, flush=True)
            return 0
    if signalled:
        return _status(code)
    status = _status(code) or 1  # exiting before its folder is stored is a failure, whatever the status
    write_json(handoff / EXITED, {"status": status})
    print(f"neuronmodel: {' '.join(command[:2])} exited with status {_status(code)} before its compiled folder was "
          "stored (the lines above say why)", file=sys.stderr, flush=True)
    return status


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: supervise.py HANDOFF -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    return supervise(Path(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
