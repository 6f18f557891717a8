"""devices.py against the published AWS / Neuron numbers (not against its own tables).

Facts, from ../shared/research/neuron-apis.md §4.3 (AWS instance pages, NxDI TP guidance, docs 2.23) and the
devices.py docstring (trn2.3xlarge):

  instance         chips  NeuronCores            device memory
  inf2.xlarge      1      2                      32 GiB
  inf2.8xlarge     1      2                      32 GiB
  inf2.24xlarge    6      12                     192 GiB
  inf2.48xlarge    12     24                     384 GiB
  trn1.2xlarge     1      2                      32 GiB
  trn1.32xlarge    16     32                     512 GiB
  trn1n.32xlarge   16     32                     512 GiB
  trn2.3xlarge     1      8 physical: 4 at LNC 2, 8 at LNC 1        96 GiB
  trn2.48xlarge    16     128 physical: 64 at LNC 2 (default), 128 at LNC 1   1,536 GiB (96 GiB per chip)
  trn2u.48xlarge   as trn2.48xlarge

  per-core memory: 16 GiB on Inf2/Trn1, 24 GiB on Trn2 at LNC 2 (so 12 GiB at LNC 1)
  supported TP degrees: Trn2 1,2,4,8,16,32,64 (LNC 2; up to 128 at LNC 1); Inf2 1,2,4,8,24; Trn1 1,2,8,16,32
"""

from __future__ import annotations

import re

import pytest

from neuronmodel_operator import devices

GIB = 2**30

#: name -> (chips, NeuronCores at the default LNC, NeuronCores at LNC 1, device memory GiB)
PUBLISHED = {
    "inf2.xlarge": (1, 2, 2, 32),
    "inf2.8xlarge": (1, 2, 2, 32),
    "inf2.24xlarge": (6, 12, 12, 192),
    "inf2.48xlarge": (12, 24, 24, 384),
    "trn1.2xlarge": (1, 2, 2, 32),
    "trn1.32xlarge": (16, 32, 32, 512),
    "trn1n.32xlarge": (16, 32, 32, 512),
    "trn2.3xlarge": (1, 4, 8, 96),
    "trn2.48xlarge": (16, 64, 128, 1536),
    "trn2u.48xlarge": (16, 64, 128, 1536),
}
NXDI_TP = {"inf2": (1, 2, 4, 8, 24), "trn1": (1, 2, 8, 16, 32), "trn2": (1, 2, 4, 8, 16, 32, 64)}
NXDI_TP_TRN2_LNC1 = (1, 2, 4, 8, 16, 32, 64, 128)


def family_of(name: str) -> str:
    return {"inf2": "inf2", "trn1": "trn1", "trn1n": "trn1", "trn2": "trn2", "trn2u": "trn2"}[name.split(".")[0]]


def default_lnc(name: str) -> int:
    return 2 if family_of(name) == "trn2" else 1


def it(name: str) -> devices.InstanceType:
    return devices.INSTANCE_TYPES[name]


# --- the instance table --------------------------------------------------------------------------------------

def test_every_published_instance_type_is_known_and_no_other():
    assert set(devices.INSTANCE_TYPES) == set(PUBLISHED)
    for name in PUBLISHED:
        assert devices.is_neuron_instance(name)
        assert it(name).family.name == family_of(name)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_devices_and_cores_per_instance(name):
    chips, cores_default, cores_lnc1, _ = PUBLISHED[name]
    instance = it(name)
    assert instance.devices == chips
    assert instance.cores(default_lnc(name)) == cores_default
    assert instance.cores(1) == cores_lnc1
    assert devices.lnc_of(instance, None) == default_lnc(name)


def test_spot_checks_from_the_brief():
    assert (it("inf2.48xlarge").devices, it("inf2.48xlarge").cores(1)) == (12, 24)
    assert (it("trn1.32xlarge").devices, it("trn1.32xlarge").cores(1)) == (16, 32)
    assert it("trn2.48xlarge").devices == 16
    assert it("trn2.48xlarge").cores(2) == 64
    assert it("trn2.48xlarge").cores(1) == 128
    assert it("trn2.3xlarge").cores(2) == 4


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_device_memory_matches_the_instance_page(name):
    chips, _, _, memory_gib = PUBLISHED[name]
    assert chips * it(name).family.hbm_gib_per_device == memory_gib


