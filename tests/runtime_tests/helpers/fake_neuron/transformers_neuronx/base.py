"""The model lifecycle and forward of src/transformers_neuronx/base.py + module.py (0.13.x, 1ade6d7), over the fake
device of `_backing.py`.

Rules enforced, as the real code has them:
- `from_pretrained` (module.py `_sanity_check`): max(n_positions) >= max(context_length_estimate); with continuous
  batching `batch_size_for_shared_caches == batch_size`; the BSH cache layout needs continuous batching and single
  buckets; the folder must hold weights (FileNotFoundError otherwise).
- `load(dir)` only records the folder; `to_neuron()` loads the weights, then reads the saved NEFFs from that folder
  (FileNotFoundError when the folder or a NEFF of this exact graph is missing) or compiles (`COMPILE_LOG`).
- `save(dir)` before `to_neuron()` fails (the decoder's program is None: AttributeError), after the folder is made.
- `update_generation_config` validates per_batch_line and the list lengths (== batch size) and needs a compiled
  model with dynamic on-device generation.
- forward with continuous batching (`_prepare_for_continuous_batching`): context encoding iff (the model is an EAGLE
  draft/target or more than one token is fed) and `cache_ids.flatten()[0] == 0`; one sequence at a time
  (context_batch_sizes = [1]) into KV line start_ids[i], the prompt right-padded to its context bucket (cache ids
  become 0..bucket-1) and the output taken at max(cache_ids[i]); a prompt longer than the largest context bucket
  is an AssertionError. One token per row is token generation over the FULL batch: rows are scattered to their
  lines by start_ids and every other line is fed token 0 at cache id 0, which the graph writes into that line's KV
  cache (attention.py `update_cache` updates all n_seqs lines); outputs come back gathered by start_ids
  (`_postprocess`). Several tokens at an offset is speculative_forward, which needs `enable_speculative_decoder`.
- outputs: with on_device_generation int32 token ids [n, 1]; else float32 logits [n, vocab]; an EAGLE target also
  returns its hidden states.
- ranks (multi-node: NeuronConfig reads NEURON_RANK_ID, NEURON_LOCAL_TP and NEURON_PP_STAGES at construction;
  tp_degree is the whole group's): `to_neuron()` loads this process's ranks only, rank_id * local_tp ..
  rank_id * local_tp + local_tp - 1 of the pp_stages * tp_degree devices (config.py get_local_tp,
  get_g_start_device_id, get_g_device_count; parallel.py shard_along_on_cpu slices those shards; compiler.py
  ParallelKernel.load places the NEFF on them). Ranks past the group (a rank_id > 0 without NEURON_LOCAL_TP: the
  whole model at device tp_degree) or a local_tp that does not divide tp_degree (hosts that cannot cover the group)
  are refused (RuntimeError: the real runtime cannot place or join them). The NEFFs do not depend on the rank (the
  rank is given at load, not in the HLO), so every host loads the artifacts one host saved. `loaded_ranks` and
  `step_inputs` (every forward's input_ids, cache_ids, start_ids as given) are the fake's records, for tests.
Only continuous batching is modelled; static batching raises NotImplementedError.
"""

import hashlib
import json
import os
from typing import Any, Dict, List, Optional

import torch

from transformers_neuronx import _backing, bucket
from transformers_neuronx.config import GenerationConfig, NeuronConfig
from transformers_neuronx.constants import Layout
from transformers_neuronx.layers.generation import DeviceGeneration

#: One entry (the class name) per compile; one per load of saved artifacts. Tests read these.
COMPILE_LOG: List[str] = []
LOAD_LOG: List[str] = []

AMPS = ("f32", "f16", "bf16")


