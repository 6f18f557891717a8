"""The TNx runner: transformers-neuronx 0.13.x (`transformers_neuronx`) behind the slot contract.

Written against the 0.13 line (src/transformers_neuronx at 1ade6d7, the last public sync; SDK 2.22-2.25), the
library's last, end-of-support release line: it reached end of support on 2025-09-16, and `load` says so. NEVER RUN
ON NEURON HARDWARE: it is tested against a contract fake of 0.13 (tests/runtime_tests/fake_neuron/transformers_neuronx)
that enforces the rules below. File names in comments are TNx's (src/transformers_neuronx/...).

How TNx is driven (as vLLM's TNx loader and runner of PR #16357 drive it, with the differences noted):

- the model class comes from TNx's own registry, `modeling_auto.NEURON_MODEL_FOR_CAUSAL_LM_MAPPING`, by the
  checkpoint's `model_type`, target and draft alike, for the types the runner serves: llama, code_llama, mistral,
  mixtral (`tnx_models.py`). The registry's others are refused at load (`UNSERVED_MODEL_TYPES` says why, per
  family: gptj and gpt_neox have no save/load and take `cache_offset`; bloom and opt fail continuous batching's
  context encoding; gpt2's forward has no continuous batching). `cls.from_pretrained(path, batch_size=slots,
  tp_degree, amp, n_positions=[seq], context_length_estimate=[context buckets], neuron_config=NeuronConfig(...))`,
  the context buckets by TNx's own power-of-two rule (`buckets.tnx_buckets`). `NeuronConfig` asserts it knows every
  keyword (config.py); continuous batching needs `batch_size_for_shared_caches == batch_size` (module.py) and forces
  right padding, so cache ids are 2D `[rows, tokens]`.
- `neuron_config_overrides` (vLLM's override_neuron_config) are merged last into the target's NeuronConfig keywords
  (the draft gets none, as in vLLM's TNx loader), so they are part of the compiled artifacts' key (`tnx_config.py`).
  Keywords the runner derives from RuntimeConfig fields are refused (`MANAGED_KEYWORDS`); a JSON object is built
  into TNx's config object for quant and kv_cache_quant and refused for any other keyword; a keyword or value TNx
  refuses is a load error naming it, before any compile.
- compiled artifacts: `load(folder)` only records the folder and `to_neuron()` then reads the NEFFs (base.py); a
  first start runs `to_neuron()` (compiles) and then `save(folder)` (save needs the compiled kernels). Target and draft
  save separately; the fused speculator has no save/load in 0.13 and is rebuilt at every start (the Neuron
  persistent compile cache, NEURON_COMPILE_CACHE_URL, is what spares that compile).
- forward by keyword, `model(input_ids, cache_ids=positions, start_ids=slots)`, int32 (the graphs take s32); the
  EAGLE decoder gets int64 start_ids (vLLM's torch.long), which it indexes host tensors with as given.
  Context encoding happens iff more than one token is fed and `cache_ids[0, 0] == 0` (base.py
  `_prepare_for_continuous_batching`; an EAGLE model also with one token); it runs one sequence at a time
  (context_batch_sizes is [1] under continuous batching), so prefill sends one prompt per call, padded to two tokens
  when it has one (the padding has cache id 0, and the output is taken at max(cache_ids), `_prepare_for_par_ctx_
  rhs_padding`) so that it is context-encoded rather than run as token generation.
- token generation always runs the whole compiled batch: rows are scattered to their lines by start_ids, and every
  line not in the call is fed token 0 at cache id 0, which the graph writes into that line's KV cache
  (`update_cache` in layers/attention.py updates all lines). A slot prefilled this step (the engine decodes the
  older rows after it) would lose its position 0. So decode sends every line itself, start_ids = 0..B-1 in order:
  the rows at their positions, every other line token 0 at position max_model_len - 1. That position (and the k a
  fused step writes after it, in the compiled tail) is at or past the next position any live line writes before it
  reads, and a full line is never read again. The fused speculators pad missing lines with zeros the same way
  (fused_speculation.py `preprocess_input`, eagle_speculation.py `pad`), so speculation sends full batches too.
  Row order needs no sorting: TNx scatters and gathers by start_ids (`_postprocess`, `postprocess_output`), except
  that EAGLE's `handle_padding` returns a full batch in line order, which sorted start_ids make the row order.
- per-slot sampling: `GenerationConfig(dynamic=True, per_batch_line=True, do_sample=True, global_top_k, top_k /
  top_p / temperature lists)` compiled in, indexed by KV line (layers/generation.py `sampling_params_for_batch_line`
  reads them at each row's seq id); `update_generation_config` rewrites the lists when a slot's (top_k, top_p,
  temperature) changed (greedy is top_k 1; top_k clamped to [1, global_top_k]: 0 would keep no candidate,
  temperature is divided by, never 0). TNx's top-p keeps the candidate whose cumulative probability crosses top_p
  (hlo.py `topp`: positions <= count(cumulative < top_p)). With `sampling.on_device` false the model returns
  logits and the host samples (SlotSampler: seeds, logprobs, penalties). On the device, sampling.global_top_k is
  at most 256 (`check_device_top_k`, the limit vLLM's TNx runner has).
- fused speculation (speculation.mode draft): `FusedSpeculativeDecoder(draft, target, k)`, both models with
  on_device_embedding and on-device generation; `speculative_iteration(input_ids, cache_ids, start_ids)` runs the
  draft k + 1 times (k proposals) and the target over k + 1 positions and returns tokens [B, k + 1] with counts
  [B, 1] in 1..k + 1: our k is TNx's k. A step writes k positions past a row's token, so the compiled sequence is
  max_model_len + k long. TNx's post-processing replaces every token equal to pad_token_id, generated ones included,
  by tokens[0, 0]; pad_token_id -1 is never a token. EAGLE (speculation.mode eagle, the draft's config.json has
  `is_eagle: true`): `EagleSpeculativeDecoder` requires a token tree in 0.13; a chain of k + 1 nodes proposes k
  tokens. It keeps per-line state (the hidden state of each line's last token) that a step rewrites for every line it
  runs, so the state of lines not in the call is put back after, and every line is context-encoded once at load so
  that the state exists for lines never used yet.
- multi-node (parallelism.nodes > 1): one process per host, as TNx's multi-node recipe runs it (research/neuron-apis.md
  §2.4, the TNx developer guide; vLLM's TNx multi-node scripts): every host builds the model with tp_degree = the
  whole group's TP, and NeuronConfig reads NEURON_RANK_ID (the host's index, 0 = the leader) and NEURON_LOCAL_TP
  (TP / nodes) at construction (config.py), which distributed/topology.py `backend_env` sets before the runner is
  built. The host then holds ranks NEURON_RANK_ID * NEURON_LOCAL_TP .. + NEURON_LOCAL_TP - 1: parallel.py
  `shard_along_on_cpu` slices their shards only and compiler.py `ParallelKernel` loads the NEFF on them
  (get_g_start_device_id, get_g_device_count in config.py); the fused speculators build their programs from the
  target's NeuronConfig the same way (program.py). NEURON_RT_ROOT_COMM_ID is the runtime's rendezvous, and every
  host's forward must get the same inputs: the leader broadcasts each step (distributed/leader.py). `load` checks
  the variables against the config (`multi_node_error`) and refuses a family other than trn1 (TNx multi-node is
  Trn1/Trn1n only) and TNx's pipeline parallelism (NEURON_PP_STAGES, whose own host loop is not served).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch

from neuronmodel_runtime.artifacts.prepare import Artifacts, ArtifactsError, prepare_artifacts
from neuronmodel_runtime.config import RuntimeConfig, env as env_names, read_model_config
from neuronmodel_runtime.frameworks import TNX_DEPRECATION
from neuronmodel_runtime.releases import release_of
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
from neuronmodel_runtime.runners.buckets import tnx_buckets
from neuronmodel_runtime.runners.device_sampling import check_device_top_k, first_tokens, sampling_capabilities
from neuronmodel_runtime.runners.neuron_library import aws_support, import_library, release_warning
from neuronmodel_runtime.runners.slot_sampler import SlotSampler
from neuronmodel_runtime.runners.tnx_config import (
    AMP,
    GREEDY_LINE,
    build_neuron_config,
    device_top_k,
    neuron_config_kwargs,
    sequence_length,
)
from neuronmodel_runtime.runners.tnx_models import model_class
from neuronmodel_runtime.sampling.params import RowSampling

log = logging.getLogger(__name__)

#: transformers-neuronx's end of support (AWS Neuron SDK announcement).
END_OF_SUPPORT = "2025-09-16"
#: Speculation output padding: TNx overwrites every token equal to its pad_token_id, so it must be no token id.
PAD_TOKEN_ID = -1
#: The instance family TNx runs multi-node on (the TNx developer guide: Trn1/Trn1n), as NEURONMODEL_INSTANCE_FAMILY
#: names it.
MULTI_NODE_FAMILY = "trn1"


def multi_node_error(config: RuntimeConfig, env: Mapping[str, str]) -> Optional[str]:
    """Why the variables TNx reads for its ranks (config.py: NEURON_RANK_ID, NEURON_LOCAL_TP, NEURON_PP_STAGES) do not
    fit parallelism.nodes / tensor_parallel_degree, or None. On one node NEURON_LOCAL_TP must be unset (or the whole
    TP): TNx would load only that many ranks."""
    nodes, tp = config.parallelism.nodes, config.parallelism.tensor_parallel_degree
    local, rank = env.get("NEURON_LOCAL_TP") or None, env.get("NEURON_RANK_ID") or "0"
    if nodes == 1:
        if local is not None and local != str(tp):
            return (f"NEURON_LOCAL_TP={local} with parallelism.nodes 1: transformers-neuronx would load only "
                    f"{local} of the {tp} ranks; unset it")
        return None
    family = env.get(env_names.INSTANCE_FAMILY) or None
    if family is not None and family != MULTI_NODE_FAMILY:
        return (f"parallelism.nodes {nodes} on {env_names.INSTANCE_FAMILY}={family}: transformers-neuronx runs "
                f"multi-node on {MULTI_NODE_FAMILY} (Trn1/Trn1n) only; use framework nxdi, or parallelism.nodes 1")
    if (env.get("NEURON_PP_STAGES") or "1") != "1":
        return (f"NEURON_PP_STAGES={env['NEURON_PP_STAGES']}: transformers-neuronx's pipeline parallelism is not "
                "served (its stages run their own host loop); unset it")
    if local != str(tp // nodes):
        return (f"NEURON_LOCAL_TP={local} but parallelism.tensor_parallel_degree {tp} over {nodes} nodes is "
                f"{tp // nodes} per host; start the host with `neuronmodel-runtime serve` / `worker`, which set it")
    if not rank.isdigit() or int(rank) >= nodes:
        return f"NEURON_RANK_ID={rank} is not a host of the group of {nodes} (0..{nodes - 1})"
    if not env.get("NEURON_RT_ROOT_COMM_ID"):
        return "NEURON_RT_ROOT_COMM_ID is not set: the hosts' Neuron runtimes meet at the leader's address there"
    return None


def chain_token_tree(k: int) -> dict[int, list[int]]:
    """EAGLE's token tree for k proposals in a row: {0: [1], 1: [2], ..., k-1: [k]} (k + 1 nodes, node 0 is the fed
    token; util/token_tree.py)."""
    return {i: [i + 1] for i in range(k)}


def device_line(row: RowSampling, global_top_k: int) -> tuple[int, float, float]:
    """A row's (top_k, top_p, temperature) as TNx's per-line lists take them: top_k in [1, global_top_k] (-1, no
    limit, is the global top-k)."""
    top_k = global_top_k if row.top_k < 1 else min(row.top_k, global_top_k)
    return int(top_k), float(row.top_p), float(row.temperature)


def step_tokens(tokens: torch.Tensor, counts: torch.Tensor, lines: Sequence[int], wanted: Sequence[int]
                ) -> list[list[int]]:
    """Per row, the first count tokens of its line's row of a fused step (at most wanted[i]); never the padding."""
    rows = tokens.to(torch.int64).tolist()
    numbers = counts.reshape(-1).to(torch.int64).tolist()
    return first_tokens([rows[line] for line in lines], [numbers[line] for line in lines], wanted)


