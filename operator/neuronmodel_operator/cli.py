"""`neuronmodel-operator`: runs kopf with our handlers. Every flag has an environment variable (the chart sets those).

    neuronmodel-operator [-n NS ...] [--liveness URL] [--log-format text|json] [--peering NAME] ...
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import re
import socket
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Optional, Sequence

import kopf

from neuronmodel_operator import api, crd_check, devices, handlers, images
from neuronmodel_operator.k8s import Kube, connect
from neuronmodel_operator.peering import Peering
from neuronmodel_operator.reconcile import Reconcile
from neuronmodel_operator.resolve import DEFAULT_GROUP_TOPOLOGY_KEY, OperatorDefaults

ENV = "NEURONMODEL_OPERATOR_"


def _env(name: str, default: Optional[str] = None) -> Optional[str]:
    return os.environ.get(ENV + name, default)


class _AppendOverEnv(argparse.Action):
    """Repeatable; the first flag replaces the environment's list (flags win over env), later ones add to it."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*([] if current is self.default else current), values])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neuronmodel-operator", description="Reconcile NeuronModels into serving pods.")
    p.add_argument("-n", "--namespace", action=_AppendOverEnv, dest="namespaces",
                   default=[n.strip() for n in (_env("NAMESPACES") or "").split(",") if n.strip()],
                   help="watch this namespace (repeatable; env NEURONMODEL_OPERATOR_NAMESPACES, comma-separated); "
                   "none: all namespaces (needs a ClusterRole)")
    p.add_argument("--liveness", default=_env("LIVENESS", "http://0.0.0.0:8080/healthz"),
                   help="kopf's liveness endpoint URL, '' for none (env NEURONMODEL_OPERATOR_LIVENESS)")
    p.add_argument("--log-format", choices=("text", "json", "full"), default=_env("LOG_FORMAT", "text"),
                   help="text | json (one JSON object per line) | full (env NEURONMODEL_OPERATOR_LOG_FORMAT)")
    p.add_argument("--verbose", action="store_true", default=_env("VERBOSE", "") in ("1", "true"),
                   help="log each reconcile step (env NEURONMODEL_OPERATOR_VERBOSE)")
    p.add_argument("--peering", default=_env("PEERING", ""),
                   help="kopf peering object name for several replicas; '' = standalone, the default for one "
                   "replica (env NEURONMODEL_OPERATOR_PEERING)")
    p.add_argument("--priority", type=int, default=int(_env("PRIORITY", "0")),
                   help="peering priority; 0 with --peering: a random one, so that the replicas of one Deployment "
                   "differ (kopf freezes every operator whose priority equals another's) (env "
                   "NEURONMODEL_OPERATOR_PRIORITY)")
    p.add_argument("--runtime-image", default=os.environ.get(api.ENV_RUNTIME_IMAGE) or None,
                   help="one runtime image for every spec without spec.image, instead of the image chosen per "
                   f"instance family and framework (env {api.ENV_RUNTIME_IMAGE}); unset: "
                   "<--runtime-image-repository>:<--runtime-image-version>-<target> (images.py)")
    p.add_argument("--runtime-image-repository",
                   default=os.environ.get(images.ENV_RUNTIME_IMAGE_REPOSITORY) or images.DEFAULT_REPOSITORY,
                   help=f"repository of the per-family runtime images (env {images.ENV_RUNTIME_IMAGE_REPOSITORY})")
    p.add_argument("--runtime-image-version",
                   default=os.environ.get(images.ENV_RUNTIME_IMAGE_VERSION) or images.package_version(),
                   help="version in their tags, default this operator's own "
                   f"(env {images.ENV_RUNTIME_IMAGE_VERSION})")
    p.add_argument("--hpa-metric", default=os.environ.get(api.ENV_HPA_METRIC, api.DEFAULT_HPA_METRIC),
                   help=f"queue metric of HPAs without spec.autoscaling.metric (env {api.ENV_HPA_METRIC})")
    p.add_argument("--compile-cache-url", default=_env("COMPILE_CACHE_URL") or None,
                   help="compile cache of every NeuronModel without spec.compileCache.url: s3://bucket/prefix, "
                   "pvc://claim/path or an absolute path (env NEURONMODEL_OPERATOR_COMPILE_CACHE_URL); unset: none")
    p.add_argument("--compile-cache-policy", choices=("IfNotCached", "Always", "Never"),
                   default=_env("COMPILE_CACHE_POLICY", "IfNotCached"),
                   help="its policy (env NEURONMODEL_OPERATOR_COMPILE_CACHE_POLICY)")
    p.add_argument("--neuron-scheduler-name", default=_env("NEURON_SCHEDULER_NAME", devices.NEURON_SCHEDULER_NAME),
                   help="scheduler of pods that take more than one but not all of a node's NeuronCores or devices: "
                   "the Neuron scheduler extension's, which picks contiguous ones; '' for none (such models then "
                   "carry a warning); spec.schedulerName overrides it (env "
                   "NEURONMODEL_OPERATOR_NEURON_SCHEDULER_NAME)")
    p.add_argument("--group-topology-key", default=_env("GROUP_TOPOLOGY_KEY", DEFAULT_GROUP_TOPOLOGY_KEY),
                   help="node label whose value a multi-node serving group has to itself (LeaderWorkerSet "
                   "exclusive-topology), unless spec.parallelism.groupTopologyKey names another; '' for none (env "
                   "NEURONMODEL_OPERATOR_GROUP_TOPOLOGY_KEY)")
    p.add_argument("--allow-host-path", action=argparse.BooleanOptionalAction,
                   default=_env("ALLOW_HOST_PATH", "") in ("1", "true"),
                   help="serve NeuronModels whose model, draft or compile cache is a node path (a hostPath volume); "
                   "off: they fail naming this flag. For single-node and development clusters (env "
                   "NEURONMODEL_OPERATOR_ALLOW_HOST_PATH)")
    p.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", "8081")),
                   help="port of the operator's Prometheus /metrics, 0 for none (env "
                   "NEURONMODEL_OPERATOR_METRICS_PORT)")
    p.add_argument("--workers", type=int, default=int(_env("WORKERS", "8")),
                   help="reconciles running at once (env NEURONMODEL_OPERATOR_WORKERS)")
    p.add_argument("--watch-timeout-s", type=float, default=float(_env("WATCH_TIMEOUT_S", "300")),
                   help="restart a watch that saw nothing this long (env NEURONMODEL_OPERATOR_WATCH_TIMEOUT_S)")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                   help="kubeconfig outside a cluster (env KUBECONFIG); in a pod the ServiceAccount is used")
    return p


