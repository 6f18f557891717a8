"""Mutations of tensor parallelism and multi-node groups: sharded layers and weights, the step broadcast, EFA,
and the NxDI and TNx ranks of each host."""

from .definition import OPERATOR, Mutation
from .selections import BUILDERS, CHANNEL, NEURON_GROUP, NXDI_HOSTS, RESOLVE, SHARDED, TENSOR_PARALLEL, TNX_RANKS

MUTATIONS = [
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
]
