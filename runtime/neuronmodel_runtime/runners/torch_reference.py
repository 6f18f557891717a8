"""The PyTorch reference runner: our Llama-family model behind the slot contract, on CPU or a CUDA device.

It is the executable specification of what the Neuron runners do: fixed slots each owning a KV line, the
`[B, 3]` sampling tensor, and sampling inside the runner (token ids out). With `sampling.on_device` false it
copies the full logits to the host (numpy) and samples there with the same processing: the baseline of the
on-device-sampling benchmark, and the only path that would cost the transfer on a real accelerator.

Prefill runs the prompts in groups of similar length, right-padded (one forward per group), and takes the
logits at each row's last real token only. Decode runs every row in one forward, rows sorted by slot so that
consecutive slots read their KV lines as a view instead of a copy.

Speculation (`speculation.mode` draft or promptLookup) is scored: the engine proposes (prompt lookup, or the
draft model this runner loads, `draft_model()`), `score()` runs the target over all k+1 positions in one forward
per distinct k, and the engine verifies on this runner's per-slot generators. Rejected positions need no rollback:
the engine's next position is the source of truth, and every KV position is rewritten before it is read again.

Before sampling, the logits processors (min_tokens mask, logit_bias, penalties) apply to the rows that use them.

With `compile: true` the model runs only as fixed-shape compiled graphs, as Neuron runs it (`compiled_graphs`):
decode over the smallest batch bucket of slots that holds the highest one, with filler rows, one prompt per prefill
call at its context-encoding bucket, the verify graph at `[max_num_seqs, k+1]`, and the draft model's graphs
likewise. They are compiled (and run once) at load, into the artifacts folder with the weights converted to the
serving dtype; a warm start loads both instead of converting the checkpoint, and compiles from torch's cache
artifacts (cache hits, no code generation). Sampling stays outside the graphs, so outputs match eager decoding
(greedy token for token; float32 logits within 1e-4: measured 2e-7 on random tiny checkpoints, 1.5e-5 on the
committed tiny target).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import tarfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from neuronmodel_runtime.artifacts.prepare import ArtifactsError, prepare_artifacts
from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.runners.base import (
    DecodeBatch,
    ModelRunner,
    PrefillBatch,
    RunnerCapabilities,
    RunnerCapacity,
    RunnerError,
    ScoreBatch,
    StepOutput,
    check_slots,
)
from neuronmodel_runtime.runners.checkpoint import build_weights, read_config, read_tensors, resolve_dtype
from neuronmodel_runtime.runners.buckets import cache_length, graph_shapes
from neuronmodel_runtime.runners.compiled_graphs import FixedShapeModel
from neuronmodel_runtime.runners.graph_artifacts import (
    compile_counters,
    compile_target,
    counters_since,
    install_kernels,
    kernels_into,
    load_weights,
    save_weights,
    scoped_cache_artifacts,
)
from neuronmodel_runtime.runners.llama import LlamaConfig, LlamaModel, LlamaWeights
from neuronmodel_runtime.runners.slot_sampler import SlotSampler
from neuronmodel_runtime.runners.tensor_parallel import TensorParallel
from neuronmodel_runtime.runners.torch_weights import WEIGHTS_FILE, checkpoint_weights, rank_shard, stored_shard
from neuronmodel_runtime.runners.vocabulary import vocabulary_mismatch
from neuronmodel_runtime.sampling.params import RowSampling, SamplingCapabilities

log = logging.getLogger(__name__)

#: A prefill group grows while its padded size stays within this factor of its real tokens. Measured on 2 CPU
#: cores with SmolLM2: one right-padded forward of 8-16 short prompts is 30-40% faster than one forward each.
PREFILL_PADDING_BUDGET = 1.25


def prefill_groups(lengths: Sequence[int], budget: float = PREFILL_PADDING_BUDGET) -> list[list[int]]:
    """Row indices grouped by similar length (shortest first); each group is padded to its longest row."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        group = groups[-1] if groups else []
        real = sum(lengths[j] for j in group) + lengths[i]
        if group and lengths[i] * (len(group) + 1) <= budget * real:
            group.append(i)
        else:
            groups.append([i])
    return groups


