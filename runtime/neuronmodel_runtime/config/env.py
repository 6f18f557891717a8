"""Environment variables of the runtime pods: the names the operator writes and the runtime reads, defined once.

The operator (builders/pod.py) sets them on the runtime container and the download init containers; the runtime
reads them (load.py for NEURONMODEL_*, frameworks.py, fetch.py, the Neuron runners and the artifact key). Every
RuntimeConfig field is a variable too, ENV_PREFIX + its setting name (settings.py): of those, only API_KEY is set
by the operator, from a Secret.
"""

from __future__ import annotations

#: Prefix of every RuntimeConfig field's variable (`NEURONMODEL_PORT` sets server.port).
ENV_PREFIX = "NEURONMODEL_"
#: server.api_key: the operator sets it from spec.server.apiKeySecretRef, never in the ConfigMap.
API_KEY = ENV_PREFIX + "API_KEY"
#: The instance family (inf2, trn1, trn2) the pod runs on: part of the compiled artifacts' key, and of the release
#: support facts in `info`.
INSTANCE_FAMILY = ENV_PREFIX + "INSTANCE_FAMILY"
#: Machine-wide cache of converted models and compiled artifacts (an emptyDir in a pod).
CACHE = ENV_PREFIX + "CACHE"
#: trn2's logical NeuronCore config (1 or 2), the Neuron runtime's own variable: spec.parallelism.logicalCoreConfig.
LOGICAL_NC_CONFIG = "NEURON_LOGICAL_NC_CONFIG"
#: The folder NxDI's compiled model is loaded from (and saved to): our runtime sets it for the NxDI runner, the operator
#: for vLLM Neuron's NxDI-line plugin, which reads it itself.
COMPILED_ARTIFACTS = "NEURON_COMPILED_ARTIFACTS"
#: neuronx-cc's persistent cache (NEFFs by HLO hash), the Neuron compiler's own variable.
NEURON_COMPILE_CACHE_URL = "NEURON_COMPILE_CACHE_URL"
#: The Hugging Face token of gated or private hf:// sources, given to the download init containers only.
HF_TOKEN = "HF_TOKEN"
#: vLLM's framework variable (neuronx-distributed-inference | transformers-neuronx), honoured as `framework`.
VLLM_FRAMEWORK = "VLLM_NEURON_FRAMEWORK"
#: The key inputs (a JSON object) of an engine's compiled artifacts that the operator derived, for the pods of an
#: engine whose compile the runtime does not drive itself (engine vllm): `neuronmodel-runtime artifacts fetch|store`
#: name the store entry by their digest (keys.digest), as the operator's status.resolved.compileKey does.
ARTIFACT_KEY_INPUTS = ENV_PREFIX + "ARTIFACT_KEY_INPUTS"
#: LeaderWorkerSet's variables in every pod of a group (its controller injects them): the leader pod's address
#: (the group's headless-Service DNS name), the pods in the group, and this pod's index in it (0 = the leader).
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
#: The leader's torch.distributed (gloo) port of a multi-process group: the step broadcast, and the reference
#: runner's all-reduces; DEFAULT_GROUP_PORT when unset (the port the operator declares on the leader's container).
GROUP_PORT = ENV_PREFIX + "GROUP_PORT"
DEFAULT_GROUP_PORT = 29500
