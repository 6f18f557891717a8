"""Framework detection, every branch of the selection rules, and the CLI commands that report and use them."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from neuronmodel_runtime import cli
from neuronmodel_runtime.frameworks import (
    DEVICE_ACCESS_MARKER,
    FrameworkDetection,
    FrameworkError,
    detect_frameworks,
    report,
    select_framework,
)


def host(nxdi=None, tnx=None, torch="2.5.0", devices=()):
    return FrameworkDetection({"nxdi": nxdi, "tnx": tnx, "torch": torch}, {}, list(devices))


def test_auto_prefers_nxdi_then_tnx():
    assert select_framework("auto", host(nxdi="0.4", tnx="0.13")).framework == "nxdi"
    sel = select_framework("auto", host(tnx="0.13.1", devices=["/dev/neuron0"]))
    assert sel.framework == "tnx" and sel.version == "0.13.1" and "end of support" in sel.warnings[0]


def test_auto_falls_back_to_torch_only_without_neuron_devices():
    sel = select_framework("auto", host())
    assert sel.framework == "torch" and sel.warnings and "no Neuron" in sel.reason
    with pytest.raises(FrameworkError, match="Neuron devices.*neither"):
        select_framework("auto", host(devices=["/dev/neuron0"]))
    with pytest.raises(FrameworkError, match="no framework"):
        select_framework("auto", host(torch=None))


@pytest.mark.parametrize("fw, package", [("nxdi", "neuronx-distributed-inference"), ("tnx", "transformers-neuronx")])
def test_explicit_framework_not_installed_names_the_package(fw, package):
    with pytest.raises(FrameworkError, match=package):
        select_framework(fw, host())


def test_explicit_choices():
    assert select_framework("nxdi", host(nxdi="0.4")).warnings == []
    assert select_framework("tnx", host(tnx="0.13")).warnings
    assert select_framework("torch", host(devices=["/dev/neuron0"])).warnings  # deliberate CPU on a Neuron host
    with pytest.raises(FrameworkError, match="torch is not installed"):
        select_framework("torch", host(torch=None))
    with pytest.raises(FrameworkError, match="one of"):
        select_framework("cuda", host())


def test_detection_on_this_machine_uses_lookups_only(tmp_path):
    det = detect_frameworks(device_glob=str(tmp_path / "neuron*"))
    assert det.installed["torch"] and det.installed["nxdi"] is None and det.neuron_devices == []
    (tmp_path / "neuron0").touch()
    assert detect_frameworks(device_glob=str(tmp_path / "neuron*")).neuron_devices == [str(tmp_path / "neuron0")]


def test_report_carries_the_error_instead_of_raising():
    out = report("nxdi", host())
    assert out["selected"] is None and "neuronx-distributed-inference" in out["error"]


def test_info_command_prints_json():
    out = subprocess.run([sys.executable, "-m", "neuronmodel_runtime.cli", "info"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["selected"]["framework"] == "torch" and data["config"]["framework"] == "auto"


def test_explicit_missing_framework_exits_2_with_a_clear_message():
    out = subprocess.run([sys.executable, "-m", "neuronmodel_runtime.cli", "serve", "--framework", "nxdi"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "neuronx-distributed-inference is not installed" in out.stderr


def test_selftest_generates_through_the_real_engine():
    tiny = str(Path(__file__).resolve().parents[1] / "assets" / "tiny" / "target")
    out = subprocess.run([sys.executable, "-m", "neuronmodel_runtime.cli", "selftest", "--model", tiny,
                          "--max-model-len", "256", "--max-context-length", "128", "--tokens", "8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"framework: torch {torch_version()}" and lines[-1] == "selftest passed"
    results = {line.split()[1]: line.split()[0] for line in lines if line.split()[0] in ("pass", "FAIL", "skip")}
    assert results == {"greedy": "pass", "sampled": "pass", "speculation": "skip", "compiled": "skip"}, out.stdout


def torch_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("torch")


def test_missing_model_folder_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "neuronmodel_runtime.cli", "selftest", "--model", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no Hugging Face model folder (config.json)" in out.stderr


def test_report_says_whether_each_installed_release_is_one_the_runners_were_written_against():
    releases = report("auto", host(nxdi="0.9.17334", tnx="0.14.1"), env={})["releases"]
    assert releases["nxdi"] == {"version": "0.9.17334", "release": "2.29", "written_against": True,
                                "known": "0.3-0.10 (SDK 2.23-2.31)", "aws_support": {
                                    "patched": False, "family": None,
                                    "aws_says": "AWS patches no NxDI line before 0.10 (SDK 2.31, the maintenance "
                                                "line) and no new NxDI release is planned"}}
    assert releases["tnx"]["written_against"] is False and releases["tnx"]["release"] is None
    assert releases["tnx"]["aws_support"] is None  # not a line of the table
    assert "torch" not in releases


def test_report_says_whether_aws_patches_the_line_on_this_pods_family():
    maintained = host(nxdi="0.10.18399")
    on = {family: report("auto", maintained, env={"NEURONMODEL_INSTANCE_FAMILY": family})["releases"]["nxdi"]
          for family in ("inf2", "trn2")}
    assert on["inf2"]["aws_support"]["patched"] is True and "maintenance" in on["inf2"]["aws_support"]["aws_says"]
    assert on["trn2"]["aws_support"]["patched"] is False and "2.34" in on["trn2"]["aws_support"]["aws_says"]
    assert report("auto", maintained, env={})["releases"]["nxdi"]["aws_support"]["patched"] is None  # depends


def test_the_neuron_runtime_version_is_read_from_the_dpkg_status_file(tmp_path):
    status = tmp_path / "status"
    status.write_text(
        "Package: aws-neuronx-tools\nStatus: install ok installed\nVersion: 2.22.61.0\n\n"
        "Package: aws-neuronx-runtime-lib\nStatus: install ok installed\nArchitecture: amd64\n"
        "Version: 2.25.57.0-166c7a468\nDescription: Neuron runtime\n with a continuation line: here\n\n"
        "Package: aws-neuronx-collectives\nStatus: deinstall ok config-files\nVersion: 2.25.65.0\n")
    detection = detect_frameworks(lambda mod, dist: None, str(tmp_path / "none*"), str(status))
    assert detection.neuron_runtime == "2.25.57.0-166c7a468"
    assert detect_frameworks(lambda mod, dist: None, str(tmp_path / "none*"), str(tmp_path / "absent")
                             ).neuron_runtime is None


# --- Neuron devices this uid cannot open ----------------------------------------------------------------------

NOBODY = 65534
NXDI_ONLY = {"neuronx_distributed_inference": "0.9.17334"}


@pytest.fixture
def root_only_device():
    """A directory anyone may list holding `neuron0` that only root may open (mode 0600, as containerd creates a
    device node without device_ownership_from_security_context)."""
    folder = Path(tempfile.mkdtemp(prefix="dev-"))
    folder.chmod(0o755)
    device = folder / "neuron0"
    device.touch(mode=0o600)
    device.chmod(0o600 if os.geteuid() == 0 else 0)  # not root: no access for this uid either
    yield device
    shutil.rmtree(folder)


def select_as_nobody(device: Path, requested: str) -> str:
    """Detect and select in a forked child that runs as uid 65534 when this process is root (else as itself): the
    access check really fails there. Returns "selected <framework>" or the error's message."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's result comes back through the pipe
        os.close(read)
        try:
            if os.geteuid() == 0:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            detection = detect_frameworks(lambda mod, dist: NXDI_ONLY.get(mod, "2.5.0" if mod == "torch" else None),
                                          str(device.parent / "neuron*"))
            result = f"selected {select_framework(requested, detection).framework}"
        except FrameworkError as exc:
            result = str(exc)
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        result = pipe.read()
    os.waitpid(child, 0)
    return result


