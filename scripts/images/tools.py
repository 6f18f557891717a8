"""buildah, mmdebstrap and dpkg-dev (images.debhouse) from Debian, and buildah with the project's own storage and runtime.

Installed with `apt-get install -y --no-install-recommends` (after one `apt-get update`) only when missing.
Everything buildah keeps lies under `$NEURONMODEL_CACHE/images/` (never the machine's /var/lib/containers):
`storage/` (images and layers, overlay driver), `runroot/` (its locks and mounts), and the files this module writes
beside them: `registries.conf` (short names resolve to docker.io, so the Dockerfile's `FROM python:...` finds the
local base with `--pull=never`; plain http for 127.0.0.1 registries), `policy.json` (accept any image: all of them
are ours) and `runc` (the OCI runtime buildah runs RUN steps under, see RUNC_WRAPPER).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import debian_packages
from children import die_with_parent
from neuronmodel_runtime.artifacts.folder import install, staging, write_json

#: Debian package -> a command it installs (present: nothing to do).
PACKAGES = {"buildah": "buildah", "mmdebstrap": "mmdebstrap", "runc": "runc", "dpkg-dev": "dpkg-scanpackages"}

#: runc, with process.oomScoreAdj clamped to >= 0 in the bundle's config.json before `create`/`run`: this sandbox
#: forbids lowering oom_score_adj, and runc then fails with "can't get final child's PID from pipe". A no-op where
#: nothing asks for a lower score: buildah 1.28 sets no oomScoreAdj for RUN steps (checked), but a containers.conf
#: `oom_score_adj` would. crun is not used: it fails here (cgroup v1 hybrid layout).
RUNC_WRAPPER = """#!/usr/bin/python3
# Written by scripts/images/tools.py: runc with process.oomScoreAdj clamped to >= 0 (see there).
import json, os, sys
args = sys.argv[1:]
if "create" in args or "run" in args:
    bundle = "."
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            bundle = args[i + 1]
        elif arg.startswith("--bundle="):
            bundle = arg.split("=", 1)[1]
    path = os.path.join(bundle, "config.json")
    if os.path.exists(path):
        with open(path) as f:
            spec = json.load(f)
        process = spec.get("process") or {}
        if process.get("oomScoreAdj", 0) < 0:
            process["oomScoreAdj"] = 0
            with open(path, "w") as f:
                json.dump(spec, f)
os.execv(@RUNC@, ["runc"] + args)
"""

REGISTRIES_CONF = """# Written by scripts/images/tools.py.
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
"""


def cache_dir() -> Path:
    root = os.environ.get("NEURONMODEL_CACHE") or Path.home() / ".cache" / "neuronmodel"
    return Path(root) / "images"


def run(cmd: list[str], *, check: bool = True, capture: bool = True, env: dict | None = None,
        input: str | None = None, cwd: Path | None = None, waited_on: bool = False) -> subprocess.CompletedProcess:
    """`cmd` under `nice` (a build yields to whatever else runs); a failure raises with the end of its stderr.

    waited_on=True, for a step that a test or a user waits on (a push): no `nice`, and a session of its own. Linux
    schedules each session as one group (autogroup, on by default), so inside `make test`'s session a push shared
    one group's CPU with both pytest workers and the 3.12 suite, and under `nice` there it got almost none: the real
    node's push of the 3 GB runtime image took 451 s beside the suites, 65 s alone. It still ends with its parent.
    """
    prefix = [] if waited_on else ["nice", "-n", "10"]
    out = subprocess.run([*prefix, *cmd], env={**os.environ, **(env or {})}, cwd=cwd, input=input, text=True,
                         capture_output=capture, check=False, start_new_session=waited_on,
                         preexec_fn=die_with_parent if waited_on else None)
    if check and out.returncode:
        tail = (out.stderr or "")[-4000:] + (out.stdout or "")[-2000:] if capture else ""
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{tail}")
    return out


def missing_packages() -> list[str]:
    return debian_packages.missing(PACKAGES)


def ensure_packages() -> list[str]:
    """apt-get the missing ones (update first); returns what it installed."""
    return debian_packages.install(PACKAGES, "images")


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    path.chmod(mode)


def configure() -> None:
    """The files buildah is pointed at (idempotent)."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    _write_if_changed(root / "registries.conf", REGISTRIES_CONF)
    _write_if_changed(root / "policy.json", json.dumps({"default": [{"type": "insecureAcceptAnything"}]}) + "\n")
    real = shutil.which("runc") or "/usr/sbin/runc"
    _write_if_changed(root / "runc", RUNC_WRAPPER.replace("@RUNC@", repr(real)), 0o755)


