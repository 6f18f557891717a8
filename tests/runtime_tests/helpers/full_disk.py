"""A volume with little room for the full-disk tests: `SmallVolume(folder, size)`.

Where this process may mount (root with CAP_SYS_ADMIN, as on the development machine), it is a real tmpfs of
`size` bytes mounted on `folder`: every write under it, by this process or its children, fails with the kernel's
ENOSPC once it is full. Elsewhere (CI runners without mounts), ENOSPC is injected at Python's file-write boundary:
`open()` of a file under `folder` for writing gives a file whose writes fail with ENOSPC once the files under
`folder` hold `size` bytes; the CLI runs in a child that installs the same limit first (`command`). Both modes run the
same assertions, so a test never passes on a volume that cannot fill. NEURONMODEL_TEST_FULL_DISK=injected forces
the injected mode (to test it where mounts work).

Run as `python -m runtime_tests.helpers.full_disk FOLDER SIZE ARGS...`: `neuronmodel-runtime ARGS...` with the
injected limit.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

SCRIPT = Path(sys.executable).parent / "neuronmodel-runtime"
TESTS = Path(__file__).resolve().parents[2]
FORCE = "NEURONMODEL_TEST_FULL_DISK"


def _mount(folder: Path, size: int, remount: bool = False) -> bool:
    options = f"{'remount,' if remount else ''}size={size}"
    argv = ["mount", "-o", options, str(folder)] if remount else ["mount", "-t", "tmpfs", "-o", options, "tmpfs",
                                                                  str(folder)]
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def used_bytes(folder: Path) -> int:
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass  # renamed or removed meanwhile
    return total


class _Filling:
    """A file under the limited folder, open for writing: each write stores what still fits, then fails with
    ENOSPC as a full volume's does. Flushed after each write, so the files' sizes are the volume's use."""

    def __init__(self, file: Any, limit: "_Limit") -> None:
        self._file, self._limit = file, limit

    def write(self, data: Any) -> int:
        room = self._limit.room()
        if len(data) > room:
            if room > 0:
                self._file.write(data[:room])
                self._file.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = self._file.write(data)
        self._file.flush()
        return written

    def __enter__(self) -> "_Filling":
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def __iter__(self) -> Any:
        return iter(self._file)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class _Limit:
    """The injected limit: `open` patched for paths under `folder`; shutil's sendfile copy (which writes below
    Python) turned off."""

    def __init__(self, folder: Path, size: int) -> None:
        self.folder, self.size = os.path.abspath(folder), size
        self._open = builtins.open
        self._sendfile = getattr(shutil, "_USE_CP_SENDFILE", False)

    def room(self) -> int:
        return max(self.size - used_bytes(Path(self.folder)), 0)

    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened = self._open(file, mode, *args, **kwargs)
        if isinstance(file, int) or not any(c in mode for c in "wax+"):
            return opened
        if not os.path.abspath(os.fspath(file)).startswith(self.folder + os.sep):
            return opened
        return _Filling(opened, self)

    def install(self) -> None:
        builtins.open = io.open = self.open  # pathlib's Path.open calls io.open
        shutil._USE_CP_SENDFILE = False

    def remove(self) -> None:
        builtins.open = io.open = self._open
        shutil._USE_CP_SENDFILE = self._sendfile


class SmallVolume:
    """`folder` with room for `size` bytes: a tmpfs where it can be mounted, else the injected limit (`mode`)."""

    def __init__(self, folder: Path, size: int) -> None:
        self.folder, self.size = Path(folder), size
        self.folder.mkdir(parents=True, exist_ok=True)
        mounted = os.environ.get(FORCE) != "injected" and _mount(self.folder, size)
        self.mode = "tmpfs" if mounted else "injected"
        self._limit: Optional[_Limit] = None
        if not mounted:
            self._limit = _Limit(self.folder, size)
            self._limit.install()

    def grow(self, size: int) -> None:
        """Give the volume room for `size` bytes."""
        self.size = size
        if self._limit is not None:
            self._limit.size = size
        else:
            assert _mount(self.folder, size, remount=True), f"cannot remount {self.folder} with size={size}"

    def command(self, *args: str) -> list[str]:
        """The argv of `neuronmodel-runtime ARGS...` in a child that sees this volume as full as it is."""
        if self._limit is None:
            return [str(SCRIPT), *args]
        return [sys.executable, "-m", "runtime_tests.helpers.full_disk", str(self.folder), str(self.size), *args]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with the tests folder on PYTHONPATH (the injected mode's child imports this module)."""
        return {**base, "PYTHONPATH": os.pathsep.join([str(TESTS), base.get("PYTHONPATH", "")])}

    def close(self) -> None:
        if self._limit is not None:
            self._limit.remove()
        else:
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True, timeout=10)


def main(argv: list[str]) -> int:
    folder, size, *args = argv
    _Limit(Path(folder), int(size)).install()
    from neuronmodel_runtime import cli

    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