@pytest.mark.parametrize("requested", ["auto", "nxdi"])
def test_a_neuron_device_this_uid_cannot_open_fails_naming_device_uid_and_the_node_fix(root_only_device, requested):
    uid = NOBODY if os.geteuid() == 0 else os.getuid()
    message = select_as_nobody(root_only_device, requested)
    assert message.startswith(f"{DEVICE_ACCESS_MARKER}: cannot open {root_only_device} as uid {uid} gid "), message
    assert "mode 0600" in message or os.geteuid() != 0
    assert "containerd `device_ownership_from_security_context = true` in its CRI plugin config" in message
    assert "Bottlerocket `settings.kubernetes.device-ownership-from-security-context = true`" in message
    assert "\n" not in message


def test_the_torch_runner_does_not_need_the_devices(root_only_device):
    assert select_as_nobody(root_only_device, "torch") == "selected torch"


def test_an_openable_device_is_fine(tmp_path):
    (tmp_path / "neuron0").touch(mode=0o666)
    detection = detect_frameworks(lambda mod, dist: NXDI_ONLY.get(mod), str(tmp_path / "neuron*"))
    assert detection.denied_devices == [] and select_framework("auto", detection).framework == "nxdi"


def test_serve_writes_the_device_error_to_the_termination_message(capsys, monkeypatch, tmp_path):
    """The one stderr line is also the container's termination message, where the operator's status reads it."""
    termination = tmp_path / "termination-log"
    termination.touch()  # the kubelet mounts it; outside a pod it is absent and nothing is written
    monkeypatch.setattr(cli, "TERMINATION_LOG", str(termination))
    denied = FrameworkDetection({"nxdi": "0.9.17334", "tnx": None, "torch": "2.5.0"}, {}, ["/dev/neuron0"],
                                denied_devices=["/dev/neuron0"])
    monkeypatch.setattr(cli, "detect_frameworks", lambda: denied)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        argv = ["serve", "--port", str(sock.getsockname()[1]),
                "--model", str(Path(__file__).resolve().parents[1] / "assets" / "tiny" / "target")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"neuronmodel-runtime: {DEVICE_ACCESS_MARKER}: cannot open /dev/neuron0 as uid ")
    assert termination.read_text() == err
    monkeypatch.setattr(cli, "TERMINATION_LOG", str(tmp_path / "absent"))
    assert cli.main(argv) == 2
    assert not (tmp_path / "absent").exists()
