"""`neuronmodel-runtime`: serve | worker | compile | fetch | artifacts | info | selftest. Parses the RuntimeConfig at
the edge and wires the parts."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal, NoReturn, Optional, Sequence, get_args, get_origin

from neuronmodel_runtime.artifacts import handoff
from neuronmodel_runtime.artifacts.prepare import neuron_compile_cache
from neuronmodel_runtime.artifacts.store import CacheError
from neuronmodel_runtime.config import (
    SETTINGS,
    ConfigError,
    RuntimeConfig,
    Setting,
    default_model_path,
    load_config,
    named,
    read_model_config,
    resolve_model_limits,
)
from neuronmodel_runtime.config import env as env_names
from neuronmodel_runtime.config.env import ARTIFACT_KEY_INPUTS
from neuronmodel_runtime.distributed.launch import rank_runner, topology_of
from neuronmodel_runtime.distributed.topology import GroupLost, TopologyError
from neuronmodel_runtime.fetch import FetchError, fetch
from neuronmodel_runtime.frameworks import FrameworkError, detect_frameworks, report, select_framework
from neuronmodel_runtime.runners.base import RunnerError

log = logging.getLogger("neuronmodel_runtime")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr (exit 2), like every other start-up error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _metavar(setting: Setting) -> str:
    annotation = setting.field.annotation
    if annotation is bool:
        return "{true,false}"
    if get_origin(annotation) is Literal:
        return "{" + ",".join(get_args(annotation)) + "}"
    return {int: "INT", float: "FLOAT"}.get(annotation, "JSON" if get_origin(annotation) is dict else "TEXT")


def _help(setting: Setting) -> str:
    """The field's description, where else it can be set, and its default (argparse expands %, so it is escaped)."""
    default = setting.field.get_default(call_default_factory=True)
    shown = default if isinstance(default, str) else json.dumps(default)
    return f"{setting.field.description} [{setting.path}; env {setting.env}; default {shown}]".replace("%", "%%")