@pytest.mark.parametrize("name, lnc, gib", [
    ("inf2.xlarge", 1, 16), ("inf2.48xlarge", 1, 16), ("trn1.2xlarge", 1, 16), ("trn1.32xlarge", 1, 16),
    ("trn2.48xlarge", 2, 24), ("trn2.3xlarge", 2, 24), ("trn2.48xlarge", 1, 12),
])
def test_hbm_per_core(name, lnc, gib):
    assert it(name).family.hbm_gib_per_core(lnc) == gib


def test_only_trn2_has_a_logical_core_choice():
    assert set(it("trn2.48xlarge").family.lnc_choices) == {1, 2}
    for name in ("inf2.xlarge", "trn1.32xlarge"):
        assert tuple(it(name).family.lnc_choices) == (1,)


def test_only_trn2_never_ran_transformers_neuronx():
    assert {name: it(name).family.transformers_neuronx for name in ("inf2.xlarge", "trn1.2xlarge", "trn2.3xlarge")} \
        == {"inf2.xlarge": True, "trn1.2xlarge": True, "trn2.3xlarge": False}


def test_resource_names_are_the_device_plugins():
    assert devices.NEURONCORE_RESOURCE == "aws.amazon.com/neuroncore"
    assert devices.NEURON_DEVICE_RESOURCE == "aws.amazon.com/neuron"  # neurondevice was removed in Neuron 2.20
    assert devices.INSTANCE_TYPE_LABEL == "node.kubernetes.io/instance-type"


def test_cpu_instances_are_not_neuron_instances():
    for name in ("m5.xlarge", "c7i.8xlarge", "p5.48xlarge", "g6.xlarge", "inf1.xlarge", "trn"):
        assert not devices.is_neuron_instance(name)


# --- legal TP degrees ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_legal_tp_degrees_are_nxdis_that_fit_the_node(name):
    instance, lnc = it(name), default_lnc(name)
    expected = tuple(tp for tp in NXDI_TP[family_of(name)] if tp <= PUBLISHED[name][1])
    assert devices.legal_tp_degrees(instance, lnc) == expected


@pytest.mark.parametrize("name, lnc, expected", [
    ("inf2.xlarge", 1, (1, 2)),
    ("inf2.8xlarge", 1, (1, 2)),
    ("inf2.24xlarge", 1, (1, 2, 4, 8)),
    ("inf2.48xlarge", 1, (1, 2, 4, 8, 24)),
    ("trn1.2xlarge", 1, (1, 2)),
    ("trn1.32xlarge", 1, (1, 2, 8, 16, 32)),
    ("trn2.3xlarge", 2, (1, 2, 4)),
    ("trn2.3xlarge", 1, (1, 2, 4, 8)),
    ("trn2.48xlarge", 2, (1, 2, 4, 8, 16, 32, 64)),
    ("trn2.48xlarge", 1, NXDI_TP_TRN2_LNC1),
])
def test_legal_tp_degrees_spelled_out(name, lnc, expected):
    assert devices.legal_tp_degrees(it(name), lnc) == expected


def test_trn1_never_takes_tp_4():
    for name in ("trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge"):
        assert 4 not in devices.legal_tp_degrees(it(name), 1)


def test_tp_24_only_on_inf2_48xlarge():
    holders = [name for name in PUBLISHED
               if 24 in devices.legal_tp_degrees(it(name), default_lnc(name))
               or 24 in devices.legal_tp_degrees(it(name), 1)]
    assert holders == ["inf2.48xlarge"]


def test_no_tp_degree_exceeds_the_nodes_cores():
    for name in PUBLISHED:
        for lnc in it(name).family.lnc_choices:
            assert all(tp <= it(name).cores(lnc) for tp in devices.legal_tp_degrees(it(name), lnc))


# --- smallest_instance_for -----------------------------------------------------------------------------------

@pytest.mark.parametrize("tp", [1, 2])
def test_small_tp_lands_on_a_two_core_type(tp):
    found = devices.smallest_instance_for(tp, "auto")
    assert found is not None and PUBLISHED[found.name][1] == 2


@pytest.mark.parametrize("tp, framework, expected", [
    (4, "auto", "trn2.3xlarge"),  # 4 logical cores at LNC 2: the only 4-core node
    (4, "nxdi", "trn2.3xlarge"),
    (4, "tnx", "inf2.24xlarge"),  # trn1 never takes 4, trn2 never ran TNx: the 12-core inf2
    (8, "auto", "inf2.24xlarge"),  # 12 cores beats trn1.32xlarge's 32 and trn2.48xlarge's 64
    (16, "auto", "trn1.32xlarge"),
    (24, "auto", "inf2.48xlarge"),
    (32, "auto", "trn1.32xlarge"),  # not trn1n (the same chips with twice the EFA), not trn2.48xlarge (64)
    (32, "tnx", "trn1.32xlarge"),
    (64, "auto", "trn2.48xlarge"),  # not trn2u
    (64, "nxdi", "trn2.48xlarge"),
])
def test_smallest_instance_for(tp, framework, expected):
    found = devices.smallest_instance_for(tp, framework)
    assert found is not None and found.name == expected