class DecoderLmHead:
    """The parts of the real `decoder_lm_head` (decoder.py DecoderLmHeadForSamplingNoEmbedding) callers touch."""

    def __init__(self, model: "NeuronModelBase", tp_degree: int, n_positions_list: List[int], batch_size: List[int]):
        self.model = model
        self.tp_degree = tp_degree
        self.n_positions_list = n_positions_list
        self.batch_size = batch_size
        self.neuron_config = model.neuron_config
        self.program: Optional[Dict[str, str]] = None  # kernel name -> NEFF file name, once compiled or loaded

    def validate_generation_configs(self, generation_config: GenerationConfig) -> None:
        current = self.neuron_config.on_device_generation
        if current:
            assert generation_config.per_batch_line == current.per_batch_line, (
                f"Invalid new generation config. Recieved new generation config with per_batch_line = "
                f"{generation_config.per_batch_line}, while current generation config has per_batch_line = "
                f"{current.per_batch_line}")
        batch_size = self.batch_size if isinstance(self.batch_size, int) else self.batch_size[0]
        g = generation_config
        if g.per_batch_line:
            for name in ("top_k", "top_p", "temperature", "top_p_min_tokens"):
                if not isinstance(getattr(g, name), list):
                    setattr(g, name, [getattr(g, name)] * batch_size)
            assert len(g.top_k) == len(g.top_p) == len(g.temperature) == len(g.top_p_min_tokens) == batch_size, (
                "For per batch-line sampling, sampling parameters top_k, top_p, top_p_min_tokens, temperature must "
                f"be of same size as bach_size. Recieved len(top_k): {len(g.top_k)} len(top_p): {len(g.top_p)} "
                f"len(top_p_min_tokens): {len(g.top_p_min_tokens)} len(temperature): {len(g.temperature)} "
                f"batch_size: {batch_size}")
        else:
            assert not any(isinstance(getattr(g, n), list) for n in ("top_k", "top_p", "top_p_min_tokens",
                                                                      "temperature")), \
                "Sampling parameters cannot be of type list when per_batch_line = False"

    def update_generation_config(self, generation_config: GenerationConfig) -> None:
        self.validate_generation_configs(generation_config)
        generation = self.model._generation
        if generation is None or not generation.config.dynamic:
            # the real decoder writes into its top_k/top_p/temperature device tensors, which exist only once
            # compiled with dynamic on-device generation (ops.parallel_write on None otherwise)
            raise AttributeError("'NoneType' object has no attribute 'parallel_write': update_generation_config "
                                 "needs a model compiled (to_neuron) with on_device_generation dynamic=True")
        generation.write(generation_config)