def _parser() -> argparse.ArgumentParser:
    logs = _Parser(add_help=False)
    logs.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS)
    common = _Parser(add_help=False, parents=[logs])
    common.add_argument("--config", metavar="FILE", help="RuntimeConfig JSON file; NEURONMODEL_* variables override it, "
                        "and flags override both")
    fields = common.add_argument_group("RuntimeConfig fields (each also settable as NEURONMODEL_<NAME>)")
    for setting in SETTINGS.values():
        fields.add_argument(setting.flag, dest=setting.path, metavar=_metavar(setting), help=_help(setting))
    parser = _Parser(prog="neuronmodel-runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    group = _Parser(add_help=False)
    where = group.add_argument_group("a multi-process group (parallelism.nodes > 1, or tensor_parallel_degree > 1 "
                                     "on framework torch); LeaderWorkerSet's variables otherwise")
    where.add_argument("--leader-address", help="where the group's leader is reached "
                       f"(${env_names.LWS_LEADER_ADDRESS})")
    where.add_argument("--group-size", type=int, help=f"hosts in the group (${env_names.LWS_GROUP_SIZE})")
    where.add_argument("--worker-index", type=int, help=f"this host's index, 0 = the leader "
                       f"(${env_names.LWS_WORKER_INDEX})")
    sub.add_parser("serve", parents=[common, group], help="serve the OpenAI-compatible HTTP API (a group's leader: "
                   "rank 0, which broadcasts every step)")
    wk = sub.add_parser("worker", parents=[common, group], help="a rank of a multi-process group other than the "
                        "leader: load its shard, then run the leader's steps until it is gone")
    wk.add_argument("--local-rank", type=int, default=0, help="this process on its host (its host's first process "
                    "starts the others)")
    sub.add_parser("info", parents=[common], help="print framework detection and the effective config as JSON")
    sub.add_parser("compile", parents=[common], help="compile the model's artifacts into compile_cache.url (or find "
                   "them there) without serving: the operator's compile Job; prints a JSON summary")
    st = sub.add_parser("selftest", parents=[common], help="check this runtime on this host: greedy, sampled and "
                        "speculative generation and the compiled artifacts' round trip; prints a pass/fail table")
    st.add_argument("--tokens", type=int, default=16, help="tokens generated per prompt")
    fe = sub.add_parser("fetch", parents=[logs], help="download an hf:// or s3:// model source into a folder, "
                        "atomically and resumably (the operator's init container)")
    fe.add_argument("source", metavar="SOURCE", help="hf://ORG/NAME (HF_TOKEN, HF_ENDPOINT) or s3://BUCKET/PREFIX "
                    "(AWS credential chain, AWS_ENDPOINT_URL)")
    fe.add_argument("dest", metavar="DEST", help="the model folder to create; staged in DEST.partial beside it")
    fe.add_argument("--revision", help="branch, tag or commit of an hf:// source (default main); s3:// has none")
    art = sub.add_parser("artifacts", parents=[logs], help="an engine's own compiled-artifacts folder out of the "
                         f"store and back, for the key whose inputs {ARTIFACT_KEY_INPUTS} holds (engine vllm's init "
                         "container and compile Job)")
    verbs = art.add_subparsers(dest="verb", required=True)
    af = verbs.add_parser("fetch", parents=[logs], help="the store's entry into FOLDER, complete or not at all")
    af.add_argument("folder", metavar="FOLDER", help="the engine's folder (vLLM's VLLM_CACHE_ROOT, or "
                    "NEURON_COMPILED_ARTIFACTS); replaced")
    af.add_argument("--store", required=True, metavar="URL", help="the compile cache: a path (a PVC mount) or s3://")
    af.add_argument("--required", action="store_true", help="a miss is an error (exit 2): serving pods never compile")
    ast = verbs.add_parser("store", parents=[logs], help="once the engine is up, FOLDER as the key's entry")
    ast.add_argument("folder", metavar="FOLDER", help="the folder the engine compiled into")
    ast.add_argument("--store", required=True, metavar="URL", help="the compile cache: a path (a PVC mount) or s3://")
    ast.add_argument("--policy", default="IfNotCached", choices=("IfNotCached", "Always"),
                     help="IfNotCached keeps an entry already there; Always replaces it")
    ast.add_argument("--ready-url", metavar="URL", help="wait until it answers 200 before storing (the engine "
                     "compiles before it serves)")
    ast.add_argument("--ready-timeout-s", type=float, default=4 * 3600.0, help="how long to wait for --ready-url")
    ast.add_argument("--engine-dir", metavar="DIR", help="the folder the engine's supervisor (`artifacts "
                     "supervisor`) shares: stop waiting when the engine exits, and tell it to stop when done")
    ast.add_argument("--neff-in", action="append", default=[], metavar="SUBFOLDER", help="refuse a FOLDER with no "
                     "*.neff under any of these subfolders (vLLM Neuron's native line); repeatable")
    asu = verbs.add_parser("supervisor", parents=[logs], help="copy the compile Job's engine supervisor (a python "
                           "script of the standard library only) to PATH, for the engine's image to run")
    asu.add_argument("path", metavar="PATH", help="where to write it (the pod's shared /tmp)")
    return parser


def _config(args: argparse.Namespace) -> RuntimeConfig:
    overrides = {path: getattr(args, path) for path in SETTINGS if getattr(args, path) is not None}
    return load_config(args.config, overrides)


def model_folder(config: RuntimeConfig) -> Path:
    """The folder `model` names (null: the embedded default model), unchecked."""
    return Path(config.model) if config.model else default_model_path()


def model_path_of(config: RuntimeConfig) -> Path:
    path = model_folder(config)
    if not (path / "config.json").is_file():
        if not config.model:
            hint = "run `make default-model` (scripts/fetch_default_model.py)"
        elif path.is_dir() and any(path.iterdir()):
            hint = "the folder holds other files: re-download or re-convert the model, or check `model`"
        else:
            hint = "check `model`"
        raise ConfigError(f"model: no Hugging Face model folder (config.json) at {path}; {hint}")
    return path


def load_core(config: RuntimeConfig, on_lost: Callable[[str], None], group: Optional[dict] = None,
              worker_args: Sequence[str] = ()) -> tuple[Any, dict]:
    """Select the framework, load the runner and tokenizer: the Engine, and what /v1/info reports of its start.

    group: `serve`'s group arguments; where they (or LeaderWorkerSet's variables) make a group, this process is
    its leader, its host's other processes run `worker` with `worker_args`, and `on_lost` hears of a lost group.
    """
    from neuronmodel_runtime.engine.engine import Engine
    from neuronmodel_runtime.engine.speculation import build_speculation
    from neuronmodel_runtime.server.tokenizer import eos_token_ids, load_tokenizer
    from neuronmodel_runtime.runners.cpu_threads import apply_cpu_threads
    from neuronmodel_runtime.runners.registry import create_runner
    from neuronmodel_runtime.sampling.defaults import generation_defaults

    detection = detect_frameworks()
    selection = select_framework(config.framework, detection)
    for warning in selection.warnings:
        log.warning(warning)
    path = model_path_of(config)
    config = resolve_model_limits(config, read_model_config(path))
    os.environ.update(neuron_compile_cache(config))
    log.info("framework %s %s (%s); loading %s", selection.framework, selection.version, selection.reason, path)
    started = time.monotonic()
    topology = None if group is None else topology_of(config, selection.framework, os.environ, **group)
    threads = {}
    if topology is None:
        if selection.framework == "torch":  # a group's ranks share the host's cores instead (distributed/launch.py)
            threads = {"cpu_threads": apply_cpu_threads(config.cpu_threads)}
        runner = create_runner(selection.framework, config, str(path))
    else:
        if not topology.is_leader:
            raise ConfigError(f"{env_names.LWS_WORKER_INDEX} / --worker-index {topology.node_rank}: this host is a "
                              "worker of its group; run `neuronmodel-runtime worker` (the leader, index 0, serves)")
        runner = rank_runner(selection.framework, config, str(path), topology, worker_args, on_lost=on_lost)
    runner.load()
    load_s = time.monotonic() - started
    tokenizer = load_tokenizer(path)
    log.info("model loaded in %.1f s: %s", load_s, json.dumps(runner.info()))
    engine = Engine(
        runner,
        tokenizer,
        eos_token_ids(path, tokenizer),
        config.max_num_batched_tokens,
        config.server.request_timeout_s,
        speculation=build_speculation(config.speculation, runner),
        sampling_defaults=generation_defaults(path),
        async_scheduling=config.server.async_scheduling,
    )
    if getattr(runner, "lost", None):  # lost while the engine was being built
        on_lost(runner.lost)
    return engine, {"framework": report(config.framework, detection), "speculation": config.speculation.model_dump(),
                    "capabilities": runner.capabilities().info(), "startup": {"load_s": round(load_s, 3)}, **threads}


def build_engine(config: RuntimeConfig, own_thread: bool = True, group: Optional[dict] = None,
                 worker_args: Sequence[str] = ()) -> Any:
    """load_core's Engine in a ready-to-start AsyncEngine (the step loop in this process).

    own_thread: the engine spawns its step thread; False leaves the step loop to the caller (`serve` runs it on
    the main thread)."""
    from neuronmodel_runtime.engine.async_engine import AsyncEngine

    served_by: list[Any] = []  # the AsyncEngine, once built: a lost group turns it unready
    lost: list[str] = []

    def group_lost(why: str) -> None:
        lost.append(why)
        for served in served_by:
            served.stop_accepting()

    engine, info = load_core(config, group_lost, group, worker_args)
    served = AsyncEngine(engine, tokenizer=engine.tokenizer, model_name=served_model_name(config),
                         max_queue=config.server.max_queue, info=info, own_thread=own_thread)
    served_by.append(served)
    if lost:
        served.stop_accepting()
    return served


def core_engine(config: RuntimeConfig, on_lost: Callable[[str], None], group: Optional[dict] = None,
                worker_args: Sequence[str] = ()) -> tuple[Any, dict]:
    """load_core as the engine core process runs it (server.engine_process): a failure is one line."""
    return _checked(load_core, config, on_lost=on_lost, group=group, worker_args=worker_args)


def served_model_name(config: RuntimeConfig) -> str:
    return config.server.served_model_name or model_folder(config).name


def _engine_process(config: RuntimeConfig, group: dict, worker_args: Sequence[str]) -> Any:
    """An EngineCoreClient: the engine core in a child process, loaded (server.engine_process)."""
    from neuronmodel_runtime.engine.core_client import EngineCoreClient
    from neuronmodel_runtime.server.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_path_of(config))  # a missing model folder is refused before a core starts
    # as set (an unset length is fitted to the model there as here), without the API key the core never needs
    settings = config.model_dump_json(exclude_unset=True, exclude={"server": {"api_key"}})
    return EngineCoreClient(settings, tokenizer=tokenizer, model_name=served_model_name(config),
                            max_queue=config.server.max_queue, build="neuronmodel_runtime.cli:core_engine",
                            build_args={"group": group, "worker_args": list(worker_args)},
                            log_level=logging.getLevelName(logging.getLogger().level))


