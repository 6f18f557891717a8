"""Mutations of the operator's subtle rules: the scale subresource, status, compile gating, HPA ownership,
reconcile under change, child ownership, resolve and the handlers' retries."""

from .definition import OPERATOR, Mutation
from .selections import BUILDERS, CRD, HANDLERS, OWNERSHIP, RECONCILE, RESOLVE, STATUS

MUTATIONS = [
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
        "reconcile: a child event handled before its new spec's full run refreshes from the old children",
        "reconcile.py", "and not switching and self._has_applied(body):", "and not switching:", RECONCILE, OPERATOR,
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
]
