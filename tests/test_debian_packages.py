"""scripts/debian_packages.py: the setup's image and Kubernetes builds install Debian packages at once, and
`apt-get update` refuses to run beside another (apt's lists lock): a fresh machine's `make test` failed on it.
Here `apt-get` is a stand-in on PATH that fails as apt does when a second one runs, and "installs" a package by
creating the file it names."""

from __future__ import annotations

import concurrent.futures
import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_APT_GET = """#!/usr/bin/env python3
import os, sys, time
lock = os.environ["FAKE_APT_LISTS_LOCK"]
try:
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)
except FileExistsError:
    print("E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1 (apt-get)", file=sys.stderr)
    sys.exit(100)
try:
    time.sleep(0.3)
    if "install" in sys.argv:
        for name in sys.argv[sys.argv.index("--no-install-recommends") + 1:]:
            open(os.path.join(os.environ["FAKE_APT_ROOT"], name), "w").close()
        with open(os.environ["FAKE_APT_LOG"], "a") as log:
            log.write(" ".join(sys.argv[sys.argv.index("--no-install-recommends") + 1:]) + "\\n")
finally:
    os.close(fd)
    os.unlink(lock)
"""


@pytest.fixture
def debian_packages(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT_GET)
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APT_LISTS_LOCK", str(tmp_path / "lists.lock"))
    monkeypatch.setenv("FAKE_APT_ROOT", str(tmp_path))
    monkeypatch.setenv("FAKE_APT_LOG", str(tmp_path / "installed.log"))
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    module = importlib.import_module("debian_packages")
    monkeypatch.setattr(module, "LOCK", tmp_path / "machine.lock")
    return module


def test_two_installers_at_once_both_succeed_and_each_package_is_installed_once(debian_packages, tmp_path):
    images = {"buildah": str(tmp_path / "buildah"), "runc": str(tmp_path / "runc")}
    node = {"containerd": str(tmp_path / "containerd"), "runc": str(tmp_path / "runc")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = [pool.submit(debian_packages.install, packages, who) for packages, who in
                ((images, "images"), (node, "k8s-bin"), (images, "images"), (node, "k8s-bin"))]
        installed = [future.result() for future in done]
    assert sorted(name for names in installed for name in names) == ["buildah", "containerd", "runc"]
    assert debian_packages.missing(images) == debian_packages.missing(node) == []
    assert len((tmp_path / "installed.log").read_text().splitlines()) == 2


def test_a_failed_apt_get_names_its_step_and_apt_s_message(debian_packages, tmp_path):
    (tmp_path / "lists.lock").touch()  # an apt-get outside the project holds the lists lock
    with pytest.raises(RuntimeError, match=r"apt-get update -qq exited 100:\nE: Could not get lock"):
        debian_packages.install({"buildah": str(tmp_path / "buildah")}, "images")


def test_a_package_is_missing_until_its_command_or_file_exists(debian_packages, tmp_path):
    packages = {"python": os.path.basename(sys.executable), "containerd": str(tmp_path / "containerd"),
                "no-such": "neuronmodel-no-such-command"}
    assert debian_packages.missing(packages) == ["containerd", "no-such"]
    (tmp_path / "containerd").touch()
    assert debian_packages.missing(packages) == ["no-such"]