def with_model_limits(config: RuntimeConfig) -> RuntimeConfig:
    """`config` with max_model_len / max_context_length fitted to its model folder (see resolve_model_limits)."""
    return resolve_model_limits(config, read_model_config(model_path_of(config)))


#: Start-up failures whose messages already name the setting and the fix.
STARTUP_ERRORS = (ConfigError, FrameworkError, RunnerError, handoff.HandoffError, TopologyError, GroupLost)


def _checked(load: Callable[..., Any], config: RuntimeConfig, **kwargs: Any) -> Any:
    """`load(config, **kwargs)`, with an unforeseen failure (a corrupt weights or tokenizer file, a missing
    package, ...) turned into a one-line ConfigError naming the model folders; its traceback is logged at DEBUG."""
    try:
        return load(config, **kwargs)
    except STARTUP_ERRORS:
        raise
    except Exception as exc:
        log.debug("loading the model failed", exc_info=True)
        folders = f"model {model_folder(config)}"
        if config.speculation.draft_model:
            folders += f" / speculation.draft_model {config.speculation.draft_model}"
        raise ConfigError(f"cannot load {folders}: {type(exc).__name__}: {exc}; check the folder's files "
                          "(if they are intact, this is a bug: --log-level DEBUG shows the traceback)") from exc


