"""Mutation testing of the sampling and speculative-verification math, and of the operator's subtle rules (the
scale subresource, status, compile gating, HPA ownership, reconcile under change, placement): each known mistake
must fail the tests.

For every mutation below, the script copies the repository's runtime and operator packages and their tests into a
temporary directory, applies the mutation as an exact text replacement (it stops at once, naming the mutation, when
the target text is not found exactly once, so the list cannot rot silently), runs only the test files that mutation
needs against the mutated copy, and requires that run to FAIL. Every selection of tests the mutations run must pass
on the unmutated code first. Each pytest process asserts, before collecting, that `neuronmodel_runtime` is imported from the copy and
that the imported module holds the mutated text; bytecode is never written, so no stale cache can hide a mutation.

Prints one line per mutation ("caught" / "NOT CAUGHT" / "ERROR") and exits non-zero if any mutation survives, any run
errors, or the unmutated run fails. Runs go on one worker per CPU core (`-j`), each worker on its own copy with torch's
threads split between them; each mutated run stops at its first failure.

Usage: python scripts/mutation.py [--only NAME_SUBSTRING] [-j JOBS] [-v]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "runtime/neuronmodel_runtime"
OPERATOR = "operator/neuronmodel_operator"

DISTRIBUTION = ("tests/runtime_tests/spec_decode/test_spec_distribution.py",)
SAMPLER = ("tests/runtime_tests/sampling/test_sampler_reference.py",)
PROCESSORS = ("tests/runtime_tests/sampling/test_processors.py",)
INVARIANCE = ("tests/runtime_tests/engine/test_speculation.py", "-k", "alone_or_in_any_batch")
STATUS = ("tests/operator_tests/test_status.py",)
BUILDERS = ("tests/operator_tests/test_builders.py",)
CRD = ("tests/operator_tests/test_crd.py",)
RECONCILE = ("tests/operator_tests/test_reconcile.py",)
HANDLERS = ("tests/operator_tests/test_handlers.py",)
OWNERSHIP = ("tests/operator_tests/test_ownership.py",)
RESOLVE = ("tests/operator_tests/test_resolve.py",)
NXDI_SUITE = ("tests/runtime_tests/runners/test_runner_suite.py", "-k", "nxdi")
TNX_SUITE = ("tests/runtime_tests/runners/test_runner_suite.py", "-k", "tnx")
CACHE = ("tests/runtime_tests/artifacts/test_store.py",)
NXDI_RUNNER = ("tests/runtime_tests/runners/test_nxdi_runner.py",)
COMPILED_BUCKETS = ("tests/runtime_tests/runners/test_compiled_runner.py", "-k", "line_bucket")
VLLM_ENGINE = ("tests/operator_tests/test_vllm_engine.py",)
HANDOFF = ("tests/runtime_tests/artifacts/test_handoff.py",)
SUPERVISE = ("tests/runtime_tests/artifacts/test_supervise.py",)
TENSOR_PARALLEL = ("tests/runtime_tests/distributed/test_tensor_parallel.py",)
CHANNEL = ("tests/runtime_tests/distributed/test_channel.py", "-k", "round_trips or travels")
SHARDED = ("tests/runtime_tests/distributed/test_sharded_weights.py", "-k", "read_only_their_shards")
NXDI_HOSTS = NXDI_RUNNER + ("-k", "each_host")
TNX_RANKS = ("tests/runtime_tests/runners/test_tnx_runner.py", "-k", "rank_variables")
NEURON_GROUP = ("tests/runtime_tests/distributed/test_neuron_ranks.py", "-k", "two_nxdi_hosts")
REQUEST_LIMITS = ("tests/runtime_tests/server/test_request_limits.py",)
FUZZ = ("tests/runtime_tests/server/test_fuzz.py",)
MODEL_FILES = ("tests/runtime_tests/test_model_files.py",)
FETCH_FULL = ("tests/runtime_tests/artifacts/test_fetch.py", "-k", "full_volume")
STORE_FULL = ("tests/runtime_tests/artifacts/test_store.py", "-k", "full or fills")
DAMAGED_ENTRY = ("tests/runtime_tests/artifacts/test_compile_job.py", "-k", "damaged_store_entry")
GROUP_KILLED = ("tests/runtime_tests/distributed/test_group_processes.py", "-k", "killed")
OVERLOAD = ("tests/runtime_tests/server/test_overload.py",)
DRA = ("tests/operator_tests/test_dra.py",)
TOPOLOGY = ("tests/runtime_tests/distributed/test_topology.py",)


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # file under `package`
    old: str  # exact text, present exactly once
    new: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions
    package: str = PACKAGE  # the package `path` is in

    @property
    def module(self) -> str:
        return self.package.split("/")[-1] + "." + self.path.removesuffix(".py").replace("/", ".")


MUTATIONS = [
    Mutation(
        "verify: bonus token drawn from position k_i-1 instead of k_i", "spec_decode/verify.py",
        "emitted.append(int(draw(ids[r, k_i][None], p_all[r, k_i][None], [gen])[0]))  # bonus",
        "emitted.append(int(draw(ids[r, k_i - 1][None], p_all[r, k_i - 1][None], [gen])[0]))  # bonus",
        DISTRIBUTION,
    ),
    Mutation(
        "verify: every draft position checked against position 0's target", "spec_decode/verify.py",
        "p, cand = p_all[r, j], ids[r, j]  # [K] each",
        "p, cand = p_all[r, 0], ids[r, 0]  # [K] each",
        DISTRIBUTION,
    ),
    Mutation(
        "draft: q without the row's top-k/top-p/temperature (softmax of raw logits)", "spec_decode/draft.py",
        "draft_probs[q_index, j] = target_probs(logits[q_index], params[q_rows], self.global_top_k)",
        "draft_probs[q_index, j] = torch.softmax(logits[q_index].float(), dim=-1)",
        DISTRIBUTION,
    ),
    Mutation(
        "verify: residual p instead of normalised (p - q)+", "spec_decode/verify.py",
        "residual = (p - q).clamp_min(0.0)  # draw() normalises",
        "residual = p  # draw() normalises",
        DISTRIBUTION,
    ),
    Mutation(
        "verify: acceptance min(1, q/p) instead of min(1, p/q)", "spec_decode/verify.py",
        "if uniforms[j] * q_x < p_x:",
        "if uniforms[j] * p_x < q_x:",
        DISTRIBUTION,
    ),
    Mutation(
        "sampler: top-p applied before temperature", "sampling/sampler.py",
        "probs = torch.softmax(scaled, dim=-1)  # [B, K]",
        'probs = torch.softmax(values.masked_fill(rank >= top_k, float("-inf")), dim=-1)  # [B, K]',
        SAMPLER,
    ),
    Mutation(
        "sampler: top-p drops the candidate crossing the threshold (NxDI's rule)", "sampling/sampler.py",
        "beyond_nucleus = (mass_before >= top_p) & (top_p < 1.0)  # [B, K]",
        "beyond_nucleus = (mass_before + probs > top_p) & (rank > 0) & (top_p < 1.0)  # [B, K]",
        SAMPLER,
    ),
    Mutation(
        "sampler: rows draw from another row's generator", "sampling/sampler.py",
        "tokens[index] = draw(candidate_ids, candidate_logprobs.exp(), [generators[i] for i in sampled])",
        "tokens[index] = draw(candidate_ids, candidate_logprobs.exp(), [generators[i] for i in reversed(sampled)])",
        INVARIANCE,
    ),
    Mutation(
        "processors: presence penalty applied per occurrence", "sampling/processors.py",
        '- column("presence_penalty") * (counts > 0)',
        '- column("presence_penalty") * counts',
        PROCESSORS,
    ),
    Mutation(
        "processors: repetition penalty ignores the prompt", "sampling/processors.py",
        "seen = in_prompt | (counts > 0)",
        "seen = counts > 0",
        PROCESSORS,
    ),
    Mutation(
        "processors: negative logits divided by the repetition penalty", "sampling/processors.py",
        "torch.where(sub > 0, sub / repetition, sub * repetition)",
        "sub / repetition",
        PROCESSORS,
    ),
    Mutation(
        "processors: logit_bias replaces the logit instead of adding to it", "sampling/processors.py",
        "out.index_put_((row_idx, token_idx), bias, accumulate=True)",
        "out.index_put_((row_idx, token_idx), bias, accumulate=False)",
        PROCESSORS,
    ),
    Mutation(
        "status: replicas counts ready pods, not all of them (an HPA over-scales)", "status.py",
        '"replicas": workload.total if workload else 0,', '"replicas": workload.ready if workload else 0,',
        STATUS, OPERATOR,
    ),
    Mutation(
        "crd: the scale subresource reads ready replicas", "crdgen.py",
        '"statusReplicasPath": ".status.replicas"', '"statusReplicasPath": ".status.readyReplicas"',
        CRD, OPERATOR,
    ),
    Mutation(
        "deployment: replicas written under autoscaling (fights the HPA)", "builders/deployment.py",
        "    if target.spec.autoscaling is None:\n", "    if True:\n",
        BUILDERS, OPERATOR,
    ),
    Mutation(
        "reconcile: a new compile key rolls the pods before its Job succeeds", "reconcile.py",
        "if previous is not None and previous.resolved.compile_key != target.resolved.compile_key:",
        "if False:",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "job: the compile Job named by the compile key alone (an edit re-applies an immutable template: 422)",
        "builders/job.py",
        'return f"{target.name}-compile-{digest[:CONTENT_CHARS]}"',
        'return f"{target.name}-compile-{target.resolved.compile_key[:CONTENT_CHARS]}"',
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: an edit outside the compile key compiles again", "reconcile.py",
        "        if job is not None:\n            compile_children = []\n", "        job = None\n",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: a failing compile's pods never read (status says BackoffLimitExceeded, not vLLM's own error)",
        "reconcile.py", "compile_pods=self._failed_attempts(job))", "compile_pods=())", RECONCILE, OPERATOR,
    ),
    Mutation(
        "status: the oldest failed compile attempt quoted instead of the newest",
        "serving_pods.py", '.get("creationTimestamp") or "", reverse=True)', '.get("creationTimestamp") or "")',
        STATUS, OPERATOR,
    ),
    Mutation(
        "reconcile: a template-only edit (a toleration) replaces the running compile Job of the same key",
        "reconcile.py",
        "next((job for job in of_key if job[\"metadata\"][\"name\"] != current and self._compiling(job)), None)",
        "None",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: a refused child is a permanent failure", "reconcile.py",
        "return Outcome(child_error=message)", "return Outcome(spec_error=message)",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "served: the served spec re-resolved under today's defaults (an operator upgrade rolls every model)",
        "served.py",
        'spec, resolved = api.parse_spec(record["spec"]), _resolved(record["resolved"])',
        'spec = api.parse_spec(record["spec"])\n            resolved = resolve(spec, defaults)',
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "served: an unreadable served record rolls the uncompiled spec (fails open)", "served.py",
        "        raise UnreadableRecord(", "        return None\n        raise UnreadableRecord(",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: a compiled compile-cache model takes the full run (about 12 requests) on every child event",
        "reconcile.py",
        "settled = not resolved.compile_job or self._compiled_job(target) is not None", "settled = not resolved.compile_job",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: a compiled model's refresh writes its status without its Job (it reads Compiling)", "reconcile.py",
        "self._write_status(body, target.resolved, target, None, workload, self._compiled_job(target),",
        "self._write_status(body, target.resolved, target, None, workload, None,",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: a multi-node status lists the leaders only (a worker's ImagePullBackOff is never shown)",
        "reconcile.py",
        '",".join(f"{k}={v}" for k, v in selector(target).items())', "selector_string(target)",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "scheduler hints: a group refused because every node group is taken gets no advice", "scheduler_hints.py",
        "if any(reason in refusal for reason in ANTI_AFFINITY):", "if False:",
        STATUS, OPERATOR,
    ),
    Mutation(
        "scheduler hints: an exclusive-topology key on no node is not named", "scheduler_hints.py",
        "if leader and (found := AFFINITY.search(refusal)):", "if False and (found := AFFINITY.search(refusal)):",
        STATUS, OPERATOR,
    ),
    Mutation(
        "handlers: retries run while kopf's peering has paused this replica", "handlers.py",
        "if await asyncio.get_running_loop().run_in_executor(self.executor, self.paused):", "if False:",
        HANDLERS, OPERATOR,
    ),
    Mutation(
        "peering: a peer of the same priority does not pause (kopf pauses both)", "peering.py",
        'int(info.get("priority", 0)) >= priority', 'int(info.get("priority", 0)) > priority',
        HANDLERS, OPERATOR,
    ),
    Mutation(
        "reconcile: a workload-kind change removes the old workload before the new one is ready", "reconcile.py",
        "if leaving is not None and _ready(workload):", "if leaving is not None:",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: a kind switch under autoscaling starts the new workload at 1 and switches once 1 is ready",
        "reconcile.py",
        "            match_replicas(self.kube, desired, live, live[_kind(leaving)])\n", "            pass\n",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: replicas -> autoscaling without the hand-over (the Deployment resets to 1)", "reconcile.py",
        "        hand_over_replicas(self.kube, desired, live)\n", "",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "configmap: one mutable runtime ConfigMap for every revision", "builders/configmap.py",
        'return f"{target.name}-runtime-{config_hash(target)[:CONTENT_CHARS]}"', 'return f"{target.name}-runtime"',
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: a runtime ConfigMap deleted while an old ReplicaSet still uses it", "stale_children.py",
        "                if (kind, meta[\"name\"]) in in_use:\n                    continue\n", "",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: hf:// revisions resolved again at every reconcile (replicas fetch whatever main is then)",
        "reconcile.py",
        'known = ((self._previous(body).get("resolved") or {}).get("revisions")) or {}', "known = {}",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: hf:// sources left unpinned (each pod resolves main when it starts)", "reconcile.py",
        "        target = target_from_body(body, self.defaults, pin)\n",
        "        target = target_from_body(body, self.defaults)\n",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "status: a refused spec drops the hf:// pins (its fix resolves main again: a new commit, a recompile)",
        "status.py",
        '"resolved": o.resolved.as_status() if o.resolved else _pins(o.previous),',
        '"resolved": o.resolved.as_status() if o.resolved else None,',
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "reconcile: children force-applied without the ownership check (a hand-made Service is taken over)",
        "reconcile.py", "        self._claim(target, desired)\n", "",
        OWNERSHIP, OPERATOR,
    ),
    Mutation(
        "reconcile: a deleted child stays known as the model's (whatever takes its name is taken over)",
        "reconcile.py", "key for key, live in (changed or {}).items() if live is None)",
        "key for key, live in (changed or {}).items() if False)",
        OWNERSHIP, OPERATOR,
    ),
    Mutation(
        "ownership: any ownerReference to the model counts, not only the controller's", "ownership.py",
        'return live is not None and (controller(live) or {}).get("uid") != uid',
        'return live is not None and uid not in {ref.get("uid") for ref in live["metadata"].get("ownerReferences") '
        'or []}',
        OWNERSHIP, OPERATOR,
    ),
    Mutation(
        "k8s: an admission policy's 403 retried and reported as RBAC drift", "k8s.py",
        " or self.status >= 500) and self.admission is None", " or self.status >= 500)",
        OWNERSHIP, OPERATOR,
    ),
    Mutation(
        "reconcile: a Hub that does not answer leaves no status (a new hf:// model shows nothing)", "reconcile.py",
        "            self._publish(body, previous, status.hub_unavailable(",
        "            (lambda *_: None)(body, previous, status.hub_unavailable(",
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "status: a serving model whose edit waits for the Hub reported as a new one (Pending, Ready False)",
        "status.py", '    if not previous.get("phase"):\n        verdicts = {"ArtifactsReady"',
        '    if True:\n        verdicts = {"ArtifactsReady"',
        RECONCILE, OPERATOR,
    ),
    Mutation(
        "status: a LeaderWorkerSet without observedGeneration (v0.7) read as never caught up", "status.py",
        'if "observedGeneration" in state or workload.get("kind") != "LeaderWorkerSet":', "if True:",
        STATUS, OPERATOR,
    ),
    Mutation(
        "resolve: partial-node pods left to the default scheduler (non-contiguous NeuronCores)", "resolve.py",
        "    if defaults.neuron_scheduler_name:\n        return defaults.neuron_scheduler_name, None\n",
        "    if defaults.neuron_scheduler_name:\n        return None, None\n",
        RESOLVE, OPERATOR,
    ),
    Mutation(
        "resolve: node paths mounted without --allow-host-path", "resolve.py",
        "    check_host_paths(spec, defaults)\n", "",
        RESOLVE, OPERATOR,
    ),
    Mutation(
        "devices: automatic placement ignores the host RAM the weights need", "devices.py",
        "            and host_fit(t, loading_gib)]", "            ]",
        RESOLVE, OPERATOR,
    ),
    Mutation(
        "handlers: retries at a fixed delay (no exponential backoff)", "handlers.py",
        "delay = min(RETRY_CAP_S, RETRY_BASE_S * 2 ** (max(attempt, 1) - 1))", "delay = RETRY_BASE_S",
        HANDLERS, OPERATOR,
    ),
    Mutation(
        "handlers: a namespace being deleted retried like RBAC drift (403s in the log until it is gone)",
        "handlers.py",
        "            if exc.namespace_terminating:\n                log.info(",
        "            if False:\n                log.info(",
        HANDLERS, OPERATOR,
    ),
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
]

MUTATIONS += [
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
        "neuron: a global top-k above the device's limit accepted", "runners/device_sampling.py",
        "if config.sampling.on_device and top_k > MAX_DEVICE_TOP_K:",
        "if False:",
        NXDI_RUNNER + ("-k", "device_limit"),
    ),
]

MUTATIONS += [
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
        "vllm: the compile key leaves out the flags (a new KV block count reuses the old entry)", "vllm_flags.py",
        '"flags": shape_args(spec, line.line), ', '', VLLM_ENGINE, package=OPERATOR,
    ),
    Mutation(
        "vllm: serving pods fetch the entry without --required (a miss compiles for an hour in a serving pod)",
        "builders/pod.py", "vllm.fetch_artifacts_command(target, True)", "vllm.fetch_artifacts_command(target, False)",
        VLLM_ENGINE, package=OPERATOR,
    ),
    Mutation(
        "vllm: the native line's serving pods may compile (no VLLM_NEURON_DISABLE_WARMUP_COMPILE)", "builders/vllm.py",
        'if role == "serve" and target.spec.compile_cache.url is not None:', "if False:", VLLM_ENGINE,
        package=OPERATOR,
    ),
    Mutation(
        "vllm: the compile Job's vLLM is a restartable sidecar again (a crash loop the Job never counts)",
        "builders/pod.py", "return [*inits, supervisor], [*containers, store]",
        'return [*inits, supervisor, *({**c, "restartPolicy": "Always"} for c in containers)], [store]',
        VLLM_ENGINE, package=OPERATOR,
    ),
    Mutation(
        "vllm: the serving pods give vllm serve as args (the DLC's entrypoint, PID 1, drops SIGTERM)",
        "builders/pod.py", "out.update(command=vllm_command, workingDir=vllm.WORKING_DIR)",
        "out.update(args=vllm_command, workingDir=vllm.WORKING_DIR)", VLLM_ENGINE, package=OPERATOR,
    ),
    Mutation(
        "vllm: the native line's compile library caches its graphs under HOME (outside the stored folder)",
        "builders/vllm.py",
        '{"name": "NEURON_LIBTORCH_CACHE_ROOT", "value": f"{VLLM_CACHE_ROOT}/{NATIVE_GRAPH_FOLDERS[1]}"},', "",
        VLLM_ENGINE, package=OPERATOR,
    ),
    Mutation(
        "vllm: native-line overrides go unchecked (an unknown key is dropped silently by the plugin)",
        "vllm_native_keys.py", "unknown = sorted(set(overrides) - NATIVE_NEURON_CONFIG_KEYS)", "unknown = []",
        VLLM_ENGINE, package=OPERATOR,
    ),
    Mutation(
        "artifacts: the store keeps waiting for an engine that exited (the pod runs until the health timeout)",
        "artifacts/handoff.py", "if (status := _exited(engine_dir)) is not None:", "if False:", SUPERVISE,
    ),
    Mutation(
        "artifacts: a native folder without a NEFF is stored (every serving pod fails on its graphs)",
        "artifacts/handoff.py", 'if any(next(folder.rglob("*.neff"), None) is not None for folder in folders',
        'if any(folder.is_dir() for folder in folders', SUPERVISE,
    ),
    Mutation(
        "artifacts: the supervisor exits 0 when vLLM dies (the Job's pod succeeds, nothing stored)",
        "artifacts/supervise.py", "    return status\n\n\ndef main", "    return 0\n\n\ndef main", SUPERVISE,
    ),
    Mutation(
        "artifacts: a failed store leaves vLLM running (the pod never ends, the Job never counts it)",
        "artifacts/handoff.py", "            (engine_dir / STORED).touch()", "            pass", SUPERVISE,
    ),
    Mutation(
        "vllm: ArtifactsMissing read from the main containers only (the init container's reason is lost)",
        "serving_pods.py", '(status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):\n'
        '        for state in', '(status.get("containerStatuses") or []):\n        for state in', VLLM_ENGINE,
        package=OPERATOR,
    ),
    Mutation(
        "artifacts: store before the engine is up (a half-compiled folder becomes the entry)",
        "artifacts/handoff.py",
        "waited = wait_ready(ready_url, ready_timeout_s, engine_dir=engine_dir) if ready_url else 0.0",
        "waited = 0.0", HANDOFF,
    ),
    Mutation(
        "artifacts: a required miss is no error (the serving pod starts vLLM, which compiles)",
        "artifacts/handoff.py", "if not hit and required:", "if False:", HANDOFF,
    ),
    Mutation(
        "artifacts: IfNotCached keeps any entry there (a corrupt one is never replaced)", "artifacts/handoff.py",
        'stored = policy == "Always" or not is_prepared(Path(src), key)',
        'stored = policy == "Always" or target.lookup(key) is None', HANDOFF,
    ),
    Mutation(
        "tensor parallel: a rank's key heads taken from the query rows", "runners/tensor_parallel.py",
        "_rows(t, q_rows + rank * kv * hd, kv * hd),",
        "_rows(t, rank * kv * hd, kv * hd),",
        TENSOR_PARALLEL,
    ),
    Mutation(
        "tensor parallel: the MLP's partial sums never all-reduced", "runners/llama.py",
        "x = x + self.reduce(F.linear(F.silu(gate) * up, layer.down))",
        "x = x + F.linear(F.silu(gate) * up, layer.down)",
        TENSOR_PARALLEL,
    ),
    Mutation(
        "tensor parallel: every rank adds the output projection's bias", "runners/tensor_parallel.py",
        "o_bias=layer.o_bias if rank == 0 else None,",
        "o_bias=layer.o_bias,",
        TENSOR_PARALLEL,
    ),
    Mutation(
        "step broadcast: a row's logit_bias left out of the message", "distributed/channel.py",
        "return _shallow(row, _LOCAL_ONLY)",
        'return _shallow(row, _LOCAL_ONLY + ("logit_bias",))',
        CHANNEL,
    ),
    Mutation(
        "step broadcast: a slot's changed sampling row not sent again", "distributed/channel.py",
        "if self._rows.get(slot) == row:", "if slot in self._rows:",
        CHANNEL,
    ),
    Mutation(
        "step broadcast: a released slot's row kept (a new request there reuses it)", "distributed/channel.py",
        """        if op == Op.RELEASE:
            self._rows.pop(int(body), None)
            return""", """        if op == Op.RELEASE:
            return""",
        CHANNEL,
    ),
    Mutation(
        "pre-sharded weights: the rank left out of the shard's key (every rank loads rank 0's)",
        "runners/torch_weights.py",
        '"tensor_parallel": {"degree": world, "rank": rank, "layout": TP_LAYOUT}}',
        '"tensor_parallel": {"degree": world, "layout": TP_LAYOUT}}',
        SHARDED,
    ),
    Mutation(
        "multi-node: EFA requested though parallelism.efa is false", "resolve.py",
        "if spec.parallelism.nodes == 1 or efa is False:",
        "if spec.parallelism.nodes == 1:",
        RESOLVE, package=OPERATOR,
    ),
    Mutation(
        "served record: a model without EFA records efa_per_pod 0 (its bytes change on upgrade)",
        "builders/common.py",
        '_LATER_RESOLVED_DEFAULTS = {"fetch_image": None, "efa_per_pod": 0, "group_topology_key": None}',
        '_LATER_RESOLVED_DEFAULTS = {"fetch_image": None, "group_topology_key": None}',
        BUILDERS, package=OPERATOR,
    ),
    Mutation(
        "nxdi multi-node: start_rank_id the host's index, not node_rank * TP/nodes", "runners/neuron_nxdi.py",
        '"start_rank_id": node_rank * local,', '"start_rank_id": node_rank,', NXDI_HOSTS,
    ),
    Mutation(
        "nxdi multi-node: the host's ranks given to load() only (sharding on load shards rank 0's)",
        "runners/neuron_nxdi.py", "bind_ranks(self.model.neuron_config, ranks)", "pass", NXDI_HOSTS,
    ),
    Mutation(
        "nxdi multi-node: the worker host's runner built without its node_rank", "distributed/launch.py",
        "create_runner(framework, config, model_path, node_rank=topology.node_rank)",
        "create_runner(framework, config, model_path)", NEURON_GROUP,
    ),
    Mutation(
        "tnx multi-node: NEURON_LOCAL_TP not checked against TP / nodes", "runners/neuron_tnx.py",
        "if local != str(tp // nodes):", "if False:", TNX_RANKS,
    ),
    Mutation(
        "reconcile: a SpecError found while building the children left to the handler (no status, retried forever)",
        "reconcile.py", "except api.SpecError as exc:  # found only once the children are built",
        "except NotImplementedError as exc:  # found only once the children are built",
        RECONCILE + ("-k", "spec_error_fails"), package=OPERATOR,
    ),
    Mutation(
        "reconcile: a pruned ReplicaSet's runtime ConfigMap kept (no sweep on its watch event)", "reconcile.py",
        "if any(live is None and key[0] in REVISION_HOLDERS", "if False and any(live is None",
        RECONCILE + ("-k", "kept_while_used"), package=OPERATOR,
    ),
    Mutation(
        "body limit: a chunked body's bytes not counted (no Content-Length, no limit)", "server/limits.py",
        "if size > self.max_bytes:", "if False:", REQUEST_LIMITS + ("-k", "chunked"),
    ),
    Mutation(
        "body limit: Content-Length not checked (the server waits for a gigabyte before refusing it)",
        "server/limits.py", "if declared is not None and declared > self.max_bytes:", "if False:",
        REQUEST_LIMITS + ("-k", "declared_length"),
    ),
    Mutation(
        "request limits: the stop count not checked", "server/limits.py",
        "if len(stop) > limits.max_stop_sequences:", "if False:", REQUEST_LIMITS + ("-k", "over_its_limit"),
    ),
    Mutation(
        "protocol: a lone surrogate accepted as text (the tokenizer fails: a 500)", "server/protocol.py",
        'text.encode("utf-8")', 'text.encode("utf-8", "surrogatepass")', FUZZ + ("-k", "surrogate"),
    ),
    Mutation(
        "errors: invalid requests answered with FastAPI's 422 body, not OpenAI's error", "server/errors.py",
        "app.add_exception_handler(RequestValidationError, _on_validation_error)", "pass",
        FUZZ + ("-k", "generated_requests"),
    ),
    Mutation(
        "scheduler: an aborted request leaves the batch without its slot freed (each dropped stream leaks a slot)",
        "engine/scheduler.py", "for req in out.aborted:\n            self._release(req)",
        "for req in out.aborted:\n            self.running.pop(req.slot, None)", OVERLOAD,
    ),
    Mutation(
        "serving: a stream its client dropped not aborted (its slot stays busy until max_tokens)", "server/serving.py",
        "self._closed = True\n        self.abort()", "self._closed = True", OVERLOAD,
    ),
    Mutation(
        "drain: SIGTERM does not wait for the requests in flight (uvicorn's 5 s close, then the engine stops)",
        "server/serving.py", "if await self._wait_live(timeout):", "if True:", OVERLOAD,
    ),
    Mutation(
        "drain: the draining flag never set (/ready and new requests answer the engine's 'not_ready', not 'draining')",
        "server/serving.py", "self.draining = True\n        self.engine.stop_accepting()",
        "self.engine.stop_accepting()", OVERLOAD,
    ),
    Mutation(
        "rollout: a multi-node group surges by default (the surge group waits forever for a free node group)",
        "placement.py", "ROLLOUT_DEFAULTS = {False: (0, 1), True: (1, 0)}",
        "ROLLOUT_DEFAULTS = {False: (0, 1), True: (0, 1)}", BUILDERS + ("-k", "replaced_in_place"), package=OPERATOR,
    ),
    Mutation(
        "rollout: a multi-node surge under an exclusive topology key not warned about", "placement.py",
        "if spec.parallelism.nodes == 1 or topology_key is None or _zero(surge):", "if True:",
        BUILDERS + ("-k", "surge"), package=OPERATOR,
    ),
    Mutation(
        "DRA: several devices claimed where the driver publishes no connected-group attribute (inf2)",
        "placement.py", "if devices_per_pod <= 1 or instance.dra_device_groups:", "if True:", DRA, package=OPERATOR,
    ),
    Mutation(
        "DRA: Karpenter / Auto Mode nodes accepted (EKS runs the device plugin there)", "placement.py",
        'if KARPENTER_NODEPOOL_LABEL in selector or selector.get(COMPUTE_TYPE_LABEL) == "auto":', "if False:",
        DRA, package=OPERATOR,
    ),
    Mutation(
        "multi-node: the transformers-neuronx image accepted across nodes (no EFA userspace in it)", "resolve.py",
        'if spec.framework != "tnx" and (known is None or known.framework != "tnx"):', "if True:", RESOLVE,
        package=OPERATOR,
    ),
    Mutation(
        "vllm: an EAGLE3 draft on the NxDI line compiled as EAGLE-1 (is_eagle3 not emitted)", "vllm_flags.py",
        'neuron["is_eagle3"] = True', "pass", VLLM_ENGINE, package=OPERATOR,
    ),
    Mutation(
        "vllm: speculation without on-device sampling accepted (the plugin reads one token, no drafts)", "engines.py",
        'if spec.speculation.mode != "none" and not spec.sampling.on_device:', "if False:", VLLM_ENGINE,
        package=OPERATOR,
    ),
    Mutation(
        "multi-node: libfabric's EFA defaults overwrite the process's own FI_* settings", "distributed/topology.py",
        "for name, value in EFA_DEFAULTS.items() if name not in env}", "for name, value in EFA_DEFAULTS.items()}",
        TOPOLOGY,
    ),
]

#: Runs pytest in the copy after checking that the copy (and the mutated text) is what gets imported.
BOOT = """
import importlib, sys
root, module, needle, *args = sys.argv[1:]


