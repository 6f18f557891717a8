"""The CEL rules across the fields of the whole NeuronModel spec (its `x-kubernetes-validations`), which api.py
attaches to `NeuronModelSpec`: instance types and frameworks, the device's top-k, EFA, the per-family
tensor-parallel degrees, engine vllm's refusals, and placement.py's rollout and DRA rules. Each message says how
to fix. The rules on one sub-spec stay on its model in api.py.
"""

from __future__ import annotations

from neuronmodel_operator import devices, placement
from neuronmodel_operator.devices import MAX_DEVICE_TOP_K

_KNOWN_TYPES = ", ".join(f"'{name}'" for name in devices.INSTANCE_TYPES)
_EFA_TYPES = ", ".join(f"'{name}'" for name, t in devices.INSTANCE_TYPES.items() if t.efa_interfaces)
_NEURON_PREFIX_CEL = " || ".join(f"self.instanceType.startsWith('{p}')" for p in devices.NEURON_PREFIXES)


def _tp_rules() -> list[tuple[str, str]]:
    """Per family: TP per node must be a degree NxDI supports that fits on the instance type."""
    per_node = "(self.parallelism.tensorParallelDegree / self.parallelism.nodes)"
    lnc = "(has(self.parallelism.logicalCoreConfig) ? self.parallelism.logicalCoreConfig : {default})"
    rules = []
    for family in devices.FAMILIES.values():
        types = [t for t in devices.INSTANCE_TYPES.values() if t.family is family]
        prefixes = sorted({t.name.split(".")[0] + "." for t in types})
        applies = " || ".join(f"self.instanceType.startsWith('{p}')" for p in prefixes)
        for choice in family.lnc_choices:
            cores = "{" + ", ".join(f"'{t.name}': {t.cores(choice)}" for t in types) + "}"
            legal = list(family.legal_tp[choice])
            when = f"({applies})" if len(family.lnc_choices) == 1 else \
                f"({applies}) && {lnc.format(default=family.default_lnc)} == {choice}"
            lnc_text = "" if len(family.lnc_choices) == 1 else f" at logicalCoreConfig {choice}"
            rules.append((
                f"!has(self.instanceType) || !(self.instanceType in {cores}) || !({when}) || "
                f"({per_node} in {legal} && {per_node} <= {cores}[self.instanceType])",
                f"on {family.name}{lnc_text} tensorParallelDegree / nodes (NeuronCores per node) must be one of "
                f"{legal} and at most the instance type's NeuronCores; pick another TP degree, nodes or instanceType"))
    return rules


#: What engine vllm refuses of the spec (resolve.py refuses the same, for a spec admitted under an older CRD).
VLLM_RULES = (
    ("self.engine != 'vllm' || self.framework == 'auto'",
     "framework must be auto with engine vllm: it chooses our runtime's runner, and vLLM Neuron runs its own (NxDI on "
     "inf2/trn1, the native plugin on trn2); remove spec.framework, or use engine neuronmodel"),
    ("self.engine != 'vllm' || !(self.speculation.mode in ['draft', 'promptLookup'])",
     "speculation.mode draft and promptLookup are not served by engine vllm: vLLM Neuron speculates with EAGLE drafts "
     "only (EAGLE v1/v3 on inf2/trn1, EAGLE3 on trn2); use mode eagle with an EAGLE draft, or engine neuronmodel"),
    ("self.engine != 'vllm' || !self.compileCache.shardedWeights",
     "compileCache.shardedWeights must be false with engine vllm: vLLM Neuron loads the weights from the checkpoint "
     "and stores compiled graphs only; remove shardedWeights, or use engine neuronmodel"),
    (f"self.engine != 'vllm' || !has(self.instanceType) || ({_NEURON_PREFIX_CEL})",
     "instanceType must be a Neuron instance type with engine vllm: vLLM Neuron serves inf2, trn1 and trn2; set one "
     "(or leave it out for the smallest that holds the TP degree), or use engine neuronmodel with framework torch "
     "for a CPU node"),
    ("self.engine != 'vllm' || self.speculation.mode == 'none' || self.sampling.onDevice",
     "sampling.onDevice must be true with engine vllm and speculation: vLLM Neuron reads the accepted draft tokens "
     "from the on-device sampler's output only (inf2/trn1) or refuses to speculate without it (trn2); set "
     "sampling.onDevice true, or speculation.mode none, or use engine neuronmodel"),
    ("self.engine != 'vllm' || self.parallelism.nodes == 1",
     "parallelism.nodes must be 1 with engine vllm: vLLM Neuron serves no tensor parallelism across nodes; use one "
     "node (a larger instanceType), or engine neuronmodel"),
)


