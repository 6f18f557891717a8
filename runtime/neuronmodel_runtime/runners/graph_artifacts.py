"""What the compiled reference runner keeps as its compiled artifacts (`RuntimeConfig.compile`), and how it tells a
compile from a cache hit.

The artifacts are torch's portable compile-cache artifacts (`torch.compiler.save_cache_artifacts`, scoped to one
runner by `scoped_cache_artifacts`), the C++ kernels those graphs run (`kernels_into` / `install_kernels`), and the
weights converted to the serving dtype (`save_weights` / `load_weights`); `compile_target` names what the generated
code is specialised for, and `compile_counters` counts dynamo compiles and inductor cache hits.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tarfile
from pathlib import Path
from typing import Iterator

import torch

from neuronmodel_runtime.runners.llama import LayerWeights, LlamaConfig, LlamaWeights

# --- compiles and cache hits -----------------------------------------------------------------------------------


def compile_counters() -> dict[str, int]:
    """Process-wide counts of dynamo graph compiles and inductor FX-graph / AOTAutograd cache hits and misses."""
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
        "autograd_cache_hit": int(counters["aot_autograd"]["autograd_cache_hit"]),
        "autograd_cache_miss": int(counters["aot_autograd"]["autograd_cache_miss"]),
    }


def counters_since(before: dict[str, int]) -> dict[str, int]:
    now = compile_counters()
    return {name: now[name] - before.get(name, 0) for name in now}


def compile_target(device: torch.device) -> str:
    """What the generated code is specialised for beyond the device type: the CPU's vector ISA (inductor's C++
    kernels), or the GPU's compute capability. Artifacts made for another one would be cache misses: a compile."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"
    return torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else device.type


# --- the graphs' compile cache and kernels ---------------------------------------------------------------------

#: A C++ kernel in inductor's cache: `<2 characters of its key>/<key>[.main].so`.
_KERNEL = re.compile(r"^[a-z0-9]{2}/[a-z0-9]+(\.[a-z]+)?\.so$")


@contextlib.contextmanager
def kernels_into(path: Path) -> Iterator[None]:
    """Compile inside: in a fresh inductor cache, whose compiled C++ kernels end up in the tar file `path`.

    torch's portable cache artifacts hold the graphs' generated code but not their compiled C++ kernels, which a
    cache hit on another machine would build again (most of a CPU compile's time); these are shipped beside them.
    A fresh cache, so that every kernel the graphs use is built here and lands in the file."""
    from torch._inductor.utils import fresh_cache

    with fresh_cache():
        yield
        root = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        with tarfile.open(path, "w") as tar:
            for kernel in sorted(root.glob("*/*.so")):
                tar.add(kernel, arcname=kernel.relative_to(root).as_posix())


def install_kernels(path: Path) -> int:
    """Put the kernels of the tar file `path` (from `kernels_into`) into this process's inductor cache where they
    are missing, so that the cached graphs load without running the C++ compiler; returns how many it put there.

    Raises:
        ValueError: the file holds something else than kernels.
    """
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = Path(cache_dir())
    installed = 0
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not _KERNEL.match(member.name):
                raise ValueError(f"{path}: {member.name!r} is not a compiled kernel")
            target = root / member.name
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
            source = tar.extractfile(member)
            assert source is not None
            with source, partial.open("wb") as out:
                shutil.copyfileobj(source, out)
            partial.chmod(0o755)
            os.replace(partial, target)  # whole or absent, for a concurrent process
            installed += 1
    return installed


@contextlib.contextmanager
def scoped_cache_artifacts() -> Iterator[None]:
    """Inside, `torch.compiler.save_cache_artifacts()` returns only what was compiled (or loaded) inside: one
    runner's artifacts, not every graph this process ever compiled (a private torch API; without it, all)."""
    try:
        from torch.compiler._cache import CacheArtifactManager
    except ImportError:  # pragma: no cover - older or newer torch
        yield
        return
    with CacheArtifactManager.with_fresh_cache():
        yield


# --- converted weights -----------------------------------------------------------------------------------------

_LAYER_FIELDS = ("input_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up", "down")


def save_weights(path: Path, weights: LlamaWeights) -> None:
    """The fused weights, in their serving dtype, as one safetensors file (a tied LM head is stored once)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {"embed": weights.embed, "norm": weights.norm}
    tied = weights.lm_head is weights.embed
    if not tied:
        tensors["lm_head"] = weights.lm_head
    for i, layer in enumerate(weights.layers):
        for name in _LAYER_FIELDS:
            value = getattr(layer, name)
            if value is not None:
                tensors[f"layers.{i}.{name}"] = value
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path),
              metadata={"tied_lm_head": str(tied).lower(), "layers": str(len(weights.layers))})


def load_weights(path: Path, config: LlamaConfig, device: torch.device, dtype: torch.dtype) -> LlamaWeights:
    """What `save_weights` wrote, onto `device`.

    Raises:
        OSError: unreadable.
        ValueError: the file does not hold this model's weights in `dtype`.
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except OSError:
        raise
    except Exception as exc:  # safetensors' SafetensorError: not a (complete) safetensors file
        raise ValueError(f"{path} is not a safetensors file ({exc})") from exc
    if int(meta.get("layers", -1)) != config.num_layers or tensors["embed"].dtype != dtype:
        raise ValueError(f"{path} holds {meta.get('layers')} layers in {tensors['embed'].dtype}, not "
                         f"{config.num_layers} in {dtype}")
    on = {name: t.to(device) for name, t in tensors.items()}
    layers = [LayerWeights(**{name: on.get(f"layers.{i}.{name}") for name in _LAYER_FIELDS})
              for i in range(config.num_layers)]
    embed = on["embed"]
    head = embed if meta.get("tied_lm_head") == "true" else on["lm_head"]
    return LlamaWeights(embed=embed, layers=layers, norm=on["norm"], lm_head=head)


__all__ = ["compile_counters", "compile_target", "counters_since", "install_kernels", "kernels_into", "load_weights",
           "save_weights", "scoped_cache_artifacts"]