def operator_defaults(args: argparse.Namespace) -> OperatorDefaults:
    """What fills the specs' unset fields and shapes every model's pods: the runtime image (one for all, or chosen
    per family), the HPA metric, the compile cache, the Neuron scheduler's name and whether node paths are served.

    Raises:
        api.SpecError: --compile-cache-url is not a cache URL, or a node path without --allow-host-path, or
            --group-topology-key is not a label key (the message names the flags).
    """
    cache = None
    if args.compile_cache_url:
        if not re.match(api.CACHE_URL_PATTERN, args.compile_cache_url):
            raise api.SpecError(f"--compile-cache-url (NEURONMODEL_OPERATOR_COMPILE_CACHE_URL) "
                                f"{args.compile_cache_url!r} must be s3://bucket/prefix, pvc://claim/path or an "
                                "absolute path")
        if args.compile_cache_url.startswith("/") and not args.allow_host_path:
            raise api.SpecError(f"--compile-cache-url {args.compile_cache_url!r} is a node path: also pass "
                                "--allow-host-path (NEURONMODEL_OPERATOR_ALLOW_HOST_PATH=true), or use s3:// or pvc://")
        cache = api.CompileCache(url=args.compile_cache_url, policy=args.compile_cache_policy)
    if args.group_topology_key and not re.fullmatch(api.LABEL_KEY_PATTERN, args.group_topology_key):
        raise api.SpecError(f"--group-topology-key (NEURONMODEL_OPERATOR_GROUP_TOPOLOGY_KEY) "
                            f"{args.group_topology_key!r} is not a node label key (such as "
                            "eks.amazonaws.com/nodegroup); '' for none")
    return OperatorDefaults(image=args.runtime_image, hpa_metric=args.hpa_metric,
                            image_repository=args.runtime_image_repository, image_version=args.runtime_image_version,
                            compile_cache=cache, neuron_scheduler_name=args.neuron_scheduler_name or None,
                            allow_host_path=args.allow_host_path, group_topology_key=args.group_topology_key)


def peering_priority(args: argparse.Namespace) -> int:
    """The priority kopf gets: as given, or with --peering and none given a random one (the replicas of one
    Deployment share their environment, and two operators of equal priority both freeze)."""
    if args.peering and not args.priority:
        return random.SystemRandom().randint(1, 2**31 - 1)
    return args.priority


def memo(args: argparse.Namespace, identity: str, priority: int) -> SimpleNamespace:
    """What every handler receives as `memo`: the reconciler and its thread pool."""
    kube = Kube(connect(args.kubeconfig, pool_size=args.workers * 2))
    defaults = operator_defaults(args)
    executor = ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="reconcile")
    reconciler = handlers.Reconciler(Reconcile(kube, defaults), executor)
    if args.peering:
        reconciler.paused = Peering(kube, args.peering, tuple(args.namespaces), identity, priority)
    if args.metrics_port:
        reconciler.metrics.serve(args.metrics_port)
    return SimpleNamespace(reconciler=reconciler)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    log_format = {"text": kopf.LogFormat.PLAIN, "json": kopf.LogFormat.JSON, "full": kopf.LogFormat.FULL}
    kopf.configure(verbose=args.verbose, log_format=log_format[args.log_format], log_prefix=False)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)  # its debug logs carry request bodies
    if not args.verbose:  # kopf logs "Handler ... succeeded" for every child event at INFO
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login (via the kubernetes client) reads it
    settings = kopf.OperatorSettings()
    handlers.configure(settings, client_timeout_s=args.watch_timeout_s)
    try:
        crd_check.check(Kube(connect(args.kubeconfig)))  # an old CRD would prune the fields it lacks, silently
        # kopf's own id and priority, given here so that the retries can tell when kopf has paused this replica
        identity, priority = os.environ.get("POD_ID") or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}", \
            peering_priority(args)
        asyncio.run(kopf.operator(
            registry=handlers.registry, settings=settings, memo=memo(args, identity, priority), identity=identity,
            standalone=not args.peering, peering_name=args.peering or None, priority=priority,
            clusterwide=not args.namespaces, namespaces=args.namespaces,
            liveness_endpoint=args.liveness or None))
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # noqa: BLE001 - a start-up failure is one line, like the runtime's
        print(f"neuronmodel-operator: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