#: The rules on the whole spec, in the CRD's order.
SPEC_RULES = (
    ("!(has(self.replicas) && has(self.autoscaling))",
     "set at most one of spec.replicas (a fixed count) or spec.autoscaling (an HPA on the queue depth); with "
     "neither, the model runs one replica"),
    (f"!has(self.instanceType) || !({_NEURON_PREFIX_CEL}) || self.instanceType in [{_KNOWN_TYPES}]",
     f"instanceType is not a Neuron instance type this operator knows: use one of {_KNOWN_TYPES.replace(chr(39), '')}"),
    (f"!has(self.instanceType) || self.framework == 'torch' || self.framework == 'auto' || ({_NEURON_PREFIX_CEL})",
     "framework nxdi and tnx run on Neuron instances: set instanceType to an inf2, trn1 or trn2 type, or "
     "framework torch for the CPU reference runner"),
    ("self.framework != 'tnx' || !has(self.instanceType) || !self.instanceType.startsWith('trn2')",
     "transformers-neuronx (framework tnx) never supported trn2: use framework nxdi (or auto)"),
    ("self.framework != 'tnx' || self.parallelism.nodes == 1",
     "parallelism.nodes must be 1 with framework tnx: the transformers-neuronx image (Neuron SDK 2.25) has no EFA "
     "userspace, so the collectives between nodes cannot run; use framework nxdi (or auto) for a multi-node "
     "group"),
    ("!has(self.parallelism.logicalCoreConfig) || (has(self.instanceType) && "
     "self.instanceType.startsWith('trn2'))",
     "parallelism.logicalCoreConfig applies to trn2 only: remove it or set a trn2 instanceType"),
    # framework auto is a Neuron runner here whatever the instanceType (resolve.py places it on a Neuron
    # instance), so only torch, the reference runner, is exempt.
    (f"self.framework == 'torch' || !self.sampling.onDevice || self.sampling.globalTopK <= {MAX_DEVICE_TOP_K}",
     f"sampling.globalTopK must be {MAX_DEVICE_TOP_K} or less with sampling.onDevice true: Neuron's on-device "
     f"sampler takes a global top-k of at most {MAX_DEVICE_TOP_K}; set sampling.globalTopK to "
     f"{MAX_DEVICE_TOP_K} or less, or sampling.onDevice false to sample on the host"),
    ("self.framework != 'torch' || !has(self.neuronConfigOverrides)",
     "neuronConfigOverrides are NxDI / transformers-neuronx NeuronConfig keywords, and framework torch (the "
     "reference runner) has no NeuronConfig: remove spec.neuronConfigOverrides, or use framework auto, nxdi or "
     "tnx"),
    ("!has(self.parallelism.efa) || !self.parallelism.efa || self.parallelism.nodes > 1",
     "parallelism.efa applies to nodes > 1 (the collectives between a group's nodes): remove it, or set "
     "parallelism.nodes"),
    (f"!has(self.parallelism.efa) || !self.parallelism.efa || !has(self.instanceType) || "
     f"self.instanceType in [{_EFA_TYPES}]",
     f"parallelism.efa: the instanceType has no EFA devices; EFA is on {_EFA_TYPES.replace(chr(39), '')}: "
     "choose one of them, or set parallelism.efa false"),
    ("!has(self.parallelism.groupTopologyKey) || self.parallelism.nodes > 1",
     "parallelism.groupTopologyKey applies to nodes > 1 (where a serving group spans nodes): remove it, or set "
     "parallelism.nodes"),
    ("!has(self.speculation.draftModel) || !has(self.speculation.draftModel.eagle3) || "
     "self.speculation.mode == 'eagle'",
     "speculation.draftModel.eagle3 applies to speculation.mode eagle (it says the EAGLE draft is an EAGLE3 "
     "checkpoint): remove it, or set speculation.mode eagle"),
    placement.ROLLOUT_RULE,
    *placement.DRA_RULES,
    *VLLM_RULES,
    *_tp_rules(),
)