#: The compiled artifacts (`compile: true`): torch's portable compile-cache artifacts and the graphs' compiled C++
#: kernels (which those do not hold), and the converted weights.
COMPILE_CACHE_FILE = "torch-compile-cache.bin"
KERNELS_FILE = "inductor-kernels.tar"
#: Changes with what the artifacts hold or how the graphs are built, so that older artifacts are never loaded.
ARTIFACTS_FORMAT = 3
COMPILE_WITH_TP = ("compile: true with parallelism.tensor_parallel_degree > 1 is not supported by the torch reference "
                   "runner (its fixed-shape graphs hold no collectives); set compile false")
DRAFT_WEIGHTS_FILE = "draft-weights.safetensors"


class TorchReferenceRunner(ModelRunner):
    """Llama / Mistral / Qwen2 from a Hugging Face folder, served from `config.max_num_seqs` slots."""

    framework = "torch"

    def __init__(self, config: RuntimeConfig, model_path: str, tensor_parallel: Optional[TensorParallel] = None):
        """`tensor_parallel`: this process's rank of a tensor_parallel_degree > 1 group (distributed/); the runner
        then holds that rank's shard (runners/tensor_parallel.py) and the draft model on rank 0 only."""
        self.config = config
        self.tensor_parallel = tensor_parallel
        self.model_path = Path(model_path)
        self.device = torch.device(config.device)
        self.model: Optional[LlamaModel] = None
        self.draft: Optional[LlamaModel] = None  # speculation.mode "draft" only
        spec = config.speculation
        self.speculation_length = spec.num_speculative_tokens if spec.mode in ("draft", "promptLookup") else 0
        # compile: true only: the models behind their compiled graphs, and where those came from
        self.graphs: Optional[FixedShapeModel] = None
        self.draft_graphs: Optional[FixedShapeModel] = None
        # `self.artifacts` (ModelRunner's): the compiled artifacts (compile: true) or this rank's shard
        # (compile_cache.sharded_weights) through the cache
        self.timings: dict[str, float] = {}  # seconds: convert (checkpoint -> serving dtype) or load, compile
        self.graph_cache: dict[str, int] = {}  # compiles and inductor cache hits / misses of this load
        # Host sampling draws on the CPU, so its generators live there.
        self.sampler = SlotSampler(config.sampling.global_top_k,
                                   self.device if config.sampling.on_device else torch.device("cpu"))

    @torch.inference_mode()
    def load(self) -> None:
        cfg = self.config
        tp, group = cfg.parallelism.tensor_parallel_degree, self.tensor_parallel
        if tp != (group.world if group else 1):
            raise RunnerError(f"parallelism.tensor_parallel_degree {tp} on framework torch runs {tp} processes, one "
                              "per rank: `neuronmodel-runtime serve` starts them (and `neuronmodel-runtime worker` on "
                              "each further node); this runner was built for "
                              f"{group.world if group else 1}")
        if group and cfg.compile:
            raise RunnerError(COMPILE_WITH_TP)
        if not self.model_path.is_dir():
            raise RunnerError(f"model folder {self.model_path} does not exist")
        model_config = read_config(self.model_path, cfg.max_model_len)
        if cfg.max_model_len > model_config.max_position_embeddings:
            raise RunnerError(
                f"max_model_len {cfg.max_model_len} exceeds the model's max_position_embeddings "
                f"{model_config.max_position_embeddings}"
            )
        if cfg.speculation.mode == "eagle":
            raise RunnerError(
                "speculation.mode 'eagle' is not supported by the torch reference runner (the NxDI and TNx runners "
                "take it); use 'draft' or 'promptLookup', or framework nxdi"
            )
        if cfg.compile_cache.sharded_weights and group is None:
            log.warning("compile_cache.sharded_weights has no effect on the torch reference runner with one process "
                        "(nothing to shard); with compile: true it stores its converted weights beside the compiled "
                        "graphs")
        dtype = resolve_dtype(cfg.dtype, self.device)
        draft_config = self._draft_config(model_config.vocab_size) if cfg.speculation.mode == "draft" else None
        if cfg.compile:
            self._load_compiled(model_config, draft_config, dtype)
            return
        if group is None:
            weights = checkpoint_weights(self.model_path, model_config, self.device, dtype)
            self.model = LlamaModel(model_config, weights, cfg.max_num_seqs, cfg.max_model_len)
        else:
            part, weights, self.artifacts = rank_shard(cfg, self.model_path, self.device, model_config, dtype, group)
            self.model = LlamaModel(part, weights, cfg.max_num_seqs, cfg.max_model_len, reduce=group.reduce)
        if draft_config is not None and (group is None or group.rank == 0):  # the leader drafts, alone
            weights = build_weights(draft_config, read_tensors(self._draft_path()), self.device, dtype)
            self.draft = LlamaModel(draft_config, weights, cfg.max_num_seqs, cfg.max_model_len)

    def compile(self) -> Any:
        """The compile Job. TP > 1 (one process, no group): every rank's shard with compile_cache.sharded_weights,
        cut from one read of the checkpoint (rank 0's artifacts returned), else nothing to compile (each rank cuts
        its shard at load); one process: `load`'s."""
        cfg = self.config
        world = cfg.parallelism.tensor_parallel_degree
        if world == 1 or self.tensor_parallel is not None:
            return super().compile()
        if cfg.compile:
            raise RunnerError(COMPILE_WITH_TP)
        if not cfg.compile_cache.sharded_weights:
            return None
        model_config = read_config(self.model_path, cfg.max_model_len)
        dtype = resolve_dtype(cfg.dtype, self.device)
        # read once, and only when some rank's shard is missing from the store
        full = functools.cache(functools.partial(checkpoint_weights, self.model_path, model_config, self.device, dtype))
        stored = [stored_shard(cfg, self.model_path, self.device, model_config, dtype, rank, world, full)
                  for rank in range(world)]
        self.artifacts = stored[0]
        return self.artifacts

    @property
    def artifacts_folder(self) -> Optional[Path]:
        """The artifacts' local folder (compile: true, or a rank's shard), None otherwise."""
        return self.artifacts.folder if self.artifacts else None

    def _draft_path(self) -> Path:
        return Path(str(self.config.speculation.draft_model))

    def _draft_config(self, vocab_size: int) -> LlamaConfig:
        path = self._draft_path()
        if not (path / "config.json").is_file():
            raise RunnerError(f"speculation.draft_model: no Hugging Face model folder (config.json) at {path}")
        draft_config = read_config(path, self.config.max_model_len)
        mismatch = vocabulary_mismatch(self.model_path, path, vocab_size, draft_config.vocab_size)
        if mismatch:
            raise RunnerError(f"speculation.draft_model cannot serve this model: {mismatch}")
        return draft_config

    # --- compile: true -------------------------------------------------------------------------------------------

    def compiled_shape(self, model_config: LlamaConfig, draft_config: Optional[LlamaConfig],
                       dtype: torch.dtype) -> dict[str, Any]:
        """Everything that shapes the compiled graphs (the artifacts folder's digest; torch's version is beside it)."""
        cfg = self.config
        width = self._verify_width()
        graphs = graph_shapes(cfg.max_num_seqs, cfg.max_context_length, cache_length(cfg.max_model_len, width), width)
        return {
            "format": ARTIFACTS_FORMAT, "device": self.device.type, "target": compile_target(self.device),
            "dtype": str(dtype).removeprefix("torch."), "max_num_seqs": cfg.max_num_seqs,
            "max_model_len": cfg.max_model_len, "max_context_length": cfg.max_context_length,
            "kv_cache_length": cache_length(cfg.max_model_len, width), "graphs": graphs,
            "architecture": dataclasses.asdict(model_config),
            "draft": None if draft_config is None else {"path": str(self._draft_path()),
                                                        "architecture": dataclasses.asdict(draft_config)},
        }

    def _verify_width(self) -> int:
        return self.speculation_length + 1 if self.speculation_length else 0

    def _load_compiled(self, model_config: LlamaConfig, draft_config: Optional[LlamaConfig],
                       dtype: torch.dtype) -> None:
        """The compiled artifacts through the compile-artifact cache (by compile_cache.policy): loaded from the local
        folder or the store, or compiled (this start then serves the graphs it compiled) and stored."""
        shape = self.compiled_shape(model_config, draft_config, dtype)
        try:
            self.artifacts = prepare_artifacts(
                self.config, self.model_path, "torch", torch.__version__, shape,
                lambda folder: self.compile_into(folder, model_config, draft_config, dtype))
        except ArtifactsError as exc:
            raise RunnerError(str(exc)) from exc
        if not self.artifacts.outcome.compiled:
            self.load_from(self.artifacts.folder, model_config, draft_config, dtype)

    def compile_into(self, folder: Path, model_config: LlamaConfig, draft_config: Optional[LlamaConfig],
                     dtype: torch.dtype) -> None:
        """Convert the checkpoint(s) to the serving dtype, compile every graph (in a fresh inductor cache), and write
        both into `folder`; this start serves from the graphs it just compiled."""
        started = time.perf_counter()
        weights = build_weights(model_config, read_tensors(self.model_path), self.device, dtype)
        save_weights(folder / WEIGHTS_FILE, weights)
        draft_weights = None
        if draft_config is not None:
            draft_weights = build_weights(draft_config, read_tensors(self._draft_path()), self.device, dtype)
            save_weights(folder / DRAFT_WEIGHTS_FILE, draft_weights)
        self.timings = {"convert_s": round(time.perf_counter() - started, 3)}
        with scoped_cache_artifacts(), kernels_into(folder / KERNELS_FILE):
            self._build_graphs(model_config, weights, draft_config, draft_weights)
            saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            raise RunnerError("torch.compile recorded no cache artifacts (is the inductor FX graph cache disabled? "
                              "unset TORCHINDUCTOR_FX_GRAPH_CACHE=0)")
        (folder / COMPILE_CACHE_FILE).write_bytes(saved[0])
        log.info("compiled %d graphs in %.1f s (checkpoint converted in %.1f s) into %s (%.1f MB of compile cache)",
                 self.graph_cache["graphs"], self.timings["compile_s"], self.timings["convert_s"], folder,
                 len(saved[0]) / 2**20)

    def load_from(self, folder: Path, model_config: LlamaConfig, draft_config: Optional[LlamaConfig],
                  dtype: torch.dtype) -> None:
        """A warm start: the converted weights, and the graphs from torch's cache artifacts and their compiled
        kernels (FX-graph cache hits: no code generation, no C++ compiler; dynamo still traces each graph)."""
        started = time.perf_counter()
        try:
            weights = load_weights(folder / WEIGHTS_FILE, model_config, self.device, dtype)
            draft_weights = None
            if draft_config is not None:
                draft_weights = load_weights(folder / DRAFT_WEIGHTS_FILE, draft_config, self.device, dtype)
            blob = (folder / COMPILE_CACHE_FILE).read_bytes()
            kernels = install_kernels(folder / KERNELS_FILE)
        except (OSError, ValueError, KeyError, tarfile.TarError) as exc:
            raise RunnerError(f"the compiled artifacts at {folder} are unusable ({exc}); recompile them "
                              "(compile_cache.policy Always)") from exc
        if torch.compiler.load_cache_artifacts(blob) is None:
            raise RunnerError(f"the compiled artifacts at {folder} are unusable ({COMPILE_CACHE_FILE} does not load in "
                              f"torch {torch.__version__}); recompile them (compile_cache.policy Always)")
        self.timings = {"load_s": round(time.perf_counter() - started, 3)}
        log.debug("%d compiled kernels put into the inductor cache", kernels)
        with scoped_cache_artifacts():
            self._build_graphs(model_config, weights, draft_config, draft_weights)
        misses = self.graph_cache["fxgraph_cache_miss"]
        (log.warning if misses else log.info)(
            "loaded compiled artifacts from %s in %.1f s; %d graphs from the compile cache in %.1f s (%d hits, %d "
            "misses%s)", folder, self.timings["load_s"], self.graph_cache["graphs"], self.timings["compile_s"],
            self.graph_cache["fxgraph_cache_hit"], misses,
            ": compiled again, the artifacts were made for another CPU, compiler or torch" if misses else "")

    def _build_graphs(self, model_config: LlamaConfig, weights: LlamaWeights, draft_config: Optional[LlamaConfig],
                      draft_weights: Optional[LlamaWeights]) -> None:
        cfg = self.config
        width = self._verify_width()
        length = cache_length(cfg.max_model_len, width)
        before, started = compile_counters(), time.perf_counter()
        self.model = LlamaModel(model_config, weights, cfg.max_num_seqs, length)
        self.graphs = FixedShapeModel(self.model, cfg.max_context_length, cfg.max_model_len, width, "target")
        self.graphs.compile()
        if draft_config is not None and draft_weights is not None:
            self.draft = LlamaModel(draft_config, draft_weights, cfg.max_num_seqs, length)
            self.draft_graphs = FixedShapeModel(self.draft, cfg.max_context_length, cfg.max_model_len, width, "draft")
            self.draft_graphs.compile()
        self.timings["compile_s"] = round(time.perf_counter() - started, 3)
        self.graph_cache = counters_since(before)

    def capacity(self) -> RunnerCapacity:
        return RunnerCapacity(
            max_num_seqs=self.config.max_num_seqs,
            max_context_length=self.config.max_context_length,
            max_model_len=self.config.max_model_len,
            speculation_length=self.speculation_length,
            vocab_size=self._model().config.vocab_size,
        )

    def capabilities(self) -> RunnerCapabilities:
        on_device = self.config.sampling.on_device
        return RunnerCapabilities(
            sampling=SamplingCapabilities(
                runner=self.framework,
                max_top_k=self.config.sampling.global_top_k,
                top_p_rule="keep",
                seeds=True,
                logprobs=not on_device,  # on the device, only token ids leave the runner (as on Neuron)
                penalties=True,
                logit_bias=True,
                stop_token_masking=True,
                fixes={"logprobs": "start it with sampling.on_device=false to get logprobs"},
            ),
            host_drafts=True,
            per_row_speculation_length=True,
        )

    @torch.inference_mode()
    def prefill(self, batch: PrefillBatch) -> StepOutput:
        model = self._model()
        check_slots(batch.slots, self.config.max_num_seqs)
        lengths = [len(p) for p in batch.prompt_ids]
        if not all(1 <= n <= self.config.max_context_length for n in lengths):
            raise ValueError(f"prompt lengths {lengths} must be in [1, {self.config.max_context_length}]")
        self.sampler.seed(batch.slots, batch.sampling)
        if self.graphs is not None:  # at their buckets: one prompt per call, or many in a full-batch call
            logits = self.graphs.prefill_all(batch.slots, batch.prompt_ids)
            return self._sample(logits, batch.slots, batch.sampling, batch.num_logprobs)
        logits = torch.empty((len(lengths), model.config.vocab_size), dtype=model.dtype, device=model.device)
        for group in prefill_groups(lengths):
            width = max(lengths[i] for i in group)
            tokens = torch.zeros((len(group), width), dtype=torch.int64)  # [G, T], right-padded with 0
            for row, i in enumerate(group):
                tokens[row, : lengths[i]] = torch.tensor(batch.prompt_ids[i])
            hidden = model.hidden_states(tokens, [batch.slots[i] for i in group], [0] * len(group))  # [G, T, D]
            last = torch.tensor([lengths[i] - 1 for i in group], device=model.device)  # [G]
            logits[torch.tensor(group, device=model.device)] = model.logits(
                hidden[torch.arange(len(group), device=model.device), last]
            )  # [G, V]
        return self._sample(logits, batch.slots, batch.sampling, batch.num_logprobs)

    @torch.inference_mode()
    def decode(self, batch: DecodeBatch) -> StepOutput:
        """Exactly one token per row (speculation is scored: see `score`)."""
        check_slots(batch.slots, self.config.max_num_seqs)
        if any(batch.num_spec_tokens):
            raise ValueError("the torch runner speculates through score(), not fused decode")
        model = self._model()
        if self.graphs is not None:  # the first n slots in one call, n a batch bucket
            logits = self.graphs.decode(batch.slots, batch.last_tokens, batch.positions)
            return self._sample(logits, batch.slots, batch.sampling, batch.num_logprobs)
        order = sorted(range(len(batch.slots)), key=lambda i: batch.slots[i])  # by slot: consecutive lines
        tokens = torch.tensor([[batch.last_tokens[i]] for i in order], dtype=torch.int64)  # [B, 1]
        sorted_logits = model.last_logits(tokens, [batch.slots[i] for i in order],
                                          [batch.positions[i] for i in order])  # [B, V], rows in slot order
        logits = torch.empty_like(sorted_logits)  # [B, V], rows in batch order
        logits[torch.tensor(order, device=model.device)] = sorted_logits
        return self._sample(logits, batch.slots, batch.sampling, batch.num_logprobs)

    @torch.inference_mode()
    def score(self, batch: ScoreBatch) -> torch.Tensor:
        """Target logits at the last token and each draft, one forward per distinct k: `[B, k+1, V]`."""
        model = self._model()
        check_slots(batch.slots, self.config.max_num_seqs)
        num_spec = [len(d) for d in batch.draft_tokens]
        if not all(1 <= k <= self.speculation_length for k in num_spec):
            raise ValueError(f"draft lengths {num_spec} must be in [1, {self.speculation_length}]")
        if self.graphs is not None:  # every slot in one [max_num_seqs, k+1] call
            fed = [[last, *drafts] for last, drafts in zip(batch.last_tokens, batch.draft_tokens)]
            logits = self.graphs.verify(batch.slots, fed, batch.positions)[:, : max(num_spec) + 1]
            return logits if self.config.sampling.on_device else logits.float().cpu()
        logits = torch.zeros(len(num_spec), max(num_spec) + 1, model.vocab_size, dtype=model.dtype,
                             device=model.device)  # [B, k+1, V]; positions past a row's k_i stay unused
        by_k: dict[int, list[int]] = {}
        for i, k in enumerate(num_spec):
            by_k.setdefault(k, []).append(i)
        for k, rows in by_k.items():
            fed = torch.tensor([[batch.last_tokens[i], *batch.draft_tokens[i]] for i in rows])  # [G, k+1]
            scored = model.forward(fed, [batch.slots[i] for i in rows], [batch.positions[i] for i in rows])
            logits[torch.tensor(rows, device=model.device), : k + 1] = scored  # [G, k+1, V]
        if not self.config.sampling.on_device:
            return logits.float().cpu()  # host sampling: the verifier runs where the generators live
        return logits

    def slot_generators(self, slots: Sequence[int]) -> list[torch.Generator]:
        return self.sampler.generators(slots)

    def draft_model(self) -> LlamaModel | FixedShapeModel:
        if self.draft is None:
            raise RunnerError("no draft model is loaded: set speculation.mode draft and speculation.draft_model")
        return self.draft_graphs or self.draft

    def release(self, slot: int) -> None:
        # NOTE: the KV line needs no reset: a position is always written before it is read (see llama.py).
        self.sampler.release(slot)
        for graphs in (self.graphs, self.draft_graphs):
            if graphs is not None:
                graphs.release(slot)

    def info(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"framework": self.framework, "torch": torch.__version__, "device": str(self.device)}
        if self.model is not None:
            facts.update(dtype=str(self.model.dtype).removeprefix("torch."), architecture=self.model.config.architecture)
        if self.tensor_parallel is not None:
            facts["tensor_parallel"] = {"rank": self.tensor_parallel.rank, "world": self.tensor_parallel.world}
        if self.graphs is not None:
            facts.update(compile=True, graphs=self.graphs.shapes(),
                         artifacts=self.artifacts.info() if self.artifacts else None,
                         compiled_now=bool(self.artifacts and self.artifacts.outcome.compiled), **self.timings,
                         graph_cache=dict(self.graph_cache))
            if self.draft_graphs is not None:
                facts["draft_graphs"] = self.draft_graphs.shapes()
        return facts

    def shutdown(self) -> None:
        self.model = None
        self.draft = None
        self.graphs = self.draft_graphs = None
        self.sampler.clear()

    def _model(self) -> LlamaModel:
        if self.model is None:
            raise RunnerError("the runner is not loaded: call load() first")
        return self.model

    def _sample(
        self,
        logits: torch.Tensor,
        slots: Sequence[int],
        sampling: list[RowSampling],
        num_logprobs: list[Optional[int]],
    ) -> StepOutput:
        """Sample one token per row (on the device, or on the host from a numpy copy); logprobs when asked.

        Logprobs are of the raw logits (vLLM's default `raw_logprobs`); the token is sampled from the processed ones.
        """
        if not self.config.sampling.on_device:
            logits = torch.from_numpy(np.array(logits.float().cpu().numpy(), copy=True))  # the device->host copy
        return self.sampler.sample(logits, slots, sampling, num_logprobs)


__all__ = ["ARTIFACTS_FORMAT", "COMPILE_CACHE_FILE", "DRAFT_WEIGHTS_FILE", "KERNELS_FILE", "PREFILL_PADDING_BUDGET",
           "TorchReferenceRunner", "prefill_groups"]
