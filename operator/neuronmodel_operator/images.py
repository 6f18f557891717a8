"""The runtime images: one Dockerfile target per supported base, which one serves a model by default, and whether AWS
still patches the line an image is on. Pure data and pure functions.

Each Neuron target is FROM an AWS Neuron inference Deep Learning Container (DLC), at the exact tag the runners were
written against; our wheel goes on top without replacing the base's torch, torch-neuronx, neuronx-cc, NxDI / TNx
or transformers (see the Dockerfile). The table here is the one source: the Dockerfile's FROM lines and the
README's table are checked against it (tests/test_images.py).

Sources (aws-neuron/deep-learning-containers @2be9ed1, see ../shared/research/neuron-2026.md §0, §3, §7 and §8, and
vllm-neuron.md §0-§1):
- the tags: README.md's `pytorch-inference-neuronx` table (SDK 2.25.0, 2.28.0 and 2.31.1 rows); there is no
  2.28.1 image, and SDK 2.32 publishes no `pytorch-inference-neuronx` (NxDI left the DLCs);
- the versions: the ARGs of the Dockerfile each tag is built from (tag 2.25.0:
  docker/pytorch/inference/2.7.0/Dockerfile.neuronx; tags 2.28.0 and 2.31.1:
  pytorch/inference/2.9.0/Dockerfile.neuronx), which match the SDK release manifests.

Why these, and which is the default (`RuntimeImage.default`; the others serve only a model whose spec.image names
them):
- NxDI on inf2, trn1 and trn2: SDK 2.31.1 (NxDI 0.10.18399), the last image with NxDI and the line AWS keeps in
  maintenance (critical and security fixes) on inf2/trn1. The sources conflict here: NxDI's 2.29 release notes said
  NxDI models "are now only supported on Trn2 and newer hardware ... pin to release 2.28" for inf2/trn1; the
  maintenance announcement of 2.30 and its 2026-10-16 update (announce-eos-nxdi-nxd-core-inference) keep NxDI and
  NxD Core in maintenance on inf2/trn1 at SDK 2.31, as aws-neuron-sdk#1322 does, the 2.29 wording being about NKI
  *kernels* on NeuronCore-v2 (dropped for inf2/trn1 from 2.29; neuron-2026.md §8), and the DLC README lists inf2
  for the 2.29-2.31 images. The default follows the later statements: the maintenance line, the only NxDI line AWS
  still patches.
- NxDI on inf2/trn1 at SDK 2.28 (NxDI 0.8.16251): kept, not a default, for models that need NKI kernels on
  NeuronCore-v2 (2.28 is the last release with them on inf2/trn1). AWS no longer patches it, and its Neuron runtime
  (2.30) is older than Neuron driver 2.29 accepts (runtime 2.33 or later, or `nrt_init()` fails): run it only on
  nodes whose driver is older than 2.29.
- trn2: from SDK 2.34 (2026-11-30) AWS supports no NxDI on trn2/trn3 (vLLM Neuron is the supported stack there); the
  operator keeps serving NxDI on trn2 from the 2.31.1 image, and warns (resolve.py).
- transformers-neuronx is last in the SDK 2.25 image (end of support 2025-09-16).
What AWS says about each line is in the runtime's release table (neuronmodel_runtime/releases.py: pure data, the
one table both sides read); `support` applies it to an image.

Engine vllm (api.NeuronModelSpec.engine) runs AWS's vLLM Neuron images as they are, one per instance family
(`VLLM_IMAGES`, `vllm_image_for`): they are not Dockerfile targets, and the README's Engines table lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Literal, Optional

from neuronmodel_operator import devices
from neuronmodel_runtime.releases import Support, support_of

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
    default: bool = True  # the operator's choice for `framework` on `families`; False: only through spec.image
    use: Optional[str] = None  # what a non-default image is kept for, and its caveats (messages, the README)

    def framework_version(self, framework: Optional[str] = None) -> Optional[str]:
        """The version of `framework` (default: the image's own) in the base; None when it has none."""
        return {"nxdi": self.nxdi, "tnx": self.tnx}.get(framework or self.framework)


#: Every runtime target, in the Dockerfile's order. Families are instance-type prefixes (trn1n and trn2u are in the
#: trn1 and trn2 families of devices.py; they are listed so a prefix looks up too).
IMAGES: tuple[RuntimeImage, ...] = (
    RuntimeImage("runtime-nxdi-sdk2.28", f"{DLC}:2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04", "2.28.0", "nxdi",
                 "3.12", ("inf2", "trn1", "trn1n"), nxdi="0.8.16251", torch_neuronx="2.9.0.2.12.22436",
                 neuronx_cc="2.23.6484.0", default=False,
                 use="NKI kernels on NeuronCore-v2, which NxDI has only up to SDK 2.28 on inf2/trn1; its Neuron "
                 "runtime 2.30 needs nodes with a Neuron driver older than 2.29"),
    RuntimeImage("runtime-nxdi-sdk2.31", f"{DLC}:2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04", "2.31.1", "nxdi",
                 "3.12", ("inf2", "trn1", "trn1n", "trn2", "trn2u"), nxdi="0.10.18399",
                 torch_neuronx="2.9.0.2.15.32035", neuronx_cc="2.26.6360.0"),
    RuntimeImage("runtime-tnx-sdk2.25", f"{DLC}:2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04", "2.25.0", "tnx",
                 "3.10", ("inf2", "trn1", "trn1n"), nxdi="0.5.9230", tnx="0.13.1216",
                 torch_neuronx="2.7.0.2.9.9357", neuronx_cc="2.20.9961.0"),
    # The PyTorch reference runner, on CPU: torch from PyPI on an official Python image.
    RuntimeImage("runtime-cpu", "python:3.11-slim-bookworm", None, "torch", "3.11", ()),
)

BY_TARGET = {image.target: image for image in IMAGES}


def image_for(family: Optional[str], framework: str) -> RuntimeImage:
    """The default target for `framework` (auto | nxdi | tnx | torch) on instance `family` (None: a CPU node).

    torch runs the reference runner on any node. auto is NxDI on every family an NxDI image serves, else TNx. Only
    `default` images are chosen; the others serve a model whose spec.image names them.

    Raises:
        LookupError: no image serves that framework on that family (TNx on trn2, say).
    """
    if framework == "torch":
        return next(image for image in IMAGES if image.framework == "torch")
    wanted = ("nxdi", "tnx") if framework == "auto" else (framework,)
    for name in wanted:
        for image in IMAGES:
            if image.default and image.framework == name and family in image.families:
                return image
    served = sorted({f for image in IMAGES if image.default and image.framework in wanted for f in image.families})
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


def target_of(ref: str) -> Optional[RuntimeImage]:
    """The table's image an image reference is, or None: a tag `<target>` or `<anything>-<target>` (the release's
    `<version>-<target>`, a mirror's), or the target's DLC base itself; a digest after the tag is ignored."""
    name = ref.split("@", 1)[0]
    if name in {image.base for image in IMAGES}:
        return next(image for image in IMAGES if image.base == name)
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
    return next((image for image in IMAGES if tag == image.target or tag.endswith(f"-{image.target}")), None)


def runs(image: RuntimeImage, framework: str) -> Optional[str]:
    """The library the pods run on `image` for spec.framework `framework`: as the runtime's auto decides (NxDI if
    the image has it, else TNx); None for the reference runner (no Neuron library)."""
    if framework == "torch" or image.sdk is None:
        return None
    if framework != "auto":
        return framework
    return "nxdi" if image.nxdi else image.framework


def family_of(name: Optional[str]) -> Optional[str]:
    """devices.py's family of an instance family or type prefix (trn1n -> trn1, trn2u -> trn2); others unchanged."""
    for instance_type in devices.INSTANCE_TYPES.values():
        if instance_type.name.split(".")[0] == name:
            return instance_type.family.name
    return name


def support(image: RuntimeImage, framework: str, family: Optional[str]) -> Optional[Support]:
    """What AWS says about fixes for the line the pods run on `image` (spec.framework `framework`) on instance
    `family`; None for the reference runner and a library version the release table does not know."""
    library = runs(image, framework)
    if library is None:
        return None
    return support_of(library, image.framework_version(library), family_of(family))


VLLM_DLC = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx"


@dataclass(frozen=True)
class VllmImage:
    """One vLLM Neuron Deep Learning Container: what `engine: vllm` pods run, unchanged (our wheel is not in it).

    The ENTRYPOINT (`vllm_entrypoint.py`) runs its arguments, so a pod passes the whole `vllm serve ...` command as
    the container's args (DLC `common/vllm_entrypoint.py`, vllm-neuron.md §1).
    """

    line: Literal["nxdi", "native"]  # the plugin line: NxDI-based (vllm-neuron 0.2-0.5) or native (>= 0.21)
    tag: str
    sdk: str  # the Neuron SDK release of the image
    vllm: str  # the vLLM release inside (its argument parser is the one tests/operator_tests/test_vllm_args.py uses)
    plugin: str  # vllm-neuron's release (or branch) inside
    python: str
    families: tuple[str, ...]  # instance families (and type prefixes) it serves
    node: str  # what the nodes need: the Neuron driver the image's runtime pairs with

    @property
    def ref(self) -> str:
        return f"{VLLM_DLC}:{self.tag}"


#: The vLLM Neuron image of each instance family (vllm-neuron.md §0-§1; DLC README and Dockerfiles):
#:
#: - native line on trn2 (and trn3, which devices.py has no instance types of yet): vLLM Neuron 0.29.0.1.2.0, SDK
#:   2.33.0 (2026-10-19), the newest tag the research found; from SDK 2.34 the only stack AWS supports there. Ubuntu
#:   26.04 / Python 3.14 inside; the host OS need not match. SDK 2.33 ships Neuron driver 2.31.7; the image's own
#:   runtime version was not read (its Dockerfile was not in the sources). UNVERIFIED: the tag is cited from the
#:   SDK 2.33 docs only (RTD v2.33.0 setup/pytorch/update-dlc); the DLC repository read ends at SDK 2.32, whose
#:   verifiable native image is 0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04 (vLLM 0.24, other flags' parser).
#:   Nothing here pulled it or pinned its digest (docs/eks.md and the README say so).
#: - NxDI line on inf2 and trn1: vLLM 0.16.0 on vllm-neuron release-0.5.3 and NxDI 0.10.18399 (SDK 2.31.1), the
#:   last image with NxDI, which AWS keeps in maintenance on inf2/trn1. Its Neuron runtime is 2.33.10: Neuron driver
#:   2.29 (SDK 2.31) requires runtime 2.33 or later, and runtime 2.32+ refuses drivers 2.26 and older, so run it on
#:   nodes with driver 2.29 or later (SDK `release-notes/components/runtime.rst`). The NxDI 2.29 note that NxDI
#:   models run on trn2 and newer only conflicts with the DLC README, which lists inf2 for these images (§0.4).
VLLM_IMAGES: tuple[VllmImage, ...] = (
    VllmImage("native", "0.29.0.1.2.0-neuronx-py314-sdk2.33.0-ubuntu26.04", "2.33.0", vllm="0.29.0",
              plugin="0.29.0.1.2.0", python="3.14", families=("trn2", "trn2u"),
              node="Neuron driver 2.31 (SDK 2.33's)"),
    VllmImage("nxdi", "0.16.0-neuronx-py312-sdk2.31.1-ubuntu24.04", "2.31.1", vllm="0.16.0", plugin="release-0.5.3",
              python="3.12", families=("inf2", "trn1", "trn1n"),
              node="Neuron driver 2.29 or later (the image's runtime is 2.33.10)"),
)


def vllm_image_for(family: str) -> VllmImage:
    """The vLLM Neuron image of instance `family` (or type prefix): every Neuron family has one.

    Raises:
        LookupError: `family` is not a Neuron family (a CPU node).
    """
    for image in VLLM_IMAGES:
        if family in image.families:
            return image
    raise LookupError(f"no vLLM Neuron image serves {family or 'a node without Neuron'}")


def package_version() -> str:
    """The installed `neuronmodel` distribution's version (pyproject.toml's)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a bare source tree on sys.path, never an installed operator
        return "0.0.0"


__all__ = ["BY_TARGET", "DEFAULT_REPOSITORY", "DLC", "ENV_RUNTIME_IMAGE_REPOSITORY", "ENV_RUNTIME_IMAGE_VERSION",
           "IMAGES", "RuntimeImage", "VLLM_DLC", "VLLM_IMAGES", "VllmImage", "default_image", "family_of", "image_for",
           "image_ref", "package_version", "runs", "support", "target_of", "vllm_image_for"]