def _info(config: RuntimeConfig) -> int:
    print(json.dumps({**report(config.framework, detect_frameworks()), "config": config.public_dict()}, indent=2))
    return 0


def _start(args: argparse.Namespace) -> Callable[[], int]:
    """Everything that can fail before the command does its work (config, listen address, model load); returns
    the work. Start-up failures raise; failures of the work itself are bugs, with their tracebacks."""
    if args.command == "fetch":  # no RuntimeConfig, no model: it downloads the model
        return functools.partial(_fetch, args.source, args.dest, args.revision)
    if args.command == "artifacts" and args.verb == "supervisor":
        return functools.partial(_supervisor, Path(args.path))
    if args.command == "artifacts":  # no RuntimeConfig: the engine's own folder and the store
        return functools.partial(_artifacts, args, handoff.key_from_env(os.environ))
    config = _config(args)
    if args.command == "info":
        if (model_folder(config) / "config.json").is_file():  # the effective config: with the model's limits
            config = with_model_limits(config)
        return functools.partial(_info, config)
    if args.command == "compile":
        return functools.partial(_compile, _compile_runner_factory(config))
    if args.command == "selftest":
        return functools.partial(_selftest, _checked(build_engine, config, own_thread=True), with_model_limits(config),
                                 args.tokens)
    if args.command == "worker":
        return _worker_start(config, args)
    from neuronmodel_runtime.server.listen import check_listen_address

    check_listen_address(config.server.host, config.server.port)
    engine = _engine_process(config, _group_args(args), args.worker_args) if config.server.engine_process else \
        _checked(build_engine, config, own_thread=False, group=_group_args(args), worker_args=args.worker_args)
    from neuronmodel_runtime.server.app import create_app
    from neuronmodel_runtime.server.drain import serve

    config = with_model_limits(config)  # as build_engine resolved it: /v1/info reports the lengths served
    return functools.partial(serve, create_app(engine, config), config)


