"""models/model_base.py: NeuronBaseForCausalLM (forward, reset) and the traced graphs' math, after
src/neuronx_distributed_inference/models/model_base.py at 5de79de (0.3), e07f056 (0.6), cd3abf3 (0.8), ef2731e (0.9).

forward (keywords as the real signature: input_ids, seq_ids, attention_mask, position_ids, ..., sampling_params):
* input_ids / position_ids / seq_ids / attention_mask must be int32 or int64 tensors (NxDI turns int64 into int32,
  model_wrapper.convert_int64_to_int32; anything else reaches the compiled int32 inputs with the wrong type, which
  the fake refuses with TypeError), sampling_params float32 [B, 3] (the compiled input's type).
* attention_mask None: inferred from position_ids (ones before each row's position); seq_ids None: arange(B).
* sampling_params None: the default (1, 1.0, 1.0) rows; validated when on-device sampling is on; from 0.6
  infer_sampling_params rewrites the caller's tensor in place (temperature 0 -> top_k = top_p = 1).
* Context encoding iff position_ids.min() == 0 (_is_prefill), else the fused speculation graph when enabled,
  else token generation (one token per row). The context graph pads to its bucket with (pad_token_id, 0, 1) for
  (input_ids, attention_mask, position_ids) and reads the hidden state at the FIRST maximal position_id
  (torch.max(...).indices): right padding must carry position 0, and a 1-token prompt padded by NxDI itself
  reads the pad at index 1 (it has position 1).
* On-device sampling on: `.tokens` / `.hidden_states` int32 [B] (the sampler flattens), `.logits` None. Off:
  `.logits` (and `.tokens`) float32 [B, 1, V].
* Fused speculation (speculation_length k): `.fused_outputs`. Context encoding: [first token padded to (B, k),
  next_input_ids (B, 1), next_attention_mask (B, seq_len), next_pos_ids (B, 1) = sum(attention_mask)]. Token
  generation (_token_gen_forward + _tkg_postprocessor): the draft runs k times from the input token (the k-th run
  only fills its KV cache), the target scores [input, d1..d_{k-1}] at p..p+k-1 and picks argmax at each position
  (the target's `is_for_speculation` path: per-request sampling is NOT applied after the first token; do_sample
  cannot be traced), n = 1 + contiguous matches of d1..d_{k-1}, so ONE STEP EMITS 1..k TOKENS = 1..
  speculation_length; accepted (B, k) int32 padded with 0 up to 0.7 and -1 from 0.8 (acceptance_padding_token,
  cd3abf3), next_input_ids (B, 1) (found by counting non-pad tokens: wrong when an accepted token equals the pad
  0), next_attention_mask, next_pos_ids (B, 1) = position_ids + n. EAGLE (enable_eagle_speculation) has the same
  step shape (_eagle_token_gen_forward: k-1 drafts, the target over k tokens, the same postprocessor); the fake
  runs it with a plain draft checkpoint and the EAGLE draft's argmax, not the draft's hidden-state input.
* A fused-speculation instance replaces `_model_cls` with NeuronFusedSpecModel: on the CLASS up to 0.6
  (`self.__class__._model_cls`), on the instance from 0.7 (fcb5a86). A FusedSpecNeuronConfig whose worker_cls is
  NeuronFusedSpecModel, or a plain instance built while the class holds it, fails at compile and load as the real
  NeuronFusedSpecModel.__init__ does (AttributeError on config.fused_spec_config.draft_config).
* Every host of a multi-node group must call forward with the same inputs (examples/multi_node.md): the fake
  records each call's (input_ids, position_ids, seq_ids, sampling_params) as given, in `step_inputs`, so that a
  test can compare what the hosts ran.
* The fake computes in float32 on the CPU whatever torch_dtype says (the real casts to it, bfloat16 by default),
  and refuses (NotImplementedError, at construction) the features whose graphs it does not model (see
  config.UNMODELLED and _refuse_unmodelled) rather than ignoring them.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from neuronx_distributed_inference._release import at_least
from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.config import UNMODELLED
from neuronx_distributed_inference.models.model_wrapper import (
    CONTEXT_ENCODING_MODEL_TAG, FUSED_SPECULATION_MODEL_TAG, TOKEN_GENERATION_MODEL_TAG, ModelWrapper,
    generate_buckets)
from neuronx_distributed_inference.modules.generation import sampling

#: compile() calls that wrote a model.pt, since this fake was installed.
COMPILES = 0


class NeuronBaseModel(torch.nn.Module):
    """The traced decoder of the real (`_model_cls`, FusedSpecNeuronConfig.worker_cls); the fake's math is
    neuronmodel_runtime.runners.llama.LlamaModel, built at load."""


class NeuronFusedSpecModel(torch.nn.Module):
    """The real's fused draft+target module; here the fused math lives in NeuronBaseForCausalLM."""