def refuse(message):
    print("mutation.py:", message, file=sys.stderr)
    sys.exit(10)  # not a pytest exit status: never read as "tests failed"


sys.path[:0] = [root + "/runtime", root + "/operator"]
try:
    import neuronmodel_runtime, neuronmodel_operator
    mod = importlib.import_module(module) if module else None
except Exception as exc:
    refuse(f"importing the copy failed: {type(exc).__name__}: {exc}")
for package in (neuronmodel_runtime, neuronmodel_operator):
    if not package.__file__.startswith(root):
        refuse(f"{package.__name__} imported from {package.__file__}, not from the copy in {root}")
if mod is not None and (not mod.__file__.startswith(root) or needle not in open(mod.__file__).read()):
    refuse(f"{module} ({mod.__file__}) is not the mutated copy")
import pytest
sys.exit(pytest.main(args))
"""


def make_copy(root: Path) -> None:
    """runtime/, operator/ and their tests copied (no bytecode), pyproject.toml (pytest's settings); tests/assets
    crds/ (the committed CRD and samples), scripts/ (the control plane's pins), bench/ (the load generator) and
    README.md (tables tests read) are linked."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ("runtime", "operator", "tests/runtime_tests", "tests/operator_tests"):
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    for linked in ("tests/assets", "crds", "scripts", "bench", "README.md"):
        (root / linked).symlink_to(REPO / linked)
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")


def check_targets(mutations: list[Mutation]) -> None:
    """Every mutation's text occurs exactly once in the repository's current source; stop loudly otherwise."""
    for m in mutations:
        source = (REPO / m.package / m.path).read_text()
        count = source.count(m.old)
        if count != 1:
            sys.exit(f"mutation {m.name!r}: its target text occurs {count} times in {m.package}/{m.path} (expected "
                     f"once); update scripts/mutation.py to the current code:\n    {m.old}")


def run_tests(root: Path, tests: tuple[str, ...], mutation: Mutation | None, verbose: bool,
              threads: int | None = None) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": f"{root / 'runtime'}:{root / 'operator'}"}
    if threads:  # torch's intra-op pool, one per worker, so parallel runs do not fight over the cores
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    module, needle = (mutation.module, mutation.new) if mutation else ("", "")
    args = [sys.executable, "-c", BOOT, str(root), module, needle,
            "-q", "-x", "-p", "no:cacheprovider", "--rootdir", str(root), *tests]
    start = time.monotonic()
    proc = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    if verbose:
        print(output[-4000:])
    return proc.returncode, output, time.monotonic() - start


class Copies:
    """One copy of the sources per worker: a mutation is applied to a worker's own copy, run, then undone."""

    def __init__(self, tmp: Path, workers: int):
        self.free: queue.Queue[Path] = queue.Queue()
        for i in range(workers):
            root = tmp / f"copy{i}"
            root.mkdir()
            make_copy(root)
            self.free.put(root)

    @contextlib.contextmanager
    def take(self):
        root = self.free.get()
        try:
            yield root
        finally:
            self.free.put(root)


def mutated_run(copies: Copies, m: Mutation, verbose: bool, threads: int | None) -> tuple[int, str, float]:
    with copies.take() as root:
        target = root / m.package / m.path
        original = target.read_text()
        target.write_text(original.replace(m.old, m.new, 1))
        try:
            return run_tests(root, m.tests, m, verbose, threads)
        finally:
            target.write_text(original)


def unmutated_run(copies: Copies, tests: tuple[str, ...], verbose: bool,
                  threads: int | None) -> tuple[int, str, float]:
    with copies.take() as root:
        return run_tests(root, tests, None, verbose, threads)


def verdict_of(m: Mutation, rc: int, output: str) -> tuple[str, bool, str]:
    """("caught" / "NOT CAUGHT" / "ERROR (rc)", whether that fails the script, the first failed test)."""
    if rc == 1:  # pytest: some tests failed
        failed_tests = [line.split()[1] for line in output.splitlines() if line.startswith("FAILED ")]
        return "caught     ", False, f" by {failed_tests[0].split('/')[-1]}" if failed_tests else ""
    if rc == 0:
        return "NOT CAUGHT ", True, ""
    return f"ERROR ({rc})  ", True, ""  # collection error, crash, or the import check above


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the mutations whose name contains this text")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the tail of every pytest run")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="pytest processes at once, each on its own copy (default: one per CPU core)")
    opts = parser.parse_args()
    mutations = [m for m in MUTATIONS if not opts.only or opts.only in m.name]
    check_targets(MUTATIONS)
    started = time.monotonic()
    jobs = max(1, opts.jobs)
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
    failed = False
    with tempfile.TemporaryDirectory(prefix="neuronmodel-mutation-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        copies = Copies(Path(tmp), jobs)
        # the unmutated code passes every test a mutation runs: each distinct selection once
        selections = list(dict.fromkeys(m.tests for m in mutations))
        runs = pool.map(lambda tests: unmutated_run(copies, tests, opts.verbose, threads), selections)
        seconds = 0.0
        for tests, (rc, output, took) in zip(selections, runs):
            seconds += took
            if rc != 0:
                print(output[-4000:])
                print(f"unmutated run of {' '.join(tests)} FAILED (exit {rc}) [{took:.0f}s]: fix the tests "
                      "before mutating")
                return 1
        print(f"passes      unmutated code ({len(selections)} test selections) [{seconds:.0f}s]", flush=True)
        results = pool.map(lambda m: mutated_run(copies, m, opts.verbose, threads), mutations)
        for m, (rc, output, took) in zip(mutations, results):  # in the list's order, as each finishes
            verdict, bad, by = verdict_of(m, rc, output)
            failed |= bad
            if verdict.startswith("ERROR"):
                print(output[-4000:])
            print(f"{verdict} {m.name}{by} [{took:.0f}s]", flush=True)
    print(f"{len(mutations)} mutations in {time.monotonic() - started:.0f}s on {jobs} worker(s): "
          + ("some mutations survived or errored" if failed else "all caught"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