def ensure() -> None:
    with machine_lock():
        ensure_packages()
        configure()


@contextlib.contextmanager
def machine_lock():
    """One caller at a time on this machine (the test suite's workers, `make images`): apt, the base, the wheelhouses
    and buildah's storage are shared; a second caller waits, then finds the work done. Re-entrant in one thread."""
    if getattr(_lock_state, "held", False):
        yield
        return
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _lock_state.held = True
        try:
            yield
        finally:
            _lock_state.held = False


_lock_state = threading.local()


def env() -> dict[str, str]:
    """The environment every buildah call gets: our registries.conf and runtime."""
    root = cache_dir()
    return {"CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"), "BUILDAH_RUNTIME": str(root / "runc"),
            "BUILDAH_ISOLATION": "oci", "TMPDIR": str(tmp_dir())}


def tmp_dir() -> Path:
    """buildah's scratch (its default /var/tmp may be small); emptied by `clean_tmp`."""
    path = cache_dir() / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def buildah(*args: str, check: bool = True, capture: bool = True, input: str | None = None,
            cwd: Path | None = None, waited_on: bool = False) -> subprocess.CompletedProcess:
    root = cache_dir()
    globals_ = ["--root", str(root / "storage"), "--runroot", str(root / "runroot"), "--storage-driver", "overlay",
                "--registries-conf", str(root / "registries.conf")]
    return run(["buildah", *globals_, *args], check=check, capture=capture, env=env(), input=input, cwd=cwd,
               waited_on=waited_on)


def signature_policy() -> list[str]:
    """For the subcommands that take it (from, bud, push, pull, commit)."""
    return ["--signature-policy", str(cache_dir() / "policy.json")]


MANIFEST = "manifest.json"


def files_digest(folder: Path, pattern: str) -> str:
    """sha256 of the names and sizes of `folder`'s files matching `pattern` (a downloaded package never changes
    under its name: wheels and Debian packages both carry their version in it)."""
    names = sorted((p.name, p.stat().st_size) for p in Path(folder).glob(pattern))
    return hashlib.sha256(json.dumps(names).encode()).hexdigest()


def filled_folder(folder: Path, fill: Callable[[Path], dict], siblings: str) -> dict:
    """`folder`'s manifest (MANIFEST inside), made first unless it is there, plus `path`, `cached` and `seconds`.

    A miss: `fill(partial)` fills a fresh staging folder beside `folder` and returns the manifest (with `digest` and
    `bytes`), which is written last; the folder is renamed into place (neuronmodel_runtime.artifacts.folder: complete
    or absent), then the other folders of the cache matching the glob `siblings` (older keys of the same target) are
    removed. A crash leaves only a staging folder (removed by the next build), never a hit.
    """
    folder = Path(folder)
    t0 = time.monotonic()
    manifest = folder / MANIFEST
    cached = manifest.exists()
    if not cached:
        with staging(folder) as partial:
            write_json(partial / MANIFEST, fill(partial))
            install(partial, folder, MANIFEST)
        for old in folder.parent.glob(siblings):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    done = json.loads(manifest.read_text())
    return done | {"path": str(folder), "cached": cached, "seconds": time.monotonic() - t0}


def du(path: Path) -> int:
    """Bytes under `path` (0 when absent), as `du -sb` counts them."""
    if not Path(path).exists():
        return 0
    return int(run(["du", "-sbx", str(path)]).stdout.split()[0])  # -x: not the mounted containers


if __name__ == "__main__":
    ensure()
    print(run(["buildah", "--version"]).stdout.strip())
