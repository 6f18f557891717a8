"""Which model framework serves: detection of what is installed, and the selection rules of DESIGN.md.

`auto` picks NxDI if importable, else TNx, else (only on a host without Neuron devices) the PyTorch reference
runner, with a warning. An explicit framework that is not installed is an error naming the package. Detection
only looks packages up; it never imports them (importing torch-neuronx takes seconds and may touch devices). It
checks that this process may read and write each /dev/neuron* (os.access, no open): a non-root container on a node
whose container runtime keeps device nodes root-owned cannot, and a Neuron framework would fail deep in libnrt.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from neuronmodel_runtime.config import env as env_names
from neuronmodel_runtime.releases import RELEASES, known, release_of, support_facts


#: framework -> (import name, distribution name)
PACKAGES = {
    "nxdi": ("neuronx_distributed_inference", "neuronx-distributed-inference"),
    "tnx": ("transformers_neuronx", "transformers-neuronx"),
    "torch": ("torch", "torch"),
}
#: Other packages whose versions matter for Neuron (reported, and part of the artifact key).
RELATED = {"torch-neuronx": "torch_neuronx", "neuronx-cc": "neuronxcc", "libneuronxla": "libneuronxla",
           "neuronx-distributed": "neuronx_distributed", "transformers": "transformers"}
#: The Neuron runtime (libnrt) is a system package in the Neuron images (apt), not a Python one.
RUNTIME_PACKAGE = "aws-neuronx-runtime-lib"
DPKG_STATUS = "/var/lib/dpkg/status"

#: Starts the message of DeviceAccessDenied; the operator finds it in the container's termination message and
#: reports it as the model's Ready reason (operator status.DEVICE_ACCESS_MARKER).
DEVICE_ACCESS_MARKER = "NeuronDeviceAccessDenied"

NEURON_INSTALL_HINT = (
    "install it in the image from AWS's Neuron pip repository (or use an AWS Neuron Deep Learning Container); "
    "the PyPI package of that name is an empty placeholder"
)


@dataclass(frozen=True)
class FrameworkDetection:
    """What this host offers."""

    installed: dict[str, Optional[str]]  # framework -> version, or None when not importable
    related: dict[str, Optional[str]]  # related package -> version, or None
    neuron_devices: list[str]  # /dev/neuron* paths
    neuron_runtime: Optional[str] = None  # version of the aws-neuronx-runtime-lib system package, if installed
    denied_devices: list[str] = field(default_factory=list)  # those of neuron_devices this process cannot open

    def available(self, framework: str) -> bool:
        return self.installed.get(framework) is not None


@dataclass(frozen=True)
class FrameworkSelection:
    framework: str  # nxdi | tnx | torch
    version: Optional[str]
    reason: str  # why it was chosen, for `info`, /v1/info and the NeuronModel status
    warnings: list[str] = field(default_factory=list)


class FrameworkError(RuntimeError):
    """No usable framework; the message says what to install or change."""


class DeviceAccessDenied(FrameworkError):
    """Neuron devices exist but this uid may not open them; the message names the device, the uid and the fix."""


def _version(import_name: str, dist_name: str) -> Optional[str]:
    if importlib.util.find_spec(import_name) is None:
        return None
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def dpkg_version(status: str, package: str) -> Optional[str]:
    """The installed version of `package` in the text of a dpkg status file, or None."""
    for stanza in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Package") == package and fields.get("Status", "").endswith(" installed"):
            return fields.get("Version")
    return None


def _runtime_version(status_file: str) -> Optional[str]:
    try:
        return dpkg_version(Path(status_file).read_text(errors="replace"), RUNTIME_PACKAGE)
    except OSError:
        return None


def detect_frameworks(
    version_of: Callable[[str, str], Optional[str]] = _version,
    device_glob: str = "/dev/neuron*",
    dpkg_status: str = DPKG_STATUS,
) -> FrameworkDetection:
    devices = sorted(glob.glob(device_glob))
    return FrameworkDetection(
        installed={fw: version_of(mod, dist) for fw, (mod, dist) in PACKAGES.items()},
        related={dist: version_of(mod, dist) for dist, mod in RELATED.items()},
        neuron_devices=devices,
        neuron_runtime=_runtime_version(dpkg_status),
        denied_devices=[device for device in devices if not os.access(device, os.R_OK | os.W_OK)],
    )


def _owner(path: str) -> str:
    try:
        info = os.stat(path)
    except OSError:
        return ""
    return f" ({path} is uid {info.st_uid} gid {info.st_gid} mode {info.st_mode & 0o777:04o})"


def device_access_error(device: str) -> DeviceAccessDenied:
    """The one-line error for a Neuron device this process cannot open: the device, who we are, the node fix."""
    return DeviceAccessDenied(
        f"{DEVICE_ACCESS_MARKER}: cannot open {device} as uid {os.getuid()} gid {os.getgid()}{_owner(device)}: the "
        "node's container runtime gives device nodes to root, not to the pod's runAsUser. Fix the node: containerd "
        "`device_ownership_from_security_context = true` in its CRI plugin config ([plugins.\"io.containerd.grpc.v1."
        "cri\"], containerd 2: [plugins.\"io.containerd.cri.v1.runtime\"]), then restart containerd; Bottlerocket "
        "`settings.kubernetes.device-ownership-from-security-context = true`. See docs/eks.md, NeuronDeviceAccessDenied"
    )


def written_against(detection: FrameworkDetection, family: Optional[str] = None) -> dict[str, dict[str, Any]]:
    """Per installed Neuron framework: its version, the SDK release line the runner was written against for it
    (`release` None: a version the runner was not written against) and whether AWS still patches that line on
    instance `family` (`aws_support`, releases.support_facts)."""
    out: dict[str, dict[str, Any]] = {}
    for framework in RELEASES:
        version = detection.installed.get(framework)
        if version is not None:
            release = release_of(framework, version)
            out[framework] = {"version": version, "release": release.sdk if release else None,
                              "written_against": release is not None, "known": known(framework),
                              "aws_support": support_facts(framework, version, family)}
    return out


TNX_DEPRECATION = (
    "transformers-neuronx (tnx) has reached end of support upstream; it still works here, but move to "
    "neuronx-distributed-inference (framework: nxdi)"
)


def select_framework(requested: str, detection: FrameworkDetection) -> FrameworkSelection:
    """Apply the selection rules; `requested` is RuntimeConfig.framework (auto | nxdi | tnx | torch).

    Raises:
        FrameworkError: an explicit framework is not installed, or a Neuron host has no Neuron framework.
        DeviceAccessDenied: a Neuron framework is selected and a /dev/neuron* cannot be opened by this uid.
    """
    selection = _select(requested, detection)
    if selection.framework in ("nxdi", "tnx") and detection.denied_devices:
        raise device_access_error(detection.denied_devices[0])
    return selection


def _select(requested: str, detection: FrameworkDetection) -> FrameworkSelection:
    installed = detection.installed
    if requested in ("nxdi", "tnx"):
        if not detection.available(requested):
            raise FrameworkError(
                f"framework {requested!r} was requested but {PACKAGES[requested][1]} is not installed: "
                + NEURON_INSTALL_HINT
            )
        warnings = [TNX_DEPRECATION] if requested == "tnx" else []
        return FrameworkSelection(requested, installed[requested], "requested explicitly", warnings)
    if requested == "torch":
        if not detection.available("torch"):
            raise FrameworkError("framework 'torch' was requested but torch is not installed: pip install torch")
        warnings = []
        if detection.neuron_devices:
            warnings.append("the torch reference runner does not use the Neuron devices of this host")
        return FrameworkSelection("torch", installed["torch"], "requested explicitly", warnings)
    if requested != "auto":
        raise FrameworkError(f"framework must be one of auto, nxdi, tnx, torch; got {requested!r}")
    if detection.available("nxdi"):
        return FrameworkSelection("nxdi", installed["nxdi"], "auto: neuronx-distributed-inference is installed")
    if detection.available("tnx"):
        return FrameworkSelection(
            "tnx", installed["tnx"], "auto: transformers-neuronx is installed, NxDI is not", [TNX_DEPRECATION]
        )
    if detection.neuron_devices:
        raise FrameworkError(
            f"this host has Neuron devices ({', '.join(detection.neuron_devices[:4])}) but neither "
            f"neuronx-distributed-inference nor transformers-neuronx is installed: {NEURON_INSTALL_HINT}. "
            "Refusing to serve on CPU; set framework: torch to do so deliberately."
        )
    if not detection.available("torch"):
        raise FrameworkError("no framework is installed: install torch (reference runner) or a Neuron framework")
    return FrameworkSelection(
        "torch",
        installed["torch"],
        "auto: no Neuron framework and no Neuron device on this host",
        ["serving with the PyTorch reference runner (no Neuron hardware or libraries found)"],
    )


def report(requested: str, detection: FrameworkDetection, env: Mapping[str, str] = os.environ) -> dict:
    """The JSON printed by `neuronmodel-runtime info` and served in /v1/info."""
    out: dict = {"requested": requested, "detected": asdict(detection),
                 "releases": written_against(detection, env.get(env_names.INSTANCE_FAMILY) or None)}
    try:
        out["selected"] = asdict(select_framework(requested, detection))
    except FrameworkError as exc:
        out["selected"] = None
        out["error"] = str(exc)
    return out
