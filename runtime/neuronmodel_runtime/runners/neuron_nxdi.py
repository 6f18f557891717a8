"""The NxDI runner: NeuronX Distributed Inference (`neuronx_distributed_inference`) behind the slot contract.

Written against NxDI 0.3 (SDK 2.23) through 0.9 (SDK 2.29), and 0.10 (SDK 2.30/2.31: maintenance releases with no
public source, taken to keep 0.9's API); `releases.py` lists the commits. Where the releases differ the code branches
on the installed version, citing the change. NEVER RUN ON NEURON HARDWARE: it is tested against contract fakes of
each release (tests/runtime_tests/fake_neuron/) that enforce the library's rules.

How NxDI is driven (as vLLM's NxDI integration, PR #16357 and the fix #18279, and vllm-neuron 0.2-0.5 drive it):

- one `NeuronConfig` from the RuntimeConfig (`nxdi_config.py`, pure): batch_size = slots, continuous batching
  with ctx_batch_size 1, dynamic on-device sampling unless `sampling.on_device` is false; `InferenceConfig` through
  the model class's own config class and `load_pretrained_config`; the model class from NxDI's `MODEL_TYPES`.
- the model class (`nxdi_models.py`): text-only causal LMs only (NOT_TEXT_ONLY: mllama and the image-to-text
  classes are refused); a model_type the release's MODEL_TYPES lacks may still have a class of that release
  (FALLBACK_CLASSES: Mistral on the Llama class before 0.9, Qwen2's own class on 0.4). `neuron_config_overrides` are
  merged last into the NeuronConfig kwargs (as vLLM's override_neuron_config), so they are part of the artifacts'
  key; a key the installed NeuronConfig does not keep is refused (NxDI itself only logs it), as is one the runner
  derives.
- compile once into an artifacts folder (`artifacts.prepare.prepare_artifacts`: found there, fetched from the
  shared store, or compiled and stored), then `cls(folder)`, the checkpoint paths rebound to this host's
  (`rebind_checkpoints`: NxDI shards the weights at load from the path it compiled from), and `load(folder)`: the
  loaded `neuron_config.json` is what serves, so the capacity is read back from it. Up to 0.6 a fused instance
  swaps its class's decoder class for NeuronFusedSpecModel; `decoder_class` restores it before each instance.
- `forward` by keyword, int32 ids. Prefill is one row per call (ctx_batch_size 1; `models/model_base.py` runs
  context encoding iff `position_ids.min() == 0`). NxDI pads a prompt to its bucket with position 1 and reads the
  row's last token at the highest position, so a one-token prompt would be answered from a pad: it is sent padded to
  max_context_length with position 0 (the inferred attention mask drops those pads).
- decode sends every slot, in slot order: token generation writes batch row i into KV line i
  (`modules/kvcache/kv_cache_manager.py`), and a smaller batch is padded by repeating row 0 into the missing lines
  (`models/model_wrapper.py`), which overwrites another sequence's K/V at row 0's position. A slot without a row
  this step gets a filler row at its next free position (>= 1, so the call stays token generation), where its own
  next step writes anyway.
- the `[B, 3]` sampling tensor (top_k, top_p, temperature) is built per row sent, in that order; greedy is
  (1, 1.0, 1.0) on every release: up to 0.5 NxDI rejects top_k 0 and temperature 0, from 0.6 (e07f056) top_k <= 0
  means uniform random and one temperature-0 row turns top-p off for the whole batch. A new tensor every call:
  from 0.6 `infer_sampling_params` rewrites it in place.
- fused speculation (a draft model, or EAGLE / EAGLE3): NxDI compiled for `speculation_length` s runs the draft s
  times and the target over s positions, so one step emits 1..s tokens: our k drafts are s = k + 1. The target
  verifies by argmax (and compiling with do_sample fails), so such a runner decodes greedily only and says so.
  `fused_outputs` is [accepted (B, s) padded, next_input_ids, next_attention_mask, next_pos_ids (B, 1)]; a row's
  count is next_pos_ids - position (the padding is 0 before 0.8 and -1 from 0.8, cd3abf3: never read it, nor
  next_input_ids, which before 0.8 is wrong when an accepted token is 0).
- multi-node (parallelism.nodes > 1; NxDI's examples/multi_node.md and inference_demo.py, 5de79de .. ef2731e): one
  process per host, every host with tp_degree = the whole group's TP and local_ranks_size L = TP / nodes in the
  compiled NeuronConfig (`nxdi_config.py`: the compiled model.pt holds SPMD models of L ranks, neuronx-distributed
  trace/model_builder.py build_nxd_model), so one compile (at start_rank_id 0) serves every host; host n loads
  ranks n*L .. n*L+L-1 (`load_ranks`), named both to load() and to the loaded NeuronConfig (`bind_ranks`: sharding
  on load reads the config's). NEURON_RT_ROOT_COMM_ID (distributed/topology.py) is the runtime's rendezvous, and
  every host must call forward with the same inputs: the leader broadcasts each step (distributed/leader.py).
  Pre-sharded weights are refused there (the compile writes its own ranks' shards only).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from neuronmodel_runtime.artifacts.prepare import Artifacts, ArtifactsError, prepare_artifacts
from neuronmodel_runtime.config import RuntimeConfig, read_model_config
from neuronmodel_runtime.releases import parse_version, release_of
from neuronmodel_runtime.runners.base import (
    DecodeBatch,
    ModelRunner,
    PrefillBatch,
    RunnerCapabilities,
    RunnerCapacity,
    RunnerError,
    StepOutput,
    check_slots,
)
from neuronmodel_runtime.runners.device_sampling import check_device_top_k, first_tokens, sampling_capabilities
from neuronmodel_runtime.runners.neuron_library import aws_support, import_library, release_warning
from neuronmodel_runtime.runners.nxdi_config import neuron_config_kwargs, speculation_length, unknown_overrides
from neuronmodel_runtime.runners.nxdi_models import decoder_class, is_eagle3_draft, model_class, sliding_window_error
from neuronmodel_runtime.runners.slot_sampler import SlotSampler
from neuronmodel_runtime.sampling.params import GREEDY, RowSampling
from neuronmodel_runtime.sampling.tensors import sampling_tensor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Release:
    """The installed NxDI, as the runner branches on it."""

    version: str  # distribution version, e.g. 0.9.17334
    minor: tuple[int, int]  # (0, 9)

    @classmethod
    def of(cls, version: str) -> "Release":
        parsed = parse_version(version) or (0, 0)
        return cls(version, (parsed[0], parsed[1] if len(parsed) > 1 else 0))

    @property
    def has_eagle3(self) -> bool:
        # NeuronConfig.is_eagle3 arrived with 2.27 (fcb5a86); before, the kwarg is only warned about and ignored.
        return self.minor >= (0, 7)


def load_ranks(config: RuntimeConfig, node_rank: int) -> dict[str, Optional[int]]:
    """`load()`'s start_rank_id / local_ranks_size: node n of a multi-node group loads ranks n*L .. n*L+L-1, L =
    TP / nodes (inference_demo.py at ef2731e: `args.start_rank_id = node_rank * args.local_ranks_size`; NxDI's
    examples/multi_node.md: start_rank_id a multiple of local_ranks_size, tp_degree the whole group's)."""
    nodes = config.parallelism.nodes
    if nodes == 1:
        return {"start_rank_id": None, "local_ranks_size": None}
    local = config.parallelism.tensor_parallel_degree // nodes
    return {"start_rank_id": node_rank * local, "local_ranks_size": local}


def bind_ranks(neuron_config: Any, ranks: dict[str, Optional[int]]) -> None:
    """Make the loaded NeuronConfig name this host's ranks. `load(start_rank_id, local_ranks_size)` alone is not
    enough: sharding on load (save_sharded_checkpoint false) goes through the ModelBuilder that `get_builder()`
    builds from neuron_config.start_rank_id / local_ranks_size (application_base.py load_weights at 5de79de and
    ef2731e; neuronx-distributed trace/model_builder.py shard_checkpoint shards exactly those ranks), while the
    load() arguments choose the pre-sharded files and the start rank the weights are initialized at. The folder's
    neuron_config.json says rank 0 (the compile ran there), so a worker host would put rank 0's shards on its own
    ranks."""
    for name, value in ranks.items():
        if value is not None:
            setattr(neuron_config, name, value)


def device_sampling_tensor(rows: Sequence[RowSampling], global_top_k: int) -> torch.Tensor:
    """`[B, 3]` float32 for NxDI, one row per row sent: top_k in [1, global_top_k] (-1 becomes global_top_k, as NxDI
    must never see top_k <= 0), greedy as (1, 1.0, 1.0). A new tensor every call: NxDI may rewrite it."""
    params = sampling_tensor(list(rows), global_top_k)
    params[:, 0].clamp_(1, global_top_k)
    return params


def prompt_inputs(prompt: Sequence[int], max_context_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`input_ids`, `position_ids` `[1, T]` int32 of one prompt. A one-token prompt is right-padded to
    max_context_length (the largest bucket) with token 0 at position 0: NxDI's own padding would put its pads at
    position 1, above the prompt's only token, and answer from a pad."""
    length = len(prompt) if len(prompt) > 1 else max_context_length
    ids = torch.zeros((1, length), dtype=torch.int32)
    ids[0, : len(prompt)] = torch.tensor(prompt, dtype=torch.int32)
    positions = torch.zeros((1, length), dtype=torch.int32)
    positions[0, : len(prompt)] = torch.arange(len(prompt), dtype=torch.int32)
    return ids, positions


def full_batch(batch: DecodeBatch, slots: int, filler_position: Callable[[int], int]) -> DecodeBatch:
    """The batch with one row per slot 0..slots-1, in slot order; a slot without a row gets a greedy filler row
    (token 0 at `filler_position(slot)`)."""
    row_of = {slot: i for i, slot in enumerate(batch.slots)}
    full = DecodeBatch(slots=list(range(slots)), last_tokens=[], positions=[], sampling=[])
    for slot in full.slots:
        i = row_of.get(slot)
        full.last_tokens.append(0 if i is None else batch.last_tokens[i])
        full.positions.append(filler_position(slot) if i is None else batch.positions[i])
        full.sampling.append(GREEDY if i is None else batch.sampling[i])
    return full


def fused_step_tokens(accepted: torch.Tensor, next_positions: torch.Tensor, positions: Sequence[int],
                      wanted: Sequence[int]) -> list[list[int]]:
    """Per row, the tokens of one fused step: the first next_pos - pos of `accepted` (1..s), at most wanted[i]."""
    counts = (next_positions.reshape(-1).to(torch.int64) - torch.tensor(positions, dtype=torch.int64)).tolist()
    return first_tokens(accepted.to(torch.int64).tolist(), counts, wanted)


def rebind_checkpoints(config: Any, model_path: Path, draft_path: Optional[Path]) -> None:
    """Point a loaded config at this host's checkpoints before `load()`. NxDI writes the checkpoint path it compiled
    from (`_name_or_path`, `fused_spec_config.draft_model_path`) into neuron_config.json and, sharding on load,
    reads the weights from there (application_base.py checkpoint_loader_fn: 5de79de; from fcb5a86 a missing path
    falls back to the artifacts folder, which holds no weights). Artifacts come from a content-keyed store, so the
    compile host's path may be missing here, or hold another model."""
    config._name_or_path = str(model_path)
    spec = getattr(config, "fused_spec_config", None)
    if spec is not None and draft_path is not None:
        spec.draft_model_path = str(draft_path)


class NxdiRunner(ModelRunner):
    """An NxDI causal LM (Llama, Qwen2/3, Mixtral, ... as the installed release has them) in `max_num_seqs` slots."""

    framework = "nxdi"

    def __init__(self, config: RuntimeConfig, model_path: str, node_rank: int = 0):
        self.config = config
        self.model_path = Path(model_path)
        self.node_rank = node_rank  # this node's index in a multi-node group (0 on one node)
        self.global_top_k = config.sampling.global_top_k
        self.k = speculation_length(config) - 1 if config.speculation.mode in ("draft", "eagle") else 0
        self.sampler = SlotSampler(self.global_top_k, torch.device("cpu"))  # host sampling only
        self.model: Any = None
        self.library: Optional[Release] = None  # the installed NxDI, known after load()
        self.artifacts: Optional[Artifacts] = None  # the compiled model's folder and how it got there
        self._cls: Any = None  # NxDI's application class of the model
        self._capacity: Optional[RunnerCapacity] = None
        self._next_position: dict[int, int] = {}  # slot -> position its next token will be written at

    # --- load ---------------------------------------------------------------------------------------------------

    def load(self) -> None:
        cfg = self.config
        if cfg.parallelism.nodes > 1 and cfg.compile_cache.sharded_weights:
            # application_base.py shard_weights (5de79de .. ef2731e): the compile writes the shards of its own
            # ranks only (ModelBuilder.shard_checkpoint over start_rank_id .. +local_ranks_size), so a worker
            # host would find no weights/tp{rank}_sharded_checkpoint.safetensors of its ranks in the artifacts
            raise RunnerError("compile_cache.sharded_weights with parallelism.nodes > 1: NxDI's compile writes "
                              "the weight shards of the compiling host's ranks only, so the other hosts' shards "
                              "would be missing; set compile_cache.sharded_weights to false (each host shards its "
                              "ranks at load)")
        if cfg.speculation.mode == "promptLookup":
            raise RunnerError("speculation.mode 'promptLookup' is not served by the nxdi runner (NxDI speculates "
                              "with a draft model or EAGLE on the device); use draft or eagle, or framework torch")
        if self.k and not cfg.sampling.on_device:
            raise RunnerError("speculation.mode draft/eagle on NxDI needs sampling.on_device=true (NxDI's fused "
                              "speculation samples on the device); set it, or speculation.mode none")
        check_device_top_k(cfg)
        self._cls, kwargs = self._prepare()
        assert self.artifacts is not None
        decoder_class(self._cls)
        self.model = self._cls(str(self.artifacts.folder))
        rebind_checkpoints(self.model.config, self.model_path, self._draft_path())
        ranks = load_ranks(cfg, self.node_rank)
        bind_ranks(self.model.neuron_config, ranks)
        self.model.load(str(self.artifacts.folder), **ranks)
        self._capacity = self._read_capacity(kwargs)

    def compile(self) -> Artifacts:
        """The compile Job: the artifacts compiled (or found) and stored, without loading onto the devices."""
        self._prepare()
        assert self.artifacts is not None
        return self.artifacts

    def _prepare(self) -> tuple[Any, dict[str, Any]]:
        """Import NxDI, choose the class, build the NeuronConfig kwargs, and make the compiled artifacts ready."""
        cfg = self.config
        _, version = import_library("nxdi", "neuronx_distributed_inference", "neuronx-distributed-inference")
        self.library = release = Release.of(version)
        warning = release_warning("nxdi", version)
        if warning:
            log.warning(warning)
        support = aws_support("nxdi", version)
        if support and support["patched"] is False:
            log.warning("NxDI %s is on a line AWS no longer patches here: %s", version, support["aws_says"])
        from neuronx_distributed_inference.models import config as nxdi_config
        from neuronx_distributed_inference.utils.constants import MODEL_TYPES
        from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

        raw = read_model_config(self.model_path)
        model_type = str(raw.get("model_type"))
        cls = model_class(MODEL_TYPES, model_type, version)
        window = sliding_window_error(model_type, cls, raw, cfg.max_model_len)
        if window:
            raise RunnerError(window)
        eagle3 = cfg.speculation.mode == "eagle" and is_eagle3_draft(Path(str(cfg.speculation.draft_model)))
        if eagle3 and not release.has_eagle3:
            raise RunnerError(f"speculation.draft_model is an EAGLE3 draft, which NxDI {version} cannot serve "
                              "(is_eagle3 arrived with NxDI 0.7, SDK 2.27); use an EAGLE (v1) draft or a newer image")
        kwargs = neuron_config_kwargs(cfg, eagle3)
        overrides = cfg.neuron_config_overrides
        unknown = unknown_overrides(cls.get_neuron_config_cls()(**copy.deepcopy(kwargs)), overrides) if overrides \
            else []
        if unknown:
            raise RunnerError(f"neuron_config_overrides: {', '.join(unknown)} is not a NeuronConfig keyword of NxDI "
                              f"{version} (it would be ignored); remove it or use a release that has it")
        decoder = decoder_class(cls)

        def compile_into(folder: Path) -> None:
            neuron_config = cls.get_neuron_config_cls()(**copy.deepcopy(kwargs))
            config = cls.get_config_cls()(neuron_config, load_config=load_pretrained_config(str(self.model_path)))
            if self.k:
                config.fused_spec_config = self._fused_spec_config(decoder, cls, nxdi_config,
                                                                   load_pretrained_config, neuron_config)
            log.info("compiling for NxDI %s into %s (minutes to hours on Neuron)", version, folder)
            decoder_class(cls)
            cls(str(self.model_path), config).compile(str(folder))

        try:
            self.artifacts = prepare_artifacts(cfg, self.model_path, "nxdi", version,
                                               {"neuron_config": kwargs, "model_type": model_type}, compile_into)
        except ArtifactsError as exc:
            raise RunnerError(str(exc)) from exc
        return cls, kwargs

    def _draft_path(self) -> Optional[Path]:
        return Path(str(self.config.speculation.draft_model)) if self.k else None

    def _fused_spec_config(self, decoder: Any, cls: Any, nxdi_config: Any, load_pretrained_config: Any,
                           target: Any) -> Any:
        """The draft's config, by NxDI's recipe (inference_demo, vLLM's loader): a copy of the target's neuron
        config, unfused; an EAGLE draft keeps speculation_length and is flagged is_eagle_draft. `decoder` is the
        worker class (`decoder_class`)."""
        draft_path = str(self.config.speculation.draft_model)
        draft = copy.deepcopy(target)
        eagle = self.config.speculation.mode == "eagle"
        if not eagle:
            draft.speculation_length = 0
        draft.enable_fused_speculation = False
        if eagle:
            draft.is_eagle_draft = True
            draft.sequence_parallel_enabled = False
        draft_config = cls.get_config_cls()(draft, load_config=load_pretrained_config(draft_path))
        return nxdi_config.FusedSpecNeuronConfig(decoder, draft_config=draft_config, draft_model_path=draft_path)

    def _read_capacity(self, wanted: dict[str, Any]) -> RunnerCapacity:
        """The capacity of the loaded (compiled) config; a folder compiled for another shape is an error, since
        NxDI would silently serve its own shape (`NEURON_COMPILED_ARTIFACTS` can point anywhere)."""
        nc = self.model.config.neuron_config
        for name in ("tp_degree", "batch_size", "max_context_length", "seq_len", "speculation_length"):
            have = getattr(nc, name, 0)
            if have != wanted.get(name, 0):
                folder = self.artifacts.folder if self.artifacts else None
                raise RunnerError(f"the NxDI artifacts at {folder} were compiled with {name}={have}, this "
                                  f"config needs {wanted.get(name, 0)}; recompile (compile_cache.policy Always) or "
                                  "unset NEURON_COMPILED_ARTIFACTS")
        vocab = int(getattr(self.model.config, "vocab_size", 0))
        return RunnerCapacity(
            max_num_seqs=nc.batch_size,
            max_context_length=nc.max_context_length,
            max_model_len=nc.seq_len - self.k,
            speculation_length=self.k,
            vocab_size=vocab,
        )

    # --- contract -----------------------------------------------------------------------------------------------

    def capacity(self) -> RunnerCapacity:
        if self._capacity is None:
            raise RunnerError("the runner is not loaded: call load() first")
        return self._capacity

    def capabilities(self) -> RunnerCapabilities:
        on_device = self.config.sampling.on_device
        return RunnerCapabilities(
            # NxDI's sampler drops the candidate whose cumulative mass crosses top_p (modules/generation/sampling.py).
            sampling=sampling_capabilities(self.framework, on_device, self.global_top_k, top_p_rule="drop",
                                           sampled=not self.k),
            host_drafts=False,
            fused_speculation=(self.config.speculation.mode,) if self.k else (),
            per_row_speculation_length=False,  # compiled for one speculation_length
        )

    @torch.inference_mode()
    def prefill(self, batch: PrefillBatch) -> StepOutput:
        """One context-encoding call per prompt (ctx_batch_size 1), into the prompt's slot."""
        check_slots(batch.slots, self.capacity().max_num_seqs)
        self.sampler.seed(batch.slots, batch.sampling)
        limit = self.capacity().max_context_length
        tokens: list[list[int]] = []
        logits: list[torch.Tensor] = []
        for slot, prompt, row in zip(batch.slots, batch.prompt_ids, batch.sampling):
            if not 1 <= len(prompt) <= limit:
                raise ValueError(f"prompt of {len(prompt)} tokens must be in [1, {limit}] (max_context_length)")
            ids, positions = prompt_inputs(prompt, limit)
            out = self.model(input_ids=ids, seq_ids=torch.tensor([slot], dtype=torch.int32), position_ids=positions,
                             sampling_params=device_sampling_tensor([row], self.global_top_k))
            if self.k:  # fused: the first token leads fused_outputs[0]
                tokens.append([int(out.fused_outputs[0].reshape(1, -1)[0, 0])])
            elif self.config.sampling.on_device:
                tokens.append([int(out.tokens.reshape(-1)[0])])
            else:
                logits.append(out.logits.reshape(1, -1, out.logits.shape[-1])[:, -1, :].float())
            self._next_position[slot] = len(prompt)
        if logits:
            return self.sampler.sample(torch.cat(logits), batch.slots, batch.sampling, batch.num_logprobs)
        return StepOutput(token_ids=tokens)

    @torch.inference_mode()
    def decode(self, batch: DecodeBatch) -> StepOutput:
        """Every slot in one token-generation call, in slot order (rows without a sequence this step are fillers);
        with fused speculation a row gets up to num_spec_tokens[i] + 1 tokens (only the first if it does not
        speculate this step)."""
        check_slots(batch.slots, self.capacity().max_num_seqs)
        full = full_batch(batch, self.capacity().max_num_seqs, self._filler_position)
        out = self.model(
            input_ids=torch.tensor([[t] for t in full.last_tokens], dtype=torch.int32),
            seq_ids=torch.arange(len(full.slots), dtype=torch.int32),
            position_ids=torch.tensor([[p] for p in full.positions], dtype=torch.int32),
            sampling_params=device_sampling_tensor(full.sampling, self.global_top_k),
        )
        rows = batch.slots  # row i of the batch is row batch.slots[i] of the full batch
        if self.k:
            wanted = [1 + (batch.num_spec_tokens[i] if batch.num_spec_tokens else 0) for i in range(len(rows))]
            fused = out.fused_outputs
            tokens = fused_step_tokens(fused[0][rows], fused[-1][rows], batch.positions, wanted)
            output = StepOutput(token_ids=tokens, num_draft_tokens=list(batch.num_spec_tokens) or None)
        elif self.config.sampling.on_device:
            output = StepOutput(token_ids=[[t] for t in out.tokens.reshape(-1)[rows].tolist()])
        else:
            logits = out.logits.reshape(len(full.slots), -1, out.logits.shape[-1])[rows, -1, :].float()  # [B, V]
            output = self.sampler.sample(logits, batch.slots, batch.sampling, batch.num_logprobs)
        for slot, position, new in zip(batch.slots, batch.positions, output.token_ids):
            self._next_position[slot] = position + len(new)
        return output

    def _filler_position(self, slot: int) -> int:
        """Where a slot without a row this step may be written harmlessly: its next position (its own next step
        writes there before reading it), or 1 for a free slot; never 0, which would make the call a prefill."""
        return min(max(1, self._next_position.get(slot, 1)), self.capacity().max_model_len - 1)

    def release(self, slot: int) -> None:
        self.sampler.release(slot)
        self._next_position.pop(slot, None)

    def info(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"framework": self.framework}
        if self.library is not None:
            known_release = release_of("nxdi", self.library.version)
            facts.update(nxdi=self.library.version, sdk=known_release.sdk if known_release else None,
                         written_against=known_release is not None,
                         aws_support=aws_support("nxdi", self.library.version))
        if self.model is not None:
            nc = self.model.config.neuron_config
            facts.update(model_class=type(self.model).__name__, tp_degree=nc.tp_degree,
                         dtype=str(nc.torch_dtype).removeprefix("torch."))
        if self.artifacts is not None:
            facts.update(artifacts=self.artifacts.info(), compiled_now=self.artifacts.outcome.compiled)
        return facts

    def shutdown(self) -> None:
        self.model = None
        self.sampler.clear()


__all__ = ["NxdiRunner", "Release", "bind_ranks", "device_sampling_tensor", "full_batch", "fused_step_tokens",
           "load_ranks", "prompt_inputs", "rebind_checkpoints"]

