"""The runtime images: one Dockerfile target per supported base, and which one serves a model. Pure data.

Each Neuron target is FROM an AWS Neuron inference Deep Learning Container (DLC), at the exact tag the runners were
written against; our wheel goes on top without replacing the base's torch, torch-neuronx, neuronx-cc, NxDI / TNx
or transformers (see the Dockerfile). The table here is the one source: the Dockerfile's FROM lines and the
README's table are checked against it (tests/test_images.py).

Sources (aws-neuron/deep-learning-containers @2be9ed1, see ../shared/research/neuron-2026.md §0, §3 and §7):
- the tags: README.md's `pytorch-inference-neuronx` table (SDK 2.25.0, 2.28.0 and 2.31.1 rows); there is no
  2.28.1 image, and SDK 2.32 publishes no `pytorch-inference-neuronx` (NxDI left the DLCs);
- the versions: the ARGs of the Dockerfile each tag is built from (tag 2.25.0:
  docker/pytorch/inference/2.7.0/Dockerfile.neuronx; tags 2.28.0 and 2.31.1:
  pytorch/inference/2.9.0/Dockerfile.neuronx), which match the SDK release manifests.
Why these: NxDI supports inf2/trn1 only up to SDK 2.28 (the 2.29 release notes: "pin to release 2.28"); trn2 takes
the newest SDK that still ships NxDI (2.31.1); transformers-neuronx is last in the SDK 2.25 image.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Optional

#: The operator's environment (the chart sets them); flags of the same meaning are in cli.py.
ENV_RUNTIME_IMAGE_REPOSITORY = "NEURONMODEL_RUNTIME_IMAGE_REPOSITORY"
ENV_RUNTIME_IMAGE_VERSION = "NEURONMODEL_RUNTIME_IMAGE_VERSION"
DEFAULT_REPOSITORY = "ghcr.io/neuronmodel/neuronmodel-runtime"
DISTRIBUTION = "neuronmodel"

DLC = "public.ecr.aws/neuron/pytorch-inference-neuronx"


@dataclass(frozen=True)
class RuntimeImage:
    """One runtime target of the Dockerfile."""

    target: str  # the Dockerfile stage; the image tag is `<version>-<target>`
    base: str  # its FROM, exactly
    sdk: Optional[str]  # the Neuron SDK release of the base (None: no Neuron)
    framework: str  # the runner it is for: nxdi | tnx | torch
    python: str  # the base's Python (major.minor)
    families: tuple[str, ...]  # instance families it serves (torch: any node, Neuron or not)
    nxdi: Optional[str] = None  # neuronx-distributed-inference in the base
    tnx: Optional[str] = None  # transformers-neuronx in the base
    torch_neuronx: Optional[str] = None
    neuronx_cc: Optional[str] = None

    def framework_version(self, framework: Optional[str] = None) -> Optional[str]:
        """The version of `framework` (default: the image's own) in the base; None when it has none."""
        return {"nxdi": self.nxdi, "tnx": self.tnx}.get(framework or self.framework)


#: Every runtime target, in the Dockerfile's order. Families are instance-type prefixes (trn1n and trn2u are in the
#: trn1 and trn2 families of devices.py; they are listed so a prefix looks up too).
IMAGES: tuple[RuntimeImage, ...] = (
    RuntimeImage("runtime-nxdi-sdk2.28", f"{DLC}:2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04", "2.28.0", "nxdi",
                 "3.12", ("inf2", "trn1", "trn1n"), nxdi="0.8.16251", torch_neuronx="2.9.0.2.12.22436",
                 neuronx_cc="2.23.6484.0"),
    RuntimeImage("runtime-nxdi-sdk2.31", f"{DLC}:2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04", "2.31.1", "nxdi",
                 "3.12", ("trn2", "trn2u"), nxdi="0.10.18399", torch_neuronx="2.9.0.2.15.32035",
                 neuronx_cc="2.26.6360.0"),
    RuntimeImage("runtime-tnx-sdk2.25", f"{DLC}:2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04", "2.25.0", "tnx",
                 "3.10", ("inf2", "trn1", "trn1n"), nxdi="0.5.9230", tnx="0.13.1216",
                 torch_neuronx="2.7.0.2.9.9357", neuronx_cc="2.20.9961.0"),
    # The PyTorch reference runner, on CPU: torch from PyPI on an official Python image.
    RuntimeImage("runtime-cpu", "python:3.11-slim-bookworm", None, "torch", "3.11", ()),
)

BY_TARGET = {image.target: image for image in IMAGES}


def image_for(family: Optional[str], framework: str) -> RuntimeImage:
    """The target that serves `framework` (auto | nxdi | tnx | torch) on instance `family` (None: a CPU node).

    torch runs the reference runner on any node. auto is NxDI on every family an NxDI image serves, else TNx.

    Raises:
        LookupError: no image serves that framework on that family (TNx on trn2, say).
    """
    if framework == "torch":
        return next(image for image in IMAGES if image.framework == "torch")
    wanted = ("nxdi", "tnx") if framework == "auto" else (framework,)
    for name in wanted:
        for image in IMAGES:
            if image.framework == name and family in image.families:
                return image
    served = sorted({f for image in IMAGES if image.framework in wanted for f in image.families})
    raise LookupError(f"no runtime image serves framework {framework} on {family or 'a node without Neuron'} "
                      f"(it serves {', '.join(served)})")


def image_ref(repository: str, version: str, target: str) -> str:
    """`<repository>:<version>-<target>`: the tag the release pushes each target under."""
    return f"{repository}:{version}-{target}"


def default_image(family: Optional[str], framework: str, repository: str = DEFAULT_REPOSITORY,
                  version: Optional[str] = None) -> str:
    """The image of a model without spec.image, e.g. `ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-runtime-cpu`.

    `version` defaults to this package's version (the release tags its images with it)."""
    return image_ref(repository, version or package_version(), image_for(family, framework).target)


def package_version() -> str:
    """The installed `neuronmodel` distribution's version (pyproject.toml's)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a bare source tree on sys.path, never an installed operator
        return "0.0.0"


__all__ = ["BY_TARGET", "DEFAULT_REPOSITORY", "DLC", "ENV_RUNTIME_IMAGE_REPOSITORY", "ENV_RUNTIME_IMAGE_VERSION",
           "IMAGES", "RuntimeImage", "default_image", "image_for", "image_ref", "package_version"]