def _group_args(args: argparse.Namespace) -> dict:
    return {"leader_address": args.leader_address, "group_size": args.group_size, "worker_index": args.worker_index}


def _worker_start(config: RuntimeConfig, args: argparse.Namespace) -> Callable[[], int]:
    """`worker`: this process's rank (never the leader), its host's other processes, the group, its runner."""
    from neuronmodel_runtime.distributed.worker import run_worker

    selection = select_framework(config.framework, detect_frameworks())
    path = model_path_of(config)
    config = resolve_model_limits(config, read_model_config(path))  # the leader's limits: the same shapes
    topology = topology_of(config, selection.framework, os.environ, local_rank=args.local_rank, **_group_args(args))
    if topology is None:
        raise ConfigError("`neuronmodel-runtime worker` runs a rank of a multi-process group, but this config serves "
                          "alone (parallelism.nodes 1, and tensor_parallel_degree 1 or a Neuron framework): run "
                          "`neuronmodel-runtime serve`")
    if topology.is_leader:
        raise ConfigError(f"{env_names.LWS_WORKER_INDEX} / --worker-index 0 is the group's leader: run "
                          "`neuronmodel-runtime serve` there")
    os.environ.update(neuron_compile_cache(config))
    runner = rank_runner(selection.framework, config, str(path), topology, args.worker_args)
    return functools.partial(run_worker, runner)


def _compile_runner_factory(config: RuntimeConfig) -> Callable[[], Any]:
    """What `compile` needs before it works: a valid config, a framework, a model folder; a policy that compiles."""
    from neuronmodel_runtime.runners.registry import create_runner

    if config.compile_cache.policy == "Never":
        raise ConfigError(f"{named('compile_cache.policy')} is Never, which never compiles: the compile command "
                          "needs IfNotCached (compile on a miss) or Always (recompile)")
    selection = select_framework(config.framework, detect_frameworks())
    for warning in selection.warnings:
        log.warning(warning)
    path = model_path_of(config)
    config = resolve_model_limits(config, read_model_config(path))
    os.environ.update(neuron_compile_cache(config))
    return lambda: create_runner(selection.framework, config, str(path))


class Terminated(BaseException):
    """SIGTERM during `compile` (the operator replaced its Job, the node drains): a BaseException, so that no
    retry catches it, and every `finally` on the way out runs: the store's compile lock is released at once
    instead of blocking the next compile of the key for the lock's whole lease."""


def _terminated(signum: int, _frame: Any) -> NoReturn:
    raise Terminated(signum)


def _compile(make_runner: Callable[[], Any]) -> int:
    """`compile`: one JSON line on success (exit 0); a failure is one line on stderr (exit 1: the Job retries);
    SIGTERM unwinds (releasing the compile lock) and exits 143."""
    from neuronmodel_runtime.compile_job import CompileFailed, run_compile

    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        summary = run_compile(make_runner)
    except (*STARTUP_ERRORS, CompileFailed) as exc:
        print("neuronmodel-runtime compile: " + " ".join(str(exc).split()), file=sys.stderr)
        return 1
    except Terminated:
        print("neuronmodel-runtime compile: stopped by SIGTERM; the compile lock is released", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps(summary))
    return 0


