"""The Debian packages the setup installs on this machine (`apt-get`, as root), one installer at a time.

`make test`'s setup builds the images and the Kubernetes binaries at once, and each needs packages: buildah and
mmdebstrap (scripts/images/), containerd, runc and the CNI plugins for the real node (scripts/k8s/). `apt-get update`
takes apt's lists lock without waiting (`DPkg::Lock::Timeout` covers only dpkg's own lock), so on a fresh machine
the second installer failed at once: "Could not get lock /var/lib/apt/lists/lock". Each install here takes a
machine-wide file lock first; a second caller waits, then installs only what is still missing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

LOCK = Path("/var/lock/neuronmodel-apt.lock")
#: dpkg's lock may still be held by an apt-get outside this project (unattended upgrades): wait for it that long.
DPKG_LOCK_TIMEOUT_S = 600


def missing(packages: dict[str, str]) -> list[str]:
    """The packages (name -> a command on PATH, or an absolute path they install) whose file is absent."""
    return [name for name, file in packages.items()
            if not (Path(file).exists() if file.startswith("/") else shutil.which(file))]


def install(packages: dict[str, str], who: str) -> list[str]:
    """`apt-get install` the missing ones (`apt-get update` first), under the machine's lock; returns what it
    installed. `who` prefixes the lines it prints."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        todo = missing(packages)
        if not todo:
            return []
        t0 = time.monotonic()
        print(f"{who}: apt-get install {' '.join(todo)}", flush=True)
        wait = ["-o", f"DPkg::Lock::Timeout={DPKG_LOCK_TIMEOUT_S}"]
        for args in (["update", "-qq"], ["install", "-y", "-qq", "--no-install-recommends", *todo]):
            out = subprocess.run(["apt-get", *wait, *args], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                                 capture_output=True, text=True, check=False)
            if out.returncode:
                raise RuntimeError(f"apt-get {' '.join(args)} exited {out.returncode}:\n{out.stderr[-4000:]}")
        still = missing(packages)
        if still:
            raise RuntimeError(f"apt-get installed {' '.join(todo)} but {' '.join(still)} are still missing")
        print(f"{who}: installed {' '.join(todo)} in {time.monotonic() - t0:.0f} s", flush=True)
        return todo