_P = inspect.Parameter
_NAMES = ["input_ids", "seq_ids", "attention_mask", "position_ids", "past_key_values", "inputs_embeds",
          "sampling_params", "prev_hidden", "labels", "use_cache", "output_attentions", "output_hidden_states",
          "adapter_ids", "medusa_args", "return_dict", "llava_args", "input_capture_hook"]
_NAMES += (["tensor_capture_hook"] if at_least((0, 9)) else []) + [
    "slot_mapping", "block_table", "full_context_lens", "computed_context_lens"] + (
    ["tf_args"] if at_least((0, 7)) else [])
FORWARD_SIGNATURE = inspect.Signature(
    [_P("self", _P.POSITIONAL_OR_KEYWORD)]
    + [_P(n, _P.POSITIONAL_OR_KEYWORD, default=[] if n == "llava_args" else None) for n in _NAMES])
_INERT = {"use_cache", "output_attentions", "output_hidden_states", "return_dict", "labels"}


def _integer(name, t):
    if t is not None and (not torch.is_tensor(t) or t.dtype not in (torch.int32, torch.int64)):
        raise TypeError(f"{name} must be an int32 or int64 tensor (NxDI converts int64 to int32 for the compiled "
                        f"graph), got {type(t).__name__ if not torch.is_tensor(t) else t.dtype}")