def _int_tensor(name: str, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype.is_floating_point or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (the compiled graph takes s32 ids), got {value.dtype}")
    return value


class NeuronModelBase(torch.nn.Module):
    """Shared by the fake LlamaForSampling and MistralForSampling."""

    is_fid = False

    # --- construction (module.py PretrainedModel.from_pretrained, llama/model.py __init__) ------------------------

    @classmethod
    def from_pretrained(cls, pretrained_model_path, *model_args, **kwargs):
        n_positions = kwargs.get("n_positions", 2048)
        context_length_estimate = kwargs.get("context_length_estimate", None)
        max_n_pos = max(n_positions) if isinstance(n_positions, list) else n_positions
        max_cle = max(context_length_estimate) if isinstance(context_length_estimate, list) else context_length_estimate
        if isinstance(max_n_pos, int) and isinstance(max_cle, int):
            assert max_n_pos >= max_cle, \
                f"Max context_length_estimate {max_cle} cannot be more than max n_positions {max_n_pos}."
        neuron_config = kwargs.get("neuron_config", None)
        bsh_cache_layout = neuron_config is not None and neuron_config.cache_layout == Layout.BSH
        if neuron_config and neuron_config.continuous_batching:
            shared = neuron_config.continuous_batching.batch_size_for_shared_caches
            expected = kwargs.get("batch_size")
            assert shared == expected, f"invalid batch_size_for_shared_caches ({shared}), {expected} is expected"
            if bsh_cache_layout and not neuron_config.continuous_batching.optimized_paged_attention:
                assert isinstance(n_positions, list) and len(n_positions) == 1
                assert isinstance(context_length_estimate, list) and len(context_length_estimate) == 1, \
                    "BSH cache layout does not support multi-bucketing"
        else:
            assert not bsh_cache_layout, "BSH cache layout can only be configured with continuous batching."
        config = _backing.read_hf_config(pretrained_model_path)
        model = cls(config, *model_args, **kwargs)
        if not os.path.isdir(pretrained_model_path) or not _backing.has_weights(pretrained_model_path):
            raise FileNotFoundError(f"Can not find model.safetensors or pytorch_model.bin in {pretrained_model_path}")
        model._checkpoint = str(pretrained_model_path)
        return model

    def _init_model(self, config, *, n_positions, batch_size, amp, tp_degree, context_length_estimate,
                    neuron_config, model_type: str) -> None:
        super().__init__()
        rope_scaling = getattr(config, "rope_scaling", None)
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type")) if rope_scaling else None
        if rope_scaling is not None and rope_type not in {"default", "llama3"}:
            raise ValueError("Only default and llama3 ropes scaling types are currently supported. "
                             f"Received {rope_type}")
        self.config = config
        config.n_positions, config.batch_size, config.amp, config.tp_degree = n_positions, batch_size, amp, tp_degree
        config.model_type = model_type
        config.is_eagle = getattr(config, "is_eagle", False)
        self.amp = amp
        self.neuron_config = neuron_config if neuron_config else NeuronConfig()
        if self.neuron_config.on_device_generation:
            self.neuron_config.on_device_generation.vocab_size = config.vocab_size
        self.token_buckets = bucket.token_sizes(n_positions)
        self.context_buckets = bucket.context_sizes(context_length_estimate, self.token_buckets)
        self.batch_sizes = bucket.batch_sizes(batch_size)
        self.context_batch_sizes = [1] if self.neuron_config.continuous_batching else self.batch_sizes
        self.decoder_lm_head = DecoderLmHead(self, tp_degree, self.token_buckets, self.batch_sizes)
        self.decoder_lm_head_for_speculation: Dict[Any, Any] = {}
        self._checkpoint: Optional[str] = None
        self._device: Any = None  # the backing model (weights + KV cache), from to_neuron()
        self._generation: Optional[DeviceGeneration] = None
        self.loaded_ranks: Optional[List[int]] = None  # the fake's records (see the module docstring)
        self.step_inputs: List[Dict[str, Any]] = []

    # --- lifecycle (base.py) ---------------------------------------------------------------------------------------

    def load(self, directory):
        self._compiled_artifacts_directory = directory

    def to_neuron(self):
        if self.amp not in AMPS:
            raise ValueError(f"fake: amp {self.amp!r} is not one of {AMPS}")
        ranks = self._device_ranks()
        num_slots, max_len = max(self.batch_sizes), max(self.token_buckets)
        if self.neuron_config.is_eagle_draft:
            self._device = _backing.load_eagle_draft(self._checkpoint, num_slots, max_len)
        else:
            self._device = _backing.load_model(self._checkpoint, num_slots, max_len)
        generation = self.neuron_config.on_device_generation
        if generation:
            self.decoder_lm_head.validate_generation_configs(generation)
            self._generation = DeviceGeneration(generation, num_slots, self.config.vocab_size)
        kernels = self._kernels()
        directory = getattr(self, "_compiled_artifacts_directory", None)
        if directory is not None:
            if not os.path.isdir(directory):
                raise FileNotFoundError(f"Did not find directory: {directory}.")
            for neff in kernels.values():
                if not os.path.isfile(os.path.join(directory, neff)):
                    raise FileNotFoundError(
                        "Could not find a matching NEFF for your HLO in this directory. Ensure that the model you "
                        "are trying to load is the same type and has the same parameters as the one you saved or "
                        'call "save" on this model to reserialize it.')
            LOAD_LOG.append(type(self).__name__)
        else:
            COMPILE_LOG.append(type(self).__name__)
        self.decoder_lm_head.program = kernels
        self.loaded_ranks = ranks

    def _device_ranks(self) -> List[int]:
        """The ranks this process holds: local_tp of them from rank_id * local_tp, in a group of pp_stages *
        tp_degree devices (see the module docstring)."""
        nc, tp = self.neuron_config, self.decoder_lm_head.tp_degree
        local = tp if nc.local_tp is None else nc.local_tp
        start, group = nc.rank_id * local, nc.pp_stages * tp
        if local < 1 or tp % local or start + local > group:
            raise RuntimeError(f"the fake TNx: NEURON_RANK_ID={nc.rank_id} with NEURON_LOCAL_TP={nc.local_tp} puts "
                               f"devices {start}..{start + local - 1} in a group of {group} (tp_degree {tp}): the "
                               "hosts' local TP must divide tp_degree and each host's ranks lie within the group")
        return list(range(start, start + local))

    def save(self, directory, sharded_weights=False):
        if os.path.isfile(directory):
            raise FileExistsError(f"Artifacts should be saved to a directory. Found existing file: {directory}")
        os.makedirs(directory, exist_ok=True)
        if self.decoder_lm_head.program is None:
            raise AttributeError("'NoneType' object has no attribute 'get_kernels'")
        for name, neff in self.decoder_lm_head.program.items():
            with open(os.path.join(directory, neff), "w") as f:
                f.write(name)
        if sharded_weights:
            assert self.neuron_config.on_device_embedding, \
                "on_device_embedding must be True to save and load presharded weights"
            raise NotImplementedError("the contract fake does not write pre-sharded weights")

    def reset(self):
        if self._device is not None:
            self._device.k_cache.zero_()
            self._device.v_cache.zero_()

    def update_generation_config(self, generation_config: GenerationConfig):
        self.decoder_lm_head.update_generation_config(generation_config)

    def enable_speculative_decoder(self, speculation_length, batch_sizes=None, token_tree=None):
        raise NotImplementedError("the contract fake does not model speculative_forward")

    def _kernels(self) -> Dict[str, str]:
        """Kernel name -> NEFF file name; the name hashes everything the real HLO depends on (hash_hlo)."""
        nc = self.neuron_config.to_json()
        nc.pop("rank_id")  # ParallelKernel.load takes the rank's devices; the HLO, hence the NEFF, has no rank
        generation = nc.pop("on_device_generation", None)
        if generation and generation.get("dynamic"):
            for name in ("top_k", "top_p", "temperature", "top_p_min_tokens"):  # device inputs, not constants
                generation.pop(name, None)
        arch = {k: getattr(self.config, k, None) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                          "num_attention_heads", "num_key_value_heads",
                                                          "intermediate_size")}
        signature = [type(self).__name__, arch, self.amp, self.decoder_lm_head.tp_degree, nc, generation]
        names = [f"token-{n}-{b}" for n in self.token_buckets for b in self.batch_sizes]
        names += [f"context-{c}-{b}" for c in self.context_buckets for b in self.context_batch_sizes]
        return {name: hashlib.sha256(json.dumps([signature, name], sort_keys=True, default=str).encode())
                .hexdigest()[:20] + ".neff" for name in names}

    # --- forward (base.py _preprocess / _forward / _postprocess) -----------------------------------------------

    def _check_compiled(self) -> None:
        if self.decoder_lm_head.program is None:
            raise AttributeError("'NoneType' object has no attribute 'execute': call to_neuron() first")

    def _run(self, input_ids, cache_ids, start_ids, prev_hidden=None):
        self._check_compiled()
        nc = self.neuron_config
        if not nc.continuous_batching or start_ids is None:
            raise NotImplementedError("the contract fake models continuous batching only (pass start_ids)")
        input_ids = _int_tensor("input_ids", input_ids)
        cache_ids = _int_tensor("cache_ids", cache_ids)
        start_ids = _int_tensor("start_ids", start_ids).flatten()
        self.step_inputs.append({"input_ids": input_ids.tolist(), "cache_ids": cache_ids.tolist(),
                                 "start_ids": start_ids.tolist()})
        if input_ids.dim() != 2 or cache_ids.shape != input_ids.shape:
            raise ValueError(f"with continuous batching input_ids and cache_ids are [n, tokens] (padding_side right, "
                             f"2D cache ids); got {list(input_ids.shape)} and {list(cache_ids.shape)}")
        n, length = input_ids.shape
        if start_ids.shape[0] != n:
            raise ValueError(f"start_ids has {start_ids.shape[0]} entries for {n} rows")
        batch = nc.continuous_batching.batch_size_for_shared_caches
        if not all(0 <= int(s) < batch for s in start_ids):
            raise IndexError(f"start_ids {start_ids.tolist()} must be KV lines in [0, {batch})")
        eagle = nc.is_eagle_draft or nc.is_eagle_target
        if nc.is_eagle_draft and prev_hidden is None:
            raise TypeError("an EAGLE draft's forward needs prev_hidden")
        if (eagle or length > 1) and int(cache_ids.flatten()[0]) == 0:
            return self._context(input_ids, cache_ids, start_ids, prev_hidden)
        if length > 1:
            speculation_batches = [b for (_, b) in self.decoder_lm_head_for_speculation.keys()]
            assert n in speculation_batches, \
                f"invalid batch size for speculative forward ({n} not in {speculation_batches})"
        return self._token_generation(input_ids, cache_ids, start_ids, prev_hidden)

    def _context(self, input_ids, cache_ids, start_ids, prev_hidden):
        n, length = input_ids.shape
        estimate = bucket.find(self.context_buckets, length)
        assert estimate is not None and length <= estimate, \
            f"invalid input prompt length ({length} <= {estimate})"
        outputs, hiddens = [], []
        for row in range(n):  # context_batch_sizes == [1]: one sequence per context-encoding run
            tokens = torch.zeros(1, estimate, dtype=torch.int64)
            tokens[0, :length] = input_ids[row].to(torch.int64)
            slot = int(start_ids[row])
            last = int(cache_ids[row].max())  # last_token_id = cache_ids.max(dim=1)
            logits, hidden = self._device_forward(tokens, [slot], [0], prev_hidden, row, estimate)
            outputs.append(self._emit(logits[0, last][None], [slot]))
            hiddens.append(hidden)
        out = torch.cat(outputs, dim=0)
        if self.neuron_config.is_eagle_target:
            return out, torch.cat(hiddens, dim=0)
        return out

    def _token_generation(self, input_ids, cache_ids, start_ids, prev_hidden):
        batch = self.neuron_config.continuous_batching.batch_size_for_shared_caches
        index = start_ids.to(torch.int64)
        full_ids = torch.zeros(batch, 1, dtype=torch.int64)
        full_cache = torch.zeros(batch, 1, dtype=torch.int64)  # lines not in start_ids: token 0 at cache id 0
        full_ids[index] = input_ids.to(torch.int64)
        full_cache[index] = cache_ids.to(torch.int64)
        if int(full_cache.max()) >= max(self.token_buckets):
            raise ValueError(f"cache id {int(full_cache.max())} is past the compiled n_positions "
                             f"{max(self.token_buckets)}")
        full_hidden = None
        if prev_hidden is not None:
            full_hidden = torch.zeros(batch, 1, prev_hidden.shape[-1])
            full_hidden[index] = prev_hidden.reshape(len(index), 1, -1).float()
        logits, hidden = self._device_forward(full_ids, list(range(batch)), full_cache[:, 0].tolist(),
                                              full_hidden, None, 1)
        out = self._emit(logits[:, -1], list(range(batch)))
        n = len(index)
        out = out[:n] if torch.equal(index, torch.arange(n)) else out[index]  # _postprocess: gather by seq_ids
        if self.neuron_config.is_eagle_target:
            return out, hidden
        return out

    def _device_forward(self, tokens, slots, starts, prev_hidden, row, width):
        """(logits [B, T, V], hidden or None) of the backing model."""
        nc = self.neuron_config
        if nc.is_eagle_draft:
            if row is None:
                hidden_in = prev_hidden
            else:  # context: this row's previous hidden states, right-padded to the bucket
                hidden_in = torch.zeros(1, width, prev_hidden.shape[-1])
                take = min(width, prev_hidden.shape[1])
                hidden_in[0, :take] = prev_hidden[row, :take].float()
            return self._device.eagle_forward(tokens, hidden_in, slots, starts)
        if nc.is_eagle_target:
            return _backing.target_with_hidden(self._device, tokens, slots, starts)
        return self._device.forward(tokens, slots, starts), None

    def _emit(self, logits: torch.Tensor, lines: List[int]) -> torch.Tensor:
        """Token ids [N, 1] (on-device generation, with each line's parameters) or cast logits [N, vocab]."""
        if self._generation is not None:
            return self._generation.sample(logits, lines).reshape(-1, 1)
        return logits[:, : self.config.vocab_size].to(getattr(torch, self.neuron_config.cast_logits_dtype))
