"""Mutations of the vLLM engine's compile artifacts: the operator's compile key, compile Job and serving pods, and
the runtime's hand-off between vLLM and the store (supervise, handoff)."""

from .definition import OPERATOR, Mutation
from .selections import HANDOFF, SUPERVISE, VLLM_ENGINE

MUTATIONS = [
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
]