@pytest.mark.parametrize("tp, framework", [
    (128, "auto"),  # only trn2.48xlarge at LNC 1, which is not the default
    (64, "tnx"),  # only trn2 holds 64, and TNx never ran there
    (3, "auto"), (12, "auto"), (48, "auto"), (256, "auto"),
])
def test_smallest_instance_for_nothing(tp, framework):
    assert devices.smallest_instance_for(tp, framework) is None


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 24, 32])
def test_tnx_never_lands_on_trn2(tp):
    found = devices.smallest_instance_for(tp, "tnx")
    assert found is not None and family_of(found.name) != "trn2"


def test_smallest_instance_for_is_the_fewest_cores_that_hold_tp():
    """Brute force over the published table: no instance with fewer cores has that TP degree legal."""
    for tp in (1, 2, 4, 8, 16, 24, 32, 64):
        found = devices.smallest_instance_for(tp, "auto")
        holders = [n for n in PUBLISHED if tp in NXDI_TP[family_of(n)] and tp <= PUBLISHED[n][1]]
        assert PUBLISHED[found.name][1] == min(PUBLISHED[n][1] for n in holders)


# --- neuron_request ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, lnc, tp, cores, devices_", [
    ("inf2.xlarge", 1, 1, 1, 1),
    ("inf2.xlarge", 1, 2, 2, 1),
    ("inf2.48xlarge", 1, 8, 8, 4),
    ("inf2.48xlarge", 1, 24, 24, 12),
    ("trn1.32xlarge", 1, 32, 32, 16),
    ("trn2.48xlarge", 2, 8, 8, 2),  # 4 logical cores per chip at LNC 2
    ("trn2.48xlarge", 2, 64, 64, 16),
    ("trn2.48xlarge", 1, 8, 8, 1),  # 8 per chip at LNC 1
    ("trn2.48xlarge", 1, 128, 128, 16),
])
def test_neuroncore_mode_requests_tp_cores(name, lnc, tp, cores, devices_):
    request = devices.neuron_request(it(name), lnc, tp, "neuroncore")
    assert request.as_resources() == {"aws.amazon.com/neuroncore": str(tp)}
    assert (request.cores, request.devices) == (cores, devices_)


@pytest.mark.parametrize("name, lnc, tp, chips, cores", [
    ("inf2.xlarge", 1, 1, 1, 2),  # a whole device: both of its cores
    ("inf2.48xlarge", 1, 8, 4, 8),
    ("inf2.48xlarge", 1, 24, 12, 24),
    ("trn1.32xlarge", 1, 16, 8, 16),
    ("trn2.48xlarge", 2, 8, 2, 8),
    ("trn2.48xlarge", 2, 2, 1, 4),  # one Trainium2 chip is 4 logical cores at LNC 2
    ("trn2.48xlarge", 1, 2, 1, 8),
    ("trn2.3xlarge", 2, 4, 1, 4),
])
def test_whole_device_mode_requests_chips(name, lnc, tp, chips, cores):
    request = devices.neuron_request(it(name), lnc, tp, "neuron")
    assert request.as_resources() == {"aws.amazon.com/neuron": str(chips)}
    assert (request.cores, request.devices) == (cores, chips)
    assert request.cores >= tp


# --- fit_warning ---------------------------------------------------------------------------------------------

def weights_gib(parameters: float, bytes_per: int) -> float:
    return parameters * bytes_per / GIB


def named_tp(message: str) -> int:
    found = re.search(r"tensorParallelDegree to (?:at least )?(\d+)", message)
    assert found, message
    return int(found.group(1))


def test_70b_bf16_on_tp8_inf2_warns_and_names_a_legal_tp_that_holds_it():
    message = devices.fit_warning(70e9, "bfloat16", it("inf2.48xlarge"), 1, 8)
    assert message is not None
    assert "parallelism.tensorParallelDegree" in message and "inf2.48xlarge" in message
    tp = named_tp(message)
    assert tp * 16 >= weights_gib(70e9, 2)  # 130 GiB of weights: more than 8 x 16 GiB
    # The advice must be a degree the user can set on inf2 (the CRD refuses, say, 10): NxDI's inf2 list.
    assert tp in NXDI_TP["inf2"]
    assert tp == 24