class NeuronBaseForCausalLM(NeuronApplicationBase):
    _model_cls = None
    _hf_architectures: tuple = ()  # the fake: checkpoints whose math this class backs

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        nc = self.neuron_config
        if at_least((0, 8)) and nc.is_chunked_prefill:  # cd3abf3
            raise NotImplementedError("Chunked Prefill is not available in NxDI for now")
        if nc.enable_fused_speculation and self.fused_spec_config is None:  # enable_context_encoding's deepcopy
            raise AttributeError("'NoneType' object has no attribute 'draft_config'")
        self._refuse_unmodelled()
        self.text_config = self.config.get_text_config()
        self.vocab_size = self.text_config.vocab_size
        self.padding_side = nc.padding_side
        self.kv_cache_populated = False
        self.sampler = None
        self.default_sampling_params = sampling.prepare_sampling_params(batch_size=nc.batch_size)
        low = 128 if nc.enable_bucketing else None
        cte = (nc.enable_bucketing and nc.context_encoding_buckets) or generate_buckets(
            low or nc.max_context_length, nc.max_context_length)
        tkg = (nc.enable_bucketing and nc.token_generation_buckets) or generate_buckets(low or nc.max_length,
                                                                                         nc.max_length)
        if nc.enable_fused_speculation:  # 5de79de: the class attribute, so every later instance too; fcb5a86: its own
            if at_least((0, 7)):
                self._model_cls = NeuronFusedSpecModel
            else:
                self.__class__._model_cls = NeuronFusedSpecModel
        self._decoder_cls = self._model_cls  # what the wrappers are built with (model_cls=self._model_cls)
        self.context_encoding_model = ModelWrapper(self, CONTEXT_ENCODING_MODEL_TAG, nc.ctx_batch_size, cte)
        if nc.enable_fused_speculation:
            self.fused_spec_model = ModelWrapper(self, FUSED_SPECULATION_MODEL_TAG, nc.tkg_batch_size, tkg)
        else:
            self.token_generation_model = ModelWrapper(self, TOKEN_GENERATION_MODEL_TAG, nc.tkg_batch_size, tkg)
        self.models = [self.context_encoding_model, self.get_generation_model()]
        self._target = self._draft = None
        self.step_inputs = []  # the fake's record: one entry per forward (see the module docstring)

    def _refuse_unmodelled(self):
        nc = self.neuron_config
        bad = [f"{k}={getattr(nc, k)!r}" for k, d in UNMODELLED.items() if getattr(nc, k, d) != d]
        bad += ["speculation_length without fused speculation"] if nc.speculation_length and not \
            nc.enable_fused_speculation else []
        bad += ["chunked prefill"] if nc.is_chunked_prefill else []
        bad += ["token_generation_batches"] if getattr(nc, "token_generation_batches", None) else []
        if not (nc.tkg_batch_size == nc.max_batch_size == nc.kv_cache_batch_size) or (
                not nc.is_continuous_batching and nc.ctx_batch_size != nc.max_batch_size):
            bad.append("ctx/tkg/max/kv_cache batch sizes other than tkg == max == kv_cache (and ctx == those "
                       "without continuous batching)")
        if bad:
            raise NotImplementedError(f"the fake NxDI does not model {', '.join(bad)}")

    def _check_decoder_classes(self):
        """What instantiating the wrappers' decoder (at trace and at load) fails on: a plain model built with
        NeuronFusedSpecModel (left on the class by an earlier fused instance, up to 0.6) reads
        config.fused_spec_config.draft_config of None; so does a fused model whose worker_cls is
        NeuronFusedSpecModel, on its draft config (NeuronFusedSpecModel.__init__ builds worker_cls(draft_config))."""
        spec = self.fused_spec_config
        fused = self.neuron_config.enable_fused_speculation
        if (self._decoder_cls is NeuronFusedSpecModel and not fused) or (
                fused and spec is not None and spec.worker_cls is NeuronFusedSpecModel):
            raise AttributeError("'NoneType' object has no attribute 'draft_config'")

    def _check_traceable(self):
        """What the real trace (compile) fails on."""
        self._check_decoder_classes()
        nc = self.neuron_config
        if nc.is_continuous_batching and nc.ctx_batch_size != 1:
            raise AssertionError("only supports single seq_id")  # kv_cache_manager.update_kv_by_layer_id
        if nc.enable_fused_speculation and at_least((0, 7)) and nc.is_eagle3 and nc.enable_token_tree:
            # fcb5a86 NeuronFusedSpecModel.__init__
            raise AssertionError("We do not yet support integration of EAGLE3 and token tree")
        if nc.enable_token_tree:
            raise NotImplementedError("the fake NxDI does not model token trees (token_tree_config)")
        if not nc.enable_fused_speculation:
            return
        assert nc.on_device_sampling_config  # NeuronFusedSpecModel._context_encoding_forward
        draft = self.fused_spec_config.draft_config.neuron_config
        if nc.speculation_length < 1 or nc.speculation_length in self.context_encoding_model.buckets:
            raise NotImplementedError("the fake NxDI models fused speculation with 1 <= speculation_length < every "
                                      "context bucket (the real graph is empty, or takes a prefill for speculation)")
        if draft.on_device_sampling_config is None:
            raise NotImplementedError("the fake NxDI needs the draft config's on_device_sampling_config (the "
                                      "recipe deep-copies the target's): the real draft would return logits")
        if nc.enable_eagle_speculation:
            if not draft.is_eagle_draft:
                raise ValueError("the EAGLE draft's neuron_config needs is_eagle_draft=True (its graph takes the "
                                 "target's hidden state); the fake refuses a plain draft config")
            if nc.on_device_sampling_config.do_sample:
                raise NotImplementedError("the fake NxDI does not model EAGLE's rejection sampling (do_sample)")
        elif nc.on_device_sampling_config.do_sample:
            # The target graph returns one sampled token per row instead of k argmax tokens, and
            # _tkg_postprocessor's target_tokens[:, :-1] fails while tracing.
            raise IndexError("too many indices for tensor of dimension 1")

    def _build_math(self):
        from neuronmodel_runtime.runners.checkpoint import build_weights, read_config, read_tensors
        from neuronmodel_runtime.runners.llama import LlamaModel

        nc = self.neuron_config

        def build(path, cls):
            cfg = read_config(Path(path), nc.max_length)
            if cfg.architecture not in cls._hf_architectures:
                raise NotImplementedError(f"the fake backs only Llama-family math: {cls.__name__} with a "
                                          f"{cfg.architecture} checkpoint ({path})")
            weights = build_weights(cfg, read_tensors(Path(path)), torch.device("cpu"), torch.float32)
            return LlamaModel(cfg, weights, num_slots=nc.kv_cache_batch_size + nc.kv_cache_padding_size,
                              max_len=nc.max_length)

        # shard on load: the checkpoint at config._name_or_path (checkpoint_loader_fn), the draft's at
        # fused_spec_config.draft_model_path
        self._check_decoder_classes()
        self._target = build(self._checkpoint_path(), type(self))
        self._samplers = {}
        if nc.enable_fused_speculation:
            spec = self.fused_spec_config
            self._draft = build(self._local_checkpoint(spec.draft_model_path),
                                getattr(spec, "draft_model_cls", None) or type(self))

    def _checkpoint_path(self):
        """checkpoint_loader_fn's model_path: `getattr(config, "_name_or_path", model_path)` up to 0.6; from 0.7
        (fcb5a86) a missing path falls back to model_path, the compiled artifacts' folder here."""
        path = getattr(self.config, "_name_or_path", None)
        if at_least((0, 7)) and (path is None or not os.path.exists(path)):
            path = self.model_path
        return self._local_checkpoint(path or self.model_path)

    @staticmethod
    def _local_checkpoint(path):
        """get_state_dict reads a folder's safetensors, else takes the path for a Hub model id: the fake has no
        Hub, and a folder without a checkpoint (the artifacts folder) has no weights to read."""
        if not os.path.isdir(path):
            raise OSError(f"{path} is not a local folder, so NxDI would look it up as a Hugging Face Hub model id "
                          "(the fake has no Hub)")
        if not any(name.endswith((".safetensors", ".bin")) for name in os.listdir(path)):
            raise FileNotFoundError(f"no checkpoint (safetensors) in {path}")
        return path

    def get_generation_model(self) -> ModelWrapper:
        return self.fused_spec_model if self.neuron_config.enable_fused_speculation else self.token_generation_model

    def forward(self, *args, **kwargs):
        a = FORWARD_SIGNATURE.bind(self, *args, **kwargs)
        a.apply_defaults()
        a = a.arguments
        extra = [n for n in _NAMES if n not in _INERT and n not in (
            "input_ids", "seq_ids", "attention_mask", "position_ids", "sampling_params", "input_capture_hook",
            "llava_args") and a[n] is not None] + (["llava_args"] if a["llava_args"] else [])
        if extra:
            raise NotImplementedError(f"the fake NxDI does not model forward arguments {extra}")
        input_ids, position_ids, sp = a["input_ids"], a["position_ids"], a["sampling_params"]
        for name in ("input_ids", "position_ids", "seq_ids", "attention_mask"):
            _integer(name, a[name])
        if sp is not None and (not torch.is_tensor(sp) or sp.dtype != torch.float32):
            raise TypeError(f"sampling_params must be a float32 tensor [B, 3] (the compiled input), got "
                            f"{sp.dtype if torch.is_tensor(sp) else type(sp).__name__}")
        self.step_inputs.append({name: None if a[name] is None else a[name].tolist()
                                 for name in ("input_ids", "position_ids", "seq_ids", "sampling_params")})
        if not at_least((0, 4)):  # 0.3 validates sampling first
            sp = self._sampling(sp)
        attention_mask = a["attention_mask"]
        if attention_mask is None:
            attention_mask = self._infer_attention_mask(position_ids)
        seq_ids = a["seq_ids"] if a["seq_ids"] is not None else torch.arange(input_ids.shape[0])
        if at_least((0, 4)):
            sp = self._sampling(sp)
        if a["input_capture_hook"] is not None:
            a["input_capture_hook"](self, [input_ids, attention_mask, position_ids, seq_ids, sp])
        if sp.shape[0] != input_ids.shape[0] or seq_ids.shape[0] != input_ids.shape[0]:
            raise RuntimeError("the fake NxDI: sampling_params and seq_ids need one row per input row (the compiled "
                               f"graph's shapes); got {tuple(sp.shape)}, {tuple(seq_ids.shape)} for "
                               f"{tuple(input_ids.shape)}")
        if position_ids.min().item() == 0:
            wrapper = self.context_encoding_model
        else:
            wrapper = self.get_generation_model()
        if not self.is_loaded_to_neuron:
            raise RuntimeError("Forward called before load. Run load() or load_state_dict() making calling forward")
        out = wrapper.forward(input_ids, attention_mask, position_ids, seq_ids, sp)
        if wrapper is self.context_encoding_model:
            self.kv_cache_populated = True
        result = CausalLMOutputWithPast(logits=None if self.on_device_sampling else out, hidden_states=out,
                                        attentions=None)
        if self.neuron_config.enable_fused_speculation:
            result.fused_outputs = out
            result.async_should_stop = False
        else:
            result.tokens = out
        if at_least((0, 9)):
            result.captured_tensors = None
        return result

    forward.__signature__ = FORWARD_SIGNATURE

    def _sampling(self, sp):
        sp = self.default_sampling_params if sp is None else sp
        if self.on_device_sampling:
            sampling.validate_sampling_params(sp, self.neuron_config.on_device_sampling_config)
        if at_least((0, 6)):
            sp = sampling.infer_sampling_params(sp)
        return sp

    def _infer_attention_mask(self, position_ids):
        assert position_ids is not None, "need to call forward with position_ids if attention_mask is not provided"
        batch_size, seq_len = position_ids.shape
        if seq_len != 1:
            compare = position_ids
        else:
            seq_len = int(torch.max(position_ids))
            compare = position_ids.expand(batch_size, seq_len) - 1
        return (compare >= torch.arange(seq_len).view(1, -1).expand(batch_size, seq_len)).to(position_ids.dtype)

    def reset(self):
        self.kv_cache_populated = False  # the KV cache itself is not cleared, as the real

    # ---- the compiled graphs (one compiled batch of rows; see model_wrapper for how rows get here) ----

    def _run_graph(self, tag, input_ids, attention_mask, position_ids, seq_ids, sampling_params):
        nc = self.neuron_config
        rows = [b for b in range(input_ids.shape[0]) if int(seq_ids[b]) != -1]  # -1: apply_seq_ids_mask padding
        pad = -1 if at_least((0, 8)) else 0  # acceptance_padding_token
        if tag == CONTEXT_ENCODING_MODEL_TAG:
            lines = [int(s) for s in seq_ids] if nc.is_continuous_batching else list(range(input_ids.shape[0]))
            if any(not 0 <= lines[b] < self._target.num_slots for b in rows):
                raise ValueError(f"the fake NxDI: seq_ids {seq_ids.tolist()} outside the KV cache's "
                                 f"{self._target.num_slots} lines")
            last = torch.max(position_ids, dim=1).indices  # the first maximal index
            logits = torch.zeros(input_ids.shape[0], self._target.vocab_size)
            for b in rows:
                tokens = input_ids[b:b + 1, : int(last[b]) + 1].long()
                logits[b] = self._target.last_logits(tokens, [lines[b]], [0])[0]
                if self._draft is not None:
                    self._draft.last_logits(tokens, [lines[b]], [0])
            out = self._sample(logits, sampling_params)
            if not nc.enable_fused_speculation:
                return out
            k, batch = nc.speculation_length, input_ids.shape[0]
            padded = torch.cat([out.view(batch, 1), torch.full((batch, k - 1), pad, dtype=torch.int32)], dim=1)
            next_pos = attention_mask.sum(dim=1, keepdim=True).to(torch.int32)
            return [padded, padded[:, :1], self._next_mask(next_pos, nc.seq_len, position_ids.dtype), next_pos]
        if input_ids.shape[1] != 1:
            raise RuntimeError(f"the fake NxDI: {tag} was compiled for one token per row (n_active_tokens=1), got "
                               f"{input_ids.shape[1]}; a prefill must start at position 0")
        pos = position_ids[:, 0].long()
        k = nc.speculation_length if tag == FUSED_SPECULATION_MODEL_TAG else 1
        for b in rows:
            p = int(pos[b])
            if p + k > nc.max_length:
                raise ValueError(f"the fake NxDI: row {b} writes positions up to {p + k - 1}, past max_length "
                                 f"{nc.max_length} (the real graph's write is out of range)")
            mask = attention_mask[b]
            if not (bool(mask[:p].all()) and not bool(mask[p:].any())):
                raise NotImplementedError("the fake NxDI models only the attention_mask NxDI infers from "
                                          "position_ids (ones before each row's position, zeros after)")
        batch, ids = input_ids.shape[0], input_ids.long()
        if tag == TOKEN_GENERATION_MODEL_TAG:
            logits = torch.zeros(batch, self._target.vocab_size)
            if rows:
                logits[rows] = self._target.forward(ids[rows], rows, pos[rows].tolist())[:, -1]
            return self._sample(logits, sampling_params)
        # fused speculation: k draft runs, the target scores [input, d1..d_{k-1}], greedy verification
        draft_nc = self.fused_spec_config.draft_config.neuron_config
        target = torch.zeros(batch, k, dtype=torch.int64)
        candidates = torch.zeros(batch, k + 1, dtype=torch.int64)
        if rows:
            current, found = ids[rows], [ids[rows, 0]]
            for i in range(k):
                logits = self._draft.last_logits(current, rows, (pos[rows] + i).tolist())
                if nc.enable_eagle_speculation and draft_nc.is_eagle_draft:
                    token = torch.argmax(logits, dim=-1)  # _sample_on_device: the EAGLE draft is argmax
                else:
                    token = self._sample(logits, sampling_params[rows], draft_nc).long()
                found.append(token)
                current = token[:, None]
            candidates[rows] = torch.stack(found, dim=1)
            scored = self._target.forward(candidates[rows, :k], rows, pos[rows].tolist())
            target[rows] = torch.argmax(scored, dim=-1)
        mismatch = (candidates[:, 1:k] != target[:, : k - 1]).cumsum(dim=-1) < 1
        n_matches = mismatch.sum(dim=-1, keepdim=True) + 1
        accepted = torch.where(torch.arange(k).expand(batch, k) < n_matches, target, pad).to(torch.int32)
        next_pos = (position_ids + n_matches).to(torch.int32)
        first_pad = (accepted != pad).to(torch.int).sum(dim=1)
        next_ids = accepted[torch.arange(batch), (first_pad + k - 1) % k].reshape(batch, 1)
        return [accepted, next_ids, self._next_mask(next_pos, attention_mask.shape[1], position_ids.dtype),
                next_pos]

    @staticmethod
    def _next_mask(next_pos, length, dtype):
        return (next_pos.expand(-1, length) - 1 >= torch.arange(length).view(1, -1)).to(dtype)

    def _sample(self, logits, sampling_params, neuron_config=None):
        """The graph's last step: the on-device sampler (token ids int32 [B]) or the logits [B, 1, V]."""
        nc = neuron_config or self.neuron_config
        if nc.on_device_sampling_config is None:
            return logits[:, None, :].float()
        sampler = self._samplers.setdefault(id(nc), sampling.Sampler(nc))
        return sampler(logits, sampling_params).to(torch.int32)


__all__ = ["COMPILES", "FORWARD_SIGNATURE", "NeuronBaseForCausalLM", "NeuronBaseModel", "NeuronFusedSpecModel"]
