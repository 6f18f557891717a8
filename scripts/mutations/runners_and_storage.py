"""Mutations of the runtime's model files, full volumes, a lost group, the Neuron runners (NxDI, TNx, compiled
buckets) and the compile-artifact store's leases."""

from .definition import Mutation
from .selections import (CACHE, COMPILED_BUCKETS, DAMAGED_ENTRY, FETCH_FULL, GROUP_KILLED, MODEL_FILES, NXDI_RUNNER,
                         NXDI_SUITE, STORE_FULL, TNX_SUITE)

MUTATIONS = [
    Mutation(
        "checkpoint: a damaged safetensors file reported without its path and the fix", "runners/checkpoint.py",
        "        except SafetensorError as exc:\n", "        except NotImplementedError as exc:\n",
        MODEL_FILES + ("-k", "damaged_weights"),
    ),
    Mutation(
        "tokenizer: a folder without tokenizer files reported as transformers' own error", "server/tokenizer.py",
        "        if not files:\n", "        if False:\n",
        MODEL_FILES + ("-k", "tokenizer"),
    ),
    Mutation(
        "fetch: a full volume is an OSError traceback, not a FetchError", "fetch.py",
        "with no_space_as(FetchError, dest,", "with no_space_as(OSError, dest,",
        FETCH_FULL,
    ),
    Mutation(
        "store: a put that fills the store leaves its partial entry", "artifacts/store.py",
        "                self._discard(key.digest)\n", "",
        STORE_FULL,
    ),
    Mutation(
        "store: a fetch into a full folder is an OSError, not a CacheError", "artifacts/store.py",
        "with no_space_as(CacheError, dest,", "with no_space_as(OSError, dest,",
        STORE_FULL,
    ),
    Mutation(
        "prepare: a compile that fills its volume is an OSError, not a CacheError", "artifacts/prepare.py",
        "with no_space_as(CacheError, local,", "with no_space_as(OSError, local,",
        STORE_FULL,
    ),
    Mutation(
        "prepare: an entry whose writer died before its manifest is recompiled without a warning",
        "artifacts/prepare.py",
        "            if unfinished:\n", "            if False:\n",
        DAMAGED_ENTRY,
    ),
    Mutation(
        "cli: a leader whose group is lost stays ready until it exits", "cli.py",
        "        for served in served_by:\n            served.stop_accepting()\n",
        "        for served in served_by:\n            pass\n",
        GROUP_KILLED,
    ),
    Mutation(
        "nxdi: fillers at position 1 (they overwrite a resting sequence's K/V)", "runners/neuron_nxdi.py",
        "return min(max(1, self._next_position.get(slot, 1)), self.capacity().max_model_len - 1)",
        "return 1",
        NXDI_SUITE,
    ),
    Mutation(
        "nxdi: fused token count read from the padding, not next_pos - pos", "runners/neuron_nxdi.py",
        "counts = (next_positions.reshape(-1).to(torch.int64) - torch.tensor(positions, dtype=torch.int64)).tolist()",
        "counts = (accepted != -1).sum(dim=1).tolist()",
        NXDI_SUITE,
    ),
    Mutation(
        "nxdi: one-token prompts left to NxDI's padding (position 1 pads)", "runners/neuron_nxdi.py",
        "length = len(prompt) if len(prompt) > 1 else max_context_length",
        "length = len(prompt)",
        NXDI_SUITE,
    ),
    Mutation(
        "nxdi: no per-request limit sent as top_k -1 (uniform random on NxDI)", "runners/neuron_nxdi.py",
        "params[:, 0].clamp_(1, global_top_k)",
        "params[:, 0] = torch.where(params[:, 0] == global_top_k, -1.0, params[:, 0])",
        NXDI_SUITE,
    ),
    Mutation(
        "nxdi: the sampling tensor in arrival order, not the rows' slot order", "runners/neuron_nxdi.py",
        "sampling_params=device_sampling_tensor(full.sampling, self.global_top_k),",
        "sampling_params=device_sampling_tensor(list(batch.sampling) + [GREEDY] * (len(full.slots) - "
        "len(batch.slots)), self.global_top_k),",
        NXDI_SUITE,
    ),
    Mutation(
        "nxdi: store artifacts load the compile host's checkpoint path", "runners/neuron_nxdi.py",
        "rebind_checkpoints(self.model.config, self.model_path, self._draft_path())",
        "pass",
        NXDI_RUNNER + ("-k", "this_pods_checkpoints"),
    ),
    Mutation(
        "nxdi: only the target's path rebound, not the draft's", "runners/neuron_nxdi.py",
        "spec.draft_model_path = str(draft_path)",
        "pass",
        NXDI_RUNNER + ("-k", "this_pods_checkpoints"),
    ),
    Mutation(
        "nxdi: the worker class read from the class after a fused instance mutated it", "runners/nxdi_models.py",
        "decoder = _DECODER_CLASSES.setdefault(cls, cls._model_cls)\n    cls._model_cls = decoder",
        "decoder = cls._model_cls",
        NXDI_RUNNER + ("-k", "compiles_again"),
    ),
    Mutation(
        "nxdi: multimodal model types let through", "runners/nxdi_models.py",
        "    if model_type in NOT_TEXT_ONLY:\n        raise",
        "    if model_type in ():\n        raise",
        NXDI_RUNNER + ("-k", "multimodal"),
    ),
    Mutation(
        "nxdi: an unknown override passed on (NxDI only logs it)", "runners/nxdi_config.py",
        "return sorted(key for key in overrides if not hasattr(neuron_config, key))",
        "return []",
        NXDI_RUNNER + ("-k", "overrides or later_release"),
    ),
    Mutation(
        "nxdi: neuron_config_overrides dropped", "runners/nxdi_config.py",
        "return {**kwargs, **copy.deepcopy(config.neuron_config_overrides)}",
        "return kwargs",
        NXDI_RUNNER + ("-k", "overrides"),
    ),
    Mutation(
        "compiled: every decode step in the smallest token-generation bucket", "runners/compiled_graphs.py",
        "line = self.line_bucket(max(positions) + 1)",
        "line = self.lines[0]",
        COMPILED_BUCKETS,
    ),
    Mutation(
        "compiled: every decode step over all the slots (one client pays for max_num_seqs rows)",
        "runners/compiled_graphs.py",
        "batch = self.batch_bucket(max(slots) + 1)",
        "batch = self.num_slots",
        COMPILED_BUCKETS,
    ),
    Mutation(
        "neuron: a global top-k above the device's limit accepted", "runners/device_sampling.py",
        "if config.sampling.on_device and top_k > MAX_DEVICE_TOP_K:",
        "if False:",
        NXDI_RUNNER + ("-k", "device_limit"),
    ),
    Mutation(
        "tnx: lines without a row fed at position 0 (TNx writes them: a resting sequence loses its first K/V)",
        "runners/neuron_tnx.py",
        "cache = torch.full((lines, 1), self.config.max_model_len - 1, dtype=torch.int32)",
        "cache = torch.zeros((lines, 1), dtype=torch.int32)",
        TNX_SUITE,
    ),
    Mutation(
        "tnx: per-line sampling never pushed to the device", "runners/neuron_tnx.py",
        "if self._lines[slot] != line:",
        "if self._lines[slot] is None:",
        TNX_SUITE,
    ),
    Mutation(
        "tnx: every token of a fused step kept (the counts ignored)", "runners/neuron_tnx.py",
        "return first_tokens([rows[line] for line in lines], [numbers[line] for line in lines], wanted)",
        "return first_tokens([rows[line] for line in lines], [len(rows[line]) for line in lines], wanted)",
        TNX_SUITE,
    ),
    Mutation(
        "tnx: a one-token prompt sent unpadded (TNx runs it as token generation)", "runners/neuron_tnx.py",
        "ids = list(prompt) + [0] * (2 - len(prompt)) if len(prompt) < 2 else list(prompt)",
        "ids = list(prompt)",
        TNX_SUITE,
    ),
    Mutation(
        "tnx: int32 start_ids for EAGLE's decoder (it indexes host tensors with them as given)",
        "runners/neuron_tnx.py",
        "dtype=torch.int64 if eagle else torch.int32",
        "dtype=torch.int32",
        ("tests/runtime_tests/runners/test_tnx_runner.py", "-k", "eagle"),
    ),
    Mutation(
        "tnx: neuron_config_overrides merged before the runner's own keywords (an override of fuse_qkv lost)",
        "runners/tnx_config.py",
        "kwargs.update(checked_overrides(config.neuron_config_overrides))",
        "kwargs = {**checked_overrides(config.neuron_config_overrides), **kwargs}",
        ("tests/runtime_tests/runners/test_tnx_runner.py", "-k", "overrides"),
    ),
    Mutation(
        "tnx: every model type of TNx's registry let through (gptj, bloom ... reach from_pretrained)",
        "runners/tnx_models.py",
        "served = [name for name in SERVED_MODEL_TYPES if name in mapping]",
        "served = sorted(mapping)",
        ("tests/runtime_tests/runners/test_tnx_runner.py", "-k", "cannot_drive"),
    ),
    Mutation(
        "cache: a held compile lease never renewed (a long compile loses its lock)", "artifacts/store.py",
        "while not self._stop.wait(self.ttl_s / 3):",
        "while not self._stop.wait(self.ttl_s * 3):",
        CACHE,
    ),
    Mutation(
        "cache: a holder back from a freeze deletes the lease that replaced its own", "artifacts/file_store.py",
        "if not mine or now.token != token:\n                return False",
        "if not mine:\n                return False",
        CACHE,
    ),
    Mutation(
        "cache: the sweep removes a live compile's staging folder", "artifacts/folder.py",
        "        os.kill(int(pid), 0)\n",
        "        raise ProcessLookupError\n",
        CACHE,
    ),
    Mutation(
        "cpu_threads: a pod's CPU limit ignored (a 2-CPU pod on a 64-core node starts 64 threads)",
        "runners/cpu_threads.py", "        cpus = min(cpus, math.floor(quota))", "        pass",
        ("tests/runtime_tests/runners/test_cpu_threads.py",),
    ),
    Mutation(
        "cpu_threads: a cgroup v1 quota read only at the host's path (a container without its cgroup namespace "
        "gets no cap)", "runners/cpu_threads.py",
        "            for folder in (root / controllers / path.lstrip(\"/\"), root / controllers):",
        "            for folder in (root / controllers / path.lstrip(\"/\"),):",
        ("tests/runtime_tests/runners/test_cpu_threads.py",),
    ),
]