def test_70b_auto_dtype_is_bfloat16():
    assert devices.fit_warning(70e9, "auto", it("inf2.48xlarge"), 1, 8) == \
        devices.fit_warning(70e9, "bfloat16", it("inf2.48xlarge"), 1, 8)
    assert "bfloat16" in devices.fit_warning(70e9, "auto", it("inf2.48xlarge"), 1, 8)


@pytest.mark.parametrize("name, lnc, tp", [("inf2.xlarge", 1, 2), ("trn1.2xlarge", 1, 2), ("inf2.48xlarge", 1, 8)])
def test_8b_fits(name, lnc, tp):
    # 8B bf16 is ~15 GiB: it fits 2 x 16 GiB (the NxDI guide puts Llama-3.1-8B on trn1.2xlarge).
    assert devices.fit_warning(8e9, "bfloat16", it(name), lnc, tp) is None


def test_70b_on_16_trn1_cores_fits():
    # The NxDI guide: Llama-3.1-70B (~148 GB) on 16 cores of trn1.32xlarge (256 GiB).
    assert devices.fit_warning(70e9, "bfloat16", it("trn1.32xlarge"), 1, 16) is None


def test_trn2_has_24_gib_per_core_at_lnc2_and_12_at_lnc1():
    # 70B bf16 (130 GiB) fits 8 x 24 GiB but not 8 x 12 GiB.
    assert devices.fit_warning(70e9, "bfloat16", it("trn2.48xlarge"), 2, 8) is None
    message = devices.fit_warning(70e9, "bfloat16", it("trn2.48xlarge"), 1, 8)
    assert message is not None
    tp = named_tp(message)
    assert tp * 12 >= weights_gib(70e9, 2) and tp in NXDI_TP_TRN2_LNC1


def test_float32_doubles_the_bytes():
    # 10B: 18.6 GiB in bf16 fits 2 x 16 GiB; 37 GiB in float32 does not.
    assert devices.fit_warning(10e9, "bfloat16", it("inf2.xlarge"), 1, 2) is None
    assert devices.fit_warning(10e9, "float16", it("inf2.xlarge"), 1, 2) is None
    message = devices.fit_warning(10e9, "float32", it("inf2.xlarge"), 1, 2)
    assert message is not None and "float32" in message
    bf16 = devices.fit_warning(70e9, "bfloat16", it("inf2.48xlarge"), 1, 8)
    fp32 = devices.fit_warning(70e9, "float32", it("inf2.48xlarge"), 1, 8)
    gib = lambda text: int(re.search(r"\((\d+) GiB in", text).group(1))  # noqa: E731
    assert gib(bf16) == round(weights_gib(70e9, 2)) and gib(fp32) == round(weights_gib(70e9, 4))


def test_advice_beyond_the_instance_says_so():
    # inf2.24xlarge has 12 cores; the next inf2 degree that holds 130 GiB is 24, which needs a larger node.
    message = devices.fit_warning(70e9, "bfloat16", it("inf2.24xlarge"), 1, 8)
    assert named_tp(message) == 24 and "larger" in message


def test_a_model_no_single_node_holds_points_to_a_multi_node_shape():
    # 405B bf16 is ~754 GiB: more than inf2.48xlarge's 384 GiB, so only more nodes help.
    message = devices.fit_warning(405e9, "bfloat16", it("inf2.48xlarge"), 1, 24)
    assert message is not None and "nodes" in message
    assert re.search(r"tensorParallelDegree to (\d+)", message) is None  # no single-node degree holds it
    shape = re.search(r"parallelism.nodes (\d+) with tensorParallelDegree (\d+)", message)
    assert shape, message
    nodes, tp = int(shape.group(1)), int(shape.group(2))
    assert tp % nodes == 0 and tp // nodes in NXDI_TP["inf2"] and tp // nodes <= 24
    assert tp * 16 >= weights_gib(405e9, 2)


# --- host CPU and RAM: the automatic choice, the default requests ----------------------------------------------

#: name -> (vCPUs, host memory GiB), from the AWS instance-type pages (Inf2, Trn1, Trn2)
HOST = {
    "inf2.xlarge": (4, 16), "inf2.8xlarge": (32, 128), "inf2.24xlarge": (96, 384), "inf2.48xlarge": (192, 768),
    "trn1.2xlarge": (8, 32), "trn1.32xlarge": (128, 512), "trn1n.32xlarge": (128, 512),
    "trn2.3xlarge": (12, 128), "trn2.48xlarge": (192, 2048), "trn2u.48xlarge": (192, 2048),
}


