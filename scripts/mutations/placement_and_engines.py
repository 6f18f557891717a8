"""Mutations of rollout and device placement (surge, DRA) and of what a multi-node or speculative model's engine
must refuse or be told (TNx across nodes, EAGLE3 and on-device sampling on vLLM, EFA's environment)."""

from .definition import OPERATOR, Mutation
from .selections import BUILDERS, DRA, RESOLVE, TOPOLOGY, VLLM_ENGINE

MUTATIONS = [
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