def start_ids(lines: Sequence[int], eagle: bool) -> torch.Tensor:
    """A call's start_ids (its rows' KV lines). int64 for EagleSpeculativeDecoder: it indexes host tensors with
    them as given (eagle_speculation.py `pad`: padded_tensor[seq_ids] = tensor; handle_padding) beside its graph's
    int64 seq ids (torch.arange), and vLLM passes torch.long. int32 for the models (base.py builds its own int32
    seq ids for token generation) and for FusedSpeculativeDecoder, which converts them itself
    (fused_speculation.py: start_ids.flatten().to(torch.long)) and passes them to the models as given."""
    return torch.tensor(list(lines), dtype=torch.int64 if eagle else torch.int32)


class TnxRunner(ModelRunner):
    """A transformers-neuronx causal LM (Llama, Mistral, ... as TNx 0.13 has them) in `max_num_seqs` slots."""

    framework = "tnx"

    def __init__(self, config: RuntimeConfig, model_path: str):
        self.config = config
        self.model_path = Path(model_path)
        spec = config.speculation
        self.k = spec.num_speculative_tokens if spec.mode in ("draft", "eagle") else 0
        self.eagle = self.k > 0 and spec.mode == "eagle"
        self.n_positions = sequence_length(config)
        self.buckets = tnx_buckets(config.max_context_length)
        self.sampler = SlotSampler(config.sampling.global_top_k, torch.device("cpu"))  # host sampling only
        self.version: Optional[str] = None
        self.model: Any = None  # the target (TNx model)
        self.draft: Any = None
        self.speculator: Any = None  # FusedSpeculativeDecoder / EagleSpeculativeDecoder
        self.generation_config_cls: Any = None
        self.artifacts: Optional[Artifacts] = None  # the compiled models' folder and how it got there
        self.vocab_size = 0
        self.top_k = config.sampling.global_top_k  # the compiled global top-k, known after load()
        self._lines = [GREEDY_LINE] * config.max_num_seqs  # the per-line sampling on the device now

    # --- load ---------------------------------------------------------------------------------------------------

    def load(self) -> None:
        cfg = self.config
        check_device_top_k(cfg)
        ranks = multi_node_error(cfg, os.environ)
        if ranks:
            raise RunnerError(ranks)
        if cfg.speculation.mode == "promptLookup":
            raise RunnerError("speculation.mode 'promptLookup' is not served by the tnx runner (TNx speculates on "
                              "the device with a draft model or EAGLE); use draft or eagle, or framework torch")
        if cfg.compile_cache.sharded_weights:
            raise RunnerError("compile_cache.sharded_weights is not served by the tnx runner (transformers-neuronx "
                              "saves pre-sharded weights only with on-device embedding); set it to false, or use "
                              "framework nxdi")
        if self.k and not cfg.sampling.on_device:
            raise RunnerError("speculation.mode draft/eagle on TNx needs sampling.on_device=true (its fused "
                              "speculators sample on the device); set it, or speculation.mode none")
        raw = read_model_config(self.model_path)
        _, version = import_library("tnx", "transformers_neuronx", "transformers-neuronx")
        self.version = version
        log.warning("%s (transformers-neuronx reached end of support on %s)", TNX_DEPRECATION, END_OF_SUPPORT)
        warning = release_warning("tnx", version)
        if warning:
            log.warning(warning)
        from transformers_neuronx import config as tnx_config
        from transformers_neuronx.modeling_auto import NEURON_MODEL_FOR_CAUSAL_LM_MAPPING

        self.generation_config_cls = tnx_config.GenerationConfig
        cls = model_class(NEURON_MODEL_FOR_CAUSAL_LM_MAPPING, raw.get("model_type"), version)
        self.vocab_size = int(raw.get("vocab_size") or 0)
        self.top_k = device_top_k(cfg, self.vocab_size)
        draft_cls, draft_path = None, None
        if self.k:
            draft_path = Path(str(cfg.speculation.draft_model))
            draft_raw = read_model_config(draft_path, "speculation.draft_model")
            is_eagle = bool(draft_raw.get("is_eagle", False))
            if is_eagle != self.eagle:
                raise RunnerError(
                    f"speculation.draft_model {draft_path}: its config.json has is_eagle {is_eagle}, so it is "
                    f"{'an EAGLE' if is_eagle else 'not an EAGLE'} draft; set speculation.mode to "
                    f"{'eagle' if is_eagle else 'draft'}")
            if int(draft_raw.get("vocab_size") or 0) != self.vocab_size:
                raise RunnerError(f"speculation.draft_model: its vocabulary ({draft_raw.get('vocab_size')}) is not "
                                  f"the target's ({self.vocab_size}); TNx fuses only models of one vocabulary")
            draft_cls = model_class(NEURON_MODEL_FOR_CAUSAL_LM_MAPPING, draft_raw.get("model_type"), version,
                                    "speculation.draft_model")
        compiled = {
            "model_type": raw.get("model_type"), "draft": str(draft_path) if draft_path else None,
            "speculation": cfg.speculation.mode if self.k else "none", "k": self.k,
            "batch_size": cfg.max_num_seqs, "tp_degree": cfg.parallelism.tensor_parallel_degree,
            "amp": AMP[cfg.dtype], "n_positions": [self.n_positions], "context_length_estimate": self.buckets,
            "target": neuron_config_kwargs(cfg, self.vocab_size, "target"),
            "draft_neuron_config": neuron_config_kwargs(cfg, self.vocab_size, "draft") if self.k else None,
        }
        # built before any compile, so that an override TNx refuses fails first; each is used by one build
        target_config = build_neuron_config(tnx_config, compiled["target"], version)
        draft_config = build_neuron_config(tnx_config, compiled["draft_neuron_config"], version) if self.k else None

        def compile_into(folder: Path) -> None:  # TNx compiles while it loads: the models stay loaded
            log.info("compiling for transformers-neuronx %s into %s (minutes to hours on Neuron)", version, folder)
            self.model = self._build(cls, self.model_path, target_config, folder / "target", saved=False)
            if draft_cls is not None and draft_path is not None:
                self.draft = self._build(draft_cls, draft_path, draft_config, folder / "draft", saved=False)

        try:
            self.artifacts = prepare_artifacts(cfg, self.model_path, "tnx", version, compiled, compile_into)
        except ArtifactsError as exc:
            raise RunnerError(str(exc)) from exc
        if not self.artifacts.outcome.compiled:
            folder = self.artifacts.folder
            self.model = self._build(cls, self.model_path, target_config, folder / "target", saved=True)
            if draft_cls is not None and draft_path is not None:
                self.draft = self._build(draft_cls, draft_path, draft_config, folder / "draft", saved=True)
        if self.k:
            self._build_speculator()

    def _build(self, cls: Any, path: Path, neuron_config: Any, folder: Path, saved: bool) -> Any:
        """from_pretrained, then load(folder) + to_neuron() (saved) or to_neuron() + save(folder) (base.py)."""
        cfg = self.config
        model = cls.from_pretrained(
            str(path),
            batch_size=cfg.max_num_seqs,
            tp_degree=cfg.parallelism.tensor_parallel_degree,
            amp=AMP[cfg.dtype],
            n_positions=[self.n_positions],
            context_length_estimate=list(self.buckets),
            neuron_config=neuron_config,
        )
        if saved:
            model.load(str(folder))  # only records the folder; to_neuron() reads the NEFFs
            try:
                model.to_neuron()
            except FileNotFoundError as exc:
                raise RunnerError(f"the artifacts at {folder} do not match this model ({exc}); recompile "
                                  "(compile_cache.policy Always)") from exc
        else:
            model.to_neuron()
            model.save(str(folder))  # needs the compiled kernels: after to_neuron() only
        return model

    def _build_speculator(self) -> None:
        if self.eagle:
            from transformers_neuronx.eagle_speculation import EagleSpeculativeDecoder

            self.speculator = EagleSpeculativeDecoder(self.draft, self.model, pad_token_id=PAD_TOKEN_ID,
                                                      token_tree=chain_token_tree(self.k))
        else:
            from transformers_neuronx.fused_speculation import FusedSpeculativeDecoder

            self.speculator = FusedSpeculativeDecoder(self.draft, self.model, k=self.k, pad_token_id=PAD_TOKEN_ID)
        self.speculator.to_neuron()
        if self.eagle:  # EAGLE's per-line state exists only for lines context-encoded once
            for slot in range(self.config.max_num_seqs):
                ids, cache = _context_inputs([0])
                self.speculator.speculative_iteration(ids, cache, start_ids([slot], eagle=True))

    # --- contract -----------------------------------------------------------------------------------------------

    def capacity(self) -> RunnerCapacity:
        self._loaded()
        return RunnerCapacity(
            max_num_seqs=self.config.max_num_seqs,
            max_context_length=self.buckets[-1],  # the largest compiled context bucket
            max_model_len=self.config.max_model_len,
            speculation_length=self.k,
            vocab_size=self.vocab_size,
        )

    def capabilities(self) -> RunnerCapabilities:
        return RunnerCapabilities(
            # TNx keeps the candidate whose cumulative probability crosses top_p (hlo.py topp)
            sampling=sampling_capabilities(self.framework, self.config.sampling.on_device,
                                           self.config.sampling.global_top_k, top_p_rule="keep"),
            host_drafts=False,
            fused_speculation=(self.config.speculation.mode,) if self.k else (),
            per_row_speculation_length=False,  # compiled for one k
        )

    @torch.inference_mode()
    def prefill(self, batch: PrefillBatch) -> StepOutput:
        """One context-encoding call per prompt, into the prompt's slot (its KV line)."""
        self._loaded()
        check_slots(batch.slots, self.config.max_num_seqs)
        limit = self.buckets[-1]
        for prompt in batch.prompt_ids:
            if not 1 <= len(prompt) <= limit:
                raise ValueError(f"prompt of {len(prompt)} tokens must be in [1, {limit}] (max_context_length)")
        on_device = self.config.sampling.on_device
        if on_device:
            self._set_lines(batch.slots, batch.sampling)
        else:
            self.sampler.seed(batch.slots, batch.sampling)
        tokens: list[list[int]] = []
        logits: list[torch.Tensor] = []
        for slot, prompt in zip(batch.slots, batch.prompt_ids):
            ids, cache = _context_inputs(prompt)
            start = start_ids([slot], self.eagle)
            if self.speculator is not None:  # context-encodes target and draft (and stores EAGLE's state)
                out, _ = self.speculator.speculative_iteration(ids, cache, start)
                tokens.append([int(out.reshape(-1)[0])])
            else:
                out = self.model(ids, cache_ids=cache, start_ids=start)
                if on_device:
                    tokens.append([int(out.reshape(-1)[0])])
                else:
                    logits.append(out.reshape(1, -1)[:, : self.vocab_size].float())
        if logits:
            return self.sampler.sample(torch.cat(logits), batch.slots, batch.sampling, batch.num_logprobs)
        return StepOutput(token_ids=tokens)

    @torch.inference_mode()
    def decode(self, batch: DecodeBatch) -> StepOutput:
        """One token-generation call over every line; with fused speculation each row gets up to
        num_spec_tokens[i] + 1 tokens (only the first for rows that do not speculate this step)."""
        self._loaded()
        check_slots(batch.slots, self.config.max_num_seqs)
        spec = list(batch.num_spec_tokens)
        if spec and self.speculator is None:
            raise ValueError(f"num_spec_tokens {spec}: this runner does not speculate (speculation.mode none)")
        if any(n not in (0, self.k) for n in spec):
            raise ValueError(f"num_spec_tokens {spec}: this runner speculates exactly k={self.k} tokens per row, "
                             "or none")
        on_device = self.config.sampling.on_device
        if on_device:
            self._set_lines(batch.slots, batch.sampling)
        ids, cache, starts = self._full_batch(batch)
        if self.speculator is not None:
            saved = self._eagle_state(batch.slots)
            tokens, counts = self.speculator.speculative_iteration(ids, cache, starts)
            self._restore_eagle_state(saved)
            wanted = [1 + (spec[i] if spec else 0) for i in range(len(batch.slots))]
            out = StepOutput(token_ids=step_tokens(tokens, counts, batch.slots, wanted),
                             num_draft_tokens=spec or None)
        else:
            result = self.model(ids, cache_ids=cache, start_ids=starts)  # every line, in line order
            lines = torch.tensor(batch.slots, dtype=torch.int64)
            if on_device:
                out = StepOutput(token_ids=[[int(t)] for t in result.reshape(len(starts), -1)[lines, 0]])
            else:
                logits = result.reshape(len(starts), -1)[lines, : self.vocab_size].float()
                out = self.sampler.sample(logits, batch.slots, batch.sampling, batch.num_logprobs)
        return out

    def release(self, slot: int) -> None:
        self.sampler.release(slot)

    def info(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"framework": self.framework}
        if self.version is not None:
            known_release = release_of("tnx", self.version)
            facts.update(tnx=self.version, sdk=known_release.sdk if known_release else None,
                         written_against=known_release is not None, end_of_support=END_OF_SUPPORT,
                         aws_support=aws_support("tnx", self.version))
        if self.model is not None:
            facts.update(model_class=type(self.model).__name__,
                         tp_degree=self.config.parallelism.tensor_parallel_degree, amp=AMP[self.config.dtype],
                         n_positions=self.n_positions, context_buckets=list(self.buckets),
                         )
        if self.artifacts is not None:
            facts.update(artifacts=self.artifacts.info(), compiled_now=self.artifacts.outcome.compiled)
        if self.speculator is not None:
            facts.update(speculator=type(self.speculator).__name__, draft_class=type(self.draft).__name__,
                         speculation_k=self.k)
        return facts

    def shutdown(self) -> None:
        self.model = self.draft = self.speculator = None
        self.sampler.clear()

    # --- helpers ------------------------------------------------------------------------------------------------

    def _loaded(self) -> None:
        if self.model is None:
            raise RunnerError("the runner is not loaded: call load() first")

    def _set_lines(self, slots: Sequence[int], rows: Sequence[RowSampling]) -> None:
        """Rewrite the device's per-line sampling lists when a slot's (top_k, top_p, temperature) changed."""
        changed = False
        for slot, row in zip(slots, rows):
            line = device_line(row, self.top_k)
            if self._lines[slot] != line:
                self._lines[slot] = line
                changed = True
        if not changed:
            return
        generation = self.generation_config_cls(
            max_length=self.n_positions, do_sample=True, dynamic=True, per_batch_line=True, global_top_k=self.top_k,
            top_k=[line[0] for line in self._lines], top_p=[line[1] for line in self._lines],
            temperature=[line[2] for line in self._lines],
        )
        (self.speculator or self.model).update_generation_config(generation)

    def _full_batch(self, batch: DecodeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids, cache_ids [B, 1] and start_ids [B] of every line: the rows at their positions, every other line
        token 0 at max_model_len - 1, where what it writes (up to k positions more in a fused step: the compiled
        tail) is overwritten before any live line reads it; never position 0 (TNx would context-encode)."""
        lines = self.config.max_num_seqs
        ids = torch.zeros(lines, 1, dtype=torch.int32)
        cache = torch.full((lines, 1), self.config.max_model_len - 1, dtype=torch.int32)
        for slot, token, position in zip(batch.slots, batch.last_tokens, batch.positions):
            ids[slot, 0] = token
            cache[slot, 0] = position
        return ids, cache, start_ids(range(lines), self.eagle)

    def _eagle_state(self, slots: Sequence[int]) -> dict[str, dict[int, Any]]:
        """EAGLE's per-line state (eagle_speculation.py: hidden, cache_gather_indices, cache_scatter_indices) of the
        lines not in this call, which the step is about to overwrite."""
        if not self.eagle:
            return {}
        keep = set(range(self.config.max_num_seqs)) - set(slots)
        return {name: {s: v for s, v in getattr(self.speculator, name).items() if s in keep}
                for name in ("hidden", "cache_gather_indices", "cache_scatter_indices")}

    def _restore_eagle_state(self, saved: dict[str, dict[int, Any]]) -> None:
        for name, values in saved.items():
            getattr(self.speculator, name).update(values)


def _context_inputs(prompt: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and cache_ids [1, T] of one prompt; a one-token prompt gets a padding token at cache id 0 so that TNx
    context-encodes it (the output is read at max(cache_ids))."""
    ids = list(prompt) + [0] * (2 - len(prompt)) if len(prompt) < 2 else list(prompt)
    cache = list(range(len(prompt))) + [0] * (len(ids) - len(prompt))
    return torch.tensor([ids], dtype=torch.int32), torch.tensor([cache], dtype=torch.int32)


__all__ = ["END_OF_SUPPORT", "MULTI_NODE_FAMILY", "PAD_TOKEN_ID", "TnxRunner", "chain_token_tree", "device_line",
           "multi_node_error", "start_ids", "step_tokens"]