def _millicores(quantity: str) -> int:
    return int(quantity.removesuffix("m")) if quantity.endswith("m") else int(quantity) * 1000


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity.removesuffix("Mi"))


@pytest.mark.parametrize("name", sorted(HOST))
def test_host_cpu_and_memory_match_the_instance_page(name):
    assert (it(name).vcpus, it(name).memory_gib) == HOST[name]


@pytest.mark.parametrize("name", sorted(HOST))
def test_a_node_full_of_pods_fits_its_allocatable_with_room_for_the_system(name):
    """However a node is split, its pods' default requests leave at least 1 vCPU and 2 GiB (kubelet, DaemonSets) and
    each pod gets its share of the node's NeuronCores of the rest: at least 90% of it."""
    instance, lnc = it(name), devices.lnc_of(it(name), None)
    vcpus, gib = HOST[name]
    for cores in {1, *devices.legal_tp_degrees(instance, lnc)}:
        pods = instance.cores(lnc) // cores
        requests = devices.default_requests(instance, lnc, cores)
        cpu_m, mem_mib = _millicores(requests["cpu"]), _mib(requests["memory"])
        assert pods * cpu_m <= vcpus * 1000 - 1000, (name, cores)
        assert pods * mem_mib <= (gib - 2) * 1024, (name, cores)
        share = cores / instance.cores(lnc)
        assert cpu_m >= 0.9 * (vcpus * 1000 - 1000) * share - 1000 and cpu_m > 0, (name, cores)
        assert mem_mib >= 0.9 * (gib - 2) * 1024 * share, (name, cores)


def test_two_one_core_pods_on_one_inf2_device_each_get_half_the_node():
    whole, half = (devices.default_requests(it("inf2.xlarge"), 1, cores) for cores in (2, 1))
    assert _millicores(half["cpu"]) * 2 <= _millicores(whole["cpu"]) <= _millicores(half["cpu"]) * 2 + 1
    assert _mib(half["memory"]) * 2 <= _mib(whole["memory"]) <= _mib(half["memory"]) * 2 + 1


def test_an_8b_checkpoint_skips_the_16_gib_inf2_xlarge():
    eight_b = devices.loading_gib(8e9, "bfloat16")
    assert 15 * 1.2 < eight_b < 15 * 1.3  # ~15 GiB of weights, with the loading margin
    assert not devices.host_fit(it("inf2.xlarge"), eight_b) and devices.host_fit(it("inf2.8xlarge"), eight_b)
    assert devices.smallest_instance_for(2, "auto").name == "inf2.xlarge"
    assert devices.smallest_instance_for(2, "auto", eight_b).name == "inf2.8xlarge"
    assert devices.smallest_instance_for(2, "auto", devices.loading_gib(1e9, "bfloat16")).name == "inf2.xlarge"
    assert devices.smallest_instance_for(8, "auto", devices.loading_gib(2e12, "bfloat16")) is None


def test_host_memory_warning_names_a_larger_instance_or_pre_sharding():
    eight_b = devices.loading_gib(8e9, "bfloat16")
    assert devices.host_memory_warning(eight_b, it("inf2.8xlarge"), sharded=False) is None
    warning = devices.host_memory_warning(eight_b, it("inf2.xlarge"), sharded=False)
    assert "inf2.xlarge" in warning and "e.g. inf2.8xlarge" in warning and f"{eight_b:.0f} GiB" in warning
    huge = devices.loading_gib(405e9, "bfloat16")
    assert "shardedWeights" in devices.host_memory_warning(huge, it("trn1.32xlarge"), sharded=False)
    assert "parallelism.nodes" in devices.host_memory_warning(huge, it("trn1.32xlarge"), sharded=True)


def test_a_pod_requests_at_least_the_ram_its_weights_load_into():
    trn1 = it("trn1.32xlarge")
    share = _mib(devices.default_requests(trn1, 1, 8)["memory"])  # a quarter of the node
    seventy_b = devices.loading_gib(70e9, "bfloat16")  # ~163 GiB: more than a quarter of 512 GiB
    assert share < seventy_b * 1024 <= _mib(devices.default_requests(trn1, 1, 8, seventy_b)["memory"]) + 1
    assert _mib(devices.default_requests(trn1, 1, 8, 1.0)["memory"]) == share  # the share when it is more
    capped = _mib(devices.default_requests(trn1, 1, 8, 10_000)["memory"])  # never beyond what the node has
    assert capped == _mib(devices.default_requests(trn1, 1, 32)["memory"])