def _fetch(source: str, dest: str, revision: Optional[str]) -> int:
    """`fetch`: its failures (no such repository, credentials, network, ...) are one line and exit code 2, like
    start-up errors: they are the init container's whole work."""
    try:
        fetch(source, dest, revision)
    except FetchError as exc:
        return _fail(exc)
    return 0


def _artifacts(args: argparse.Namespace, key: Any) -> int:
    """`artifacts fetch|store`: one JSON line on success (exit 0); a failure (a required miss, a store that cannot
    be read or written, an engine that never came up) is one line, also the termination message, and exit code 2."""
    try:
        if args.verb == "fetch":
            summary = handoff.fetch(args.store, key, Path(args.folder), args.required)
        else:
            summary = handoff.store(args.store, key, Path(args.folder), args.policy, args.ready_url,
                                    args.ready_timeout_s, Path(args.engine_dir) if args.engine_dir else None,
                                    args.neff_in)
    except CacheError as exc:
        return _fail(exc)
    print(json.dumps(summary))
    return 0


def _supervisor(path: Path) -> int:
    """`artifacts supervisor PATH`: artifacts/supervise.py's own source at PATH (its folder made)."""
    from neuronmodel_runtime.artifacts import supervise

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(Path(supervise.__file__).read_text())
    print(json.dumps({"supervisor": str(path)}))
    return 0


def _selftest(front: Any, config: RuntimeConfig, tokens: int) -> int:
    """Run the checks of `selftest.py` on the loaded engine; print the table; exit code 1 if any check failed."""
    from neuronmodel_runtime.runners.registry import create_runner
    from neuronmodel_runtime.selftest import PROMPTS, run_checks, table

    engine = front.engine
    framework = front.info()["framework"]

    def rebuild() -> Any:
        runner = create_runner(framework["selected"]["framework"], config, str(model_path_of(config)))
        runner.load()
        return runner

    has_artifacts = "artifacts" in engine.runner.info()
    prompt_ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    checks = run_checks(engine, prompt_ids, tokens, engine.speculation is not None, rebuild if has_artifacts else None)
    versions = {"framework": f"{framework['selected']['framework']} {framework['selected']['version']}",
                **{name: v for name, v in framework["detected"]["related"].items() if v},
                "neuron runtime": framework["detected"]["neuron_runtime"] or "not installed",
                **{f"{fw} written against": "yes" if r["written_against"] else f"no (known: {r['known']})"
                   for fw, r in framework["releases"].items()},
                "runner": json.dumps(engine.runner.info())}
    print(table(checks, versions))
    return 0 if all(c.result != "FAIL" for c in checks) else 1


#: Where the kubelet reads a container's termination message (the pod's terminationMessagePath default); the
#: operator's status shows it (lastState.terminated.message). Absent outside a pod: nothing is written there.
TERMINATION_LOG = "/dev/termination-log"


def _fail(exc: Exception) -> int:
    line = "neuronmodel-runtime: " + " ".join(str(exc).split())
    print(line, file=sys.stderr)
    if os.path.exists(TERMINATION_LOG):
        try:
            Path(TERMINATION_LOG).write_text(line + "\n")
        except OSError as err:
            log.debug("cannot write the termination message to %s: %s", TERMINATION_LOG, err)
    return 2


def _without_local_rank(argv: Sequence[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--local-rank":
            skip = True
        elif not arg.startswith("--local-rank="):
            out.append(arg)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run a command and return its exit code; every start-up failure is one line on stderr and exit code 2."""
    try:
        raw = list(sys.argv[1:] if argv is None else argv)
        args = _parser().parse_args(raw)
        args.worker_args = _without_local_rank(raw[1:])  # what this host's further processes run `worker` with
    except SystemExit as exc:  # --help (0), or a usage error already printed as one line (2)
        return int(exc.code or 0)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        work = _start(args)
    except STARTUP_ERRORS as exc:
        return _fail(exc)
    return work()


if __name__ == "__main__":
    sys.exit(main())
