"""The NxDI runner's own rules, on the contract fake of each release: its NeuronConfig, the model registry, the
compiled-artifacts lifecycle, EAGLE / EAGLE3 per release. The generation behaviour shared with every runner is in
test_runner_suite.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from runtime_tests.helpers.fake_neuron.install import install_nxdi
from runtime_tests.helpers.fake_neuron.tiny import hf_greedy
from neuronmodel_runtime.artifacts.folder import ARTIFACTS_MARKER as LOCAL_MARKER
from neuronmodel_runtime.config import load_config
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.runners.neuron_nxdi import NxdiRunner, load_ranks
from neuronmodel_runtime.runners.nxdi_config import neuron_config_kwargs, speculation_length
from runtime_tests.helpers.runner_helpers import generate

TINY = Path(__file__).resolve().parents[2] / "assets" / "tiny"
SPEC = {"mode": "draft", "draft_model": str(TINY / "draft"), "num_speculative_tokens": 3}


def config(**overrides):
    fields = {"model": str(TINY / "target"), "framework": "nxdi", "max_num_seqs": 4, "max_model_len": 64,
              "max_context_length": 32, "dtype": "float32", **overrides}
    return load_config(None, fields, env={})


@pytest.fixture
def nxdi(monkeypatch, tmp_path):
    """Factory: version -> the fake of that release installed; NEURONMODEL_CACHE in tmp_path."""
    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", "/var/tmp/neuron-compile-cache")  # restored after the test
    monkeypatch.delenv("NEURON_COMPILED_ARTIFACTS", raising=False)
    return lambda version="0.9.17334": install_nxdi(monkeypatch, version, tmp_path / "site")


def loaded(cfg, model=None):
    runner = NxdiRunner(cfg, str(model or TINY / "target"))
    runner.load()
    return runner


def test_the_neuron_config_of_a_runtime_config():
    kwargs = neuron_config_kwargs(config(sampling={"global_top_k": 64}))
    assert kwargs == {
        "tp_degree": 1, "batch_size": 4, "ctx_batch_size": 1, "tkg_batch_size": 4, "max_batch_size": 4,
        "is_continuous_batching": True, "max_context_length": 32, "seq_len": 64, "torch_dtype": "float32",
        "padding_side": "right", "enable_bucketing": True, "save_sharded_checkpoint": False,
        "on_device_sampling_config": {"dynamic": True, "do_sample": True, "deterministic": False, "global_topk": 64},
    }
    spec = neuron_config_kwargs(config(speculation=SPEC))
    assert spec["speculation_length"] == 4 == speculation_length(config(speculation=SPEC))  # k drafts: k+1 tokens
    assert spec["seq_len"] == 64 + 3 and spec["enable_fused_speculation"] is True
    assert spec["on_device_sampling_config"]["do_sample"] is False  # NxDI verifies by argmax
    assert "on_device_sampling_config" not in neuron_config_kwargs(config(sampling={"on_device": False}))
    eagle = neuron_config_kwargs(config(speculation={**SPEC, "mode": "eagle"}), eagle3=True)
    assert eagle["enable_eagle_speculation"] is True and eagle["is_eagle3"] is True


def test_the_logical_neuron_core_config_is_part_of_the_compiled_shape():
    assert neuron_config_kwargs(config(), env={"NEURON_LOGICAL_NC_CONFIG": "2"})["logical_nc_config"] == 2
    assert "logical_nc_config" not in neuron_config_kwargs(config(), env={})
    with pytest.raises(RunnerError, match="NEURON_LOGICAL_NC_CONFIG='4'"):
        neuron_config_kwargs(config(), env={"NEURON_LOGICAL_NC_CONFIG": "4"})


def test_multi_node_ranks_split_the_tensor_parallel_degree():
    cfg = config(parallelism={"tensor_parallel_degree": 64, "nodes": 2})
    assert neuron_config_kwargs(cfg)["tp_degree"] == 64
    assert load_ranks(cfg, 1) == {"start_rank_id": 32, "local_ranks_size": 32}
    assert load_ranks(config(), 0) == {"start_rank_id": None, "local_ranks_size": None}


@pytest.mark.parametrize("version", ["0.3.5591", "0.9.17334"])
def test_each_host_of_a_group_loads_only_its_ranks_of_one_compile(nxdi, version):
    """TP 4 over two hosts: one compile (local_ranks_size 2 in its NeuronConfig), host n loading ranks 2n, 2n+1
    (named to load() and to the loaded NeuronConfig, which sharding on load reads); each serves the checkpoint's
    greedy tokens (the fake computes the whole model on every host)."""
    nxdi(version)
    from neuronx_distributed_inference.models import model_base

    cfg = config(parallelism={"tensor_parallel_degree": 4, "nodes": 2})
    hosts = [NxdiRunner(cfg, str(TINY / "target"), node_rank=n) for n in (0, 1)]
    for host in hosts:
        host.load()
    assert [h.model.loaded_ranks for h in hosts] == [[0, 1], [2, 3]] and model_base.COMPILES == 1
    assert {h.model.neuron_config.local_ranks_size for h in hosts} == {2} and hosts[1].info()["tp_degree"] == 4
    assert greedy_tokens(hosts[1], [48, 911, 7]) == greedy_tokens(loaded(config()), [48, 911, 7])


def test_compiles_once_then_loads_the_artifacts(nxdi):
    library = nxdi()
    from neuronx_distributed_inference.models import model_base

    first = loaded(config())
    assert first.info()["compiled_now"] is True and model_base.COMPILES == 1
    folder = Path(first.info()["artifacts"]["folder"])
    assert (folder / LOCAL_MARKER).is_file() and (folder / "model.pt").is_file()
    second = loaded(config())
    assert second.info()["compiled_now"] is False and model_base.COMPILES == 1
    assert second.info()["artifacts"]["folder"] == str(folder) and second.info()["artifacts"]["source"] == "local"
    other = loaded(config(max_num_seqs=2))  # another compiled shape: another folder
    assert other.info()["artifacts"]["folder"] != str(folder) and model_base.COMPILES == 2
    assert library.__version__.startswith("0.9")


def test_a_partial_compile_is_never_loaded_and_policies_are_honoured(nxdi, monkeypatch):
    nxdi()
    from neuronx_distributed_inference.models import model_base

    folder = Path(loaded(config()).info()["artifacts"]["folder"])
    (folder / LOCAL_MARKER).unlink()  # as if the compile had been interrupted
    assert loaded(config()).info()["compiled_now"] is True and model_base.COMPILES == 2
    assert loaded(config(compile_cache={"policy": "Always"})).info()["compiled_now"] is True
    shutil.rmtree(folder)
    with pytest.raises(RunnerError, match="no compiled artifacts for key .* compile_cache.policy is Never"):
        loaded(config(compile_cache={"policy": "Never"}))


def test_a_folder_holding_another_shape_is_recompiled_never_served(nxdi, monkeypatch, tmp_path):
    nxdi()
    monkeypatch.setenv("NEURON_COMPILED_ARTIFACTS", str(tmp_path / "shared"))
    loaded(config(max_num_seqs=2))
    runner = loaded(config())
    assert runner.info()["compiled_now"] is True and runner.capacity().max_num_seqs == 4


def test_compile_writes_the_artifacts_into_the_store_without_loading(nxdi, tmp_path):
    nxdi()
    from neuronx_distributed_inference.models import model_base

    stored = config(compile_cache={"url": str(tmp_path / "pvc"), "policy": "IfNotCached"})
    artifacts = NxdiRunner(stored, str(TINY / "target")).compile()
    assert artifacts.outcome.compiled and model_base.COMPILES == 1
    entry = tmp_path / "pvc" / artifacts.key.digest
    assert (entry / "manifest.json").is_file() and (entry / "model.pt").is_file()
    shutil.rmtree(artifacts.folder)  # a new pod: nothing local
    serving = loaded(config(compile_cache={"url": str(tmp_path / "pvc"), "policy": "Never"}))
    assert serving.info()["artifacts"]["source"] == "store" and model_base.COMPILES == 1


def test_pre_sharded_weights_travel_with_the_artifacts_when_asked(nxdi, tmp_path):
    """compile_cache.sharded_weights: the compile writes each rank's shard into the artifacts (NxDI's
    save_sharded_checkpoint), the store holds them, and a new pod loads them; without it none are written and the
    two are different entries."""
    nxdi()
    store = {"url": str(tmp_path / "pvc"), "sharded_weights": True}
    cfg = config(parallelism={"tensor_parallel_degree": 2}, compile_cache=store)
    artifacts = NxdiRunner(cfg, str(TINY / "target")).compile()
    shards = ["weights/tp0_sharded_checkpoint.safetensors", "weights/tp1_sharded_checkpoint.safetensors"]
    manifest = json.loads((tmp_path / "pvc" / artifacts.key.digest / "manifest.json").read_text())
    assert set(shards) <= {f["path"] for f in manifest["files"]}
    shutil.rmtree(artifacts.folder)  # a new pod
    serving = loaded(config(parallelism={"tensor_parallel_degree": 2}, compile_cache={**store, "policy": "Never"}))
    assert serving.info()["artifacts"]["source"] == "store"
    assert all((Path(serving.info()["artifacts"]["folder"]) / s).is_file() for s in shards)
    plain = NxdiRunner(config(parallelism={"tensor_parallel_degree": 2}, compile_cache={"url": store["url"]}),
                       str(TINY / "target")).compile()
    assert plain.key != artifacts.key and not (plain.folder / "weights").exists()


def test_an_unsupported_model_type_lists_what_the_release_serves(nxdi, tmp_path):
    nxdi("0.3.5591")
    model = tmp_path / "qwen"
    shutil.copytree(TINY / "target", model)
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, "model_type": "qwen2"}))
    with pytest.raises(RunnerError, match=r"model_type 'qwen2' is not supported by NxDI 0.3.5591 \(no models/qwen2 "
                                          r"before 0.4, .*q/k/v biases would be dropped\) "
                                          r"\(it serves: dbrx, llama, mixtral\)"):
        loaded(config(model=str(model)), model)


def test_eagle3_drafts_need_nxdi_0_7(nxdi, tmp_path):
    draft = tmp_path / "eagle3"
    shutil.copytree(TINY / "draft", draft)
    raw = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**raw, "architectures": ["LlamaForCausalLMEagle3"]}))
    eagle3 = config(speculation={**SPEC, "mode": "eagle", "draft_model": str(draft)})
    nxdi("0.6.10598")
    with pytest.raises(RunnerError, match="EAGLE3 draft.*NxDI 0.7"):
        loaded(eagle3)


@pytest.mark.parametrize("version", ["0.3.5591", "0.9.17334"])
def test_eagle_speculation_serves_greedy_output(nxdi, version):
    nxdi(version)
    runner = loaded(config(speculation={**SPEC, "mode": "eagle"}))
    assert runner.capabilities().fused_speculation == ("eagle",)
    assert runner.capabilities().sampling.sampled is False and runner.capacity().speculation_length == 3


def test_only_releases_it_was_not_written_against_are_warned_about(nxdi, caplog):
    from neuronmodel_runtime.runners.neuron_library import release_warning

    nxdi("0.10.17970")
    with caplog.at_level(logging.WARNING, logger="neuronmodel_runtime"):
        runner = loaded(config())
    assert runner.info()["sdk"] == "2.30-2.31" and runner.info()["written_against"] is True
    assert not [r for r in caplog.records if r.name.startswith("neuronmodel_runtime")]
    assert release_warning("nxdi", "0.11.2") == (
        "nxdi 0.11.2 is not a release this runner was written against (0.3-0.10 (SDK 2.23-2.31)); it may work, but "
        "only those were checked against the library's source")


def test_what_nxdi_cannot_serve_is_refused_at_load(nxdi):
    nxdi()
    with pytest.raises(RunnerError, match="promptLookup"):
        loaded(config(speculation={"mode": "promptLookup"}))
    with pytest.raises(RunnerError, match="sampling.on_device=true"):
        loaded(config(speculation=SPEC, sampling={"on_device": False}))
    with pytest.raises(RunnerError, match="compile_cache.sharded_weights with parallelism.nodes > 1"):
        loaded(config(parallelism={"tensor_parallel_degree": 2, "nodes": 2}, compile_cache={"sharded_weights": True}))


@pytest.mark.parametrize("version", ["0.3.5591", "0.6.10598", "0.9.17334"])
@pytest.mark.parametrize("speculation", [{}, SPEC, {**SPEC, "mode": "eagle"}], ids=["plain", "draft", "eagle"])
def test_every_neuron_config_keyword_is_one_the_release_knows(nxdi, caplog, version, speculation):
    """NxDI only warns about an unknown NeuronConfig keyword and ignores it: a keyword a release lacks would be a
    setting silently not applied."""
    nxdi(version)
    from neuronx_distributed_inference.models.config import NeuronConfig

    cfg = config(speculation=speculation) if speculation else config()
    with caplog.at_level(logging.WARNING):
        NeuronConfig(**neuron_config_kwargs(cfg, env={"NEURON_LOGICAL_NC_CONFIG": "1"}))
    assert not caplog.records, [r.getMessage() for r in caplog.records]


async def test_how_the_artifacts_were_got_is_in_info_and_metrics(nxdi, tmp_path):
    import httpx

    from neuronmodel_runtime.cli import build_engine
    from neuronmodel_runtime.server.app import create_app

    nxdi()
    cfg = config(compile_cache={"url": str(tmp_path / "pvc")})
    for expected_hit in (0.0, 1.0):
        app = create_app(build_engine(cfg), cfg)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
                info = (await client.get("/v1/info")).json()
                metrics = (await client.get("/metrics")).text
        artifacts = info["runner"]["artifacts"]
        assert artifacts["hit"] is bool(expected_hit) and artifacts["compile_s"] >= 0
        assert f'neuronmodel:artifacts_cache_hit{{model_name="target"}} {expected_hit}' in metrics
        assert "neuronmodel:startup_load_seconds" in metrics and info["startup"]["load_s"] > 0
    assert os.environ["NEURON_COMPILE_CACHE_URL"] == str(tmp_path / "pvc") + "/neuronx-cc"


# --- second pass: rules the first contract fakes did not model ---------------------------------------------------

def greedy_tokens(runner, prompt, steps=8):
    return generate(runner, [0], [prompt], steps)[0]


def transformers_greedy(folder, prompt, steps=8):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype="float32").eval()
    return hf_greedy(model, prompt, steps)


def compile_host_copies(tmp_path):
    """The model and draft folders as the compile Job saw them."""
    host = tmp_path / "compile-host"
    for name in ("target", "draft"):
        shutil.copytree(TINY / name, host / name)
    return host


@pytest.mark.parametrize("version", ["0.3.5591", "0.6.10598", "0.9.17334"])
@pytest.mark.parametrize("speculation", [{}, SPEC], ids=["plain", "draft"])
@pytest.mark.parametrize("there_now", ["nothing", "another model"])
def test_artifacts_from_the_store_load_this_pods_checkpoints(nxdi, tmp_path, version, speculation, there_now):
    """The compile Job compiled from its own paths; this pod fetched the artifacts (content-keyed) and has the
    models elsewhere. Where the Job's paths were, there is now nothing, or another model: either way the pod serves
    its own checkpoints (NxDI shards the weights at load from the path in neuron_config.json)."""
    nxdi(version)
    host = compile_host_copies(tmp_path)
    store = {"url": str(tmp_path / "pvc")}
    job_spec = {**speculation, "draft_model": str(host / "draft")} if speculation else {}
    artifacts = NxdiRunner(config(model=str(host / "target"), speculation=job_spec, compile_cache=store),
                           str(host / "target")).compile()
    shutil.rmtree(artifacts.folder)  # the serving pod has nothing local
    shutil.rmtree(host)
    if there_now == "another model":  # the draft's weights where the target was, and vice versa
        shutil.copytree(TINY / "draft", host / "target")
        shutil.copytree(TINY / "target", host / "draft")
    pod_spec = {**speculation, "draft_model": str(TINY / "draft")} if speculation else {}
    serving = loaded(config(speculation=pod_spec, compile_cache={**store, "policy": "Never"}))
    assert serving.info()["artifacts"]["source"] == "store"
    prompt = [1, 2, 3, 4, 5]
    assert greedy_tokens(serving, prompt) == transformers_greedy(TINY / "target", prompt)


@pytest.mark.parametrize("model_type", ["llama4", "pixtral", "qwen2_vl", "qwen3_vl", "mllama"])
def test_multimodal_model_types_are_refused_with_the_reason(nxdi, tmp_path, model_type):
    nxdi("0.8.16251")
    model = tmp_path / model_type
    shutil.copytree(TINY / "target", model)
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, "model_type": model_type}))
    reason = "pixel values" if model_type == "mllama" else "image-to-text model in NxDI"
    with pytest.raises(RunnerError, match=rf"model_type '{model_type}' is .*{reason}.*text-only causal LMs"):
        loaded(config(model=str(model)), model)


@pytest.mark.parametrize("version, served_by", [("0.6.10598", "NeuronLlamaForCausalLM"),
                                                ("0.9.17334", "NeuronMistralForCausalLM")])
def test_mistral_is_served_by_the_llama_class_before_nxdi_0_9(nxdi, tiny_checkpoint, version, served_by):
    nxdi(version)
    mistral = tiny_checkpoint("mistral")  # its sliding window (128) is wider than max_model_len (64)
    runner = loaded(config(model=str(mistral)), mistral)
    assert runner.info()["model_class"] == served_by
    prompt = [5, 9, 13, 2]
    assert greedy_tokens(runner, prompt) == transformers_greedy(mistral, prompt)


def test_a_sliding_window_the_llama_class_cannot_honour_is_refused(nxdi, tiny_checkpoint, tmp_path):
    nxdi("0.6.10598")
    narrow = tmp_path / "mistral"
    shutil.copytree(tiny_checkpoint("mistral"), narrow)
    raw = json.loads((narrow / "config.json").read_text())
    (narrow / "config.json").write_text(json.dumps({**raw, "sliding_window": 16}))
    with pytest.raises(RunnerError, match="no sliding window.*sliding_window is 16 < max_model_len 64.*NxDI 0.9"):
        loaded(config(model=str(narrow)), narrow)
    assert loaded(config(model=str(narrow), max_model_len=16, max_context_length=8), narrow)  # within the window


def test_qwen2_is_served_by_its_own_class_on_nxdi_0_4(nxdi, tiny_checkpoint):
    """0.4 ships models/qwen2 but MODEL_TYPES lists it from 0.5: the Qwen2 class (q/k/v biases), never Llama's."""
    nxdi("0.4.7422")
    qwen2 = tiny_checkpoint("qwen2")
    runner = loaded(config(model=str(qwen2)), qwen2)
    assert runner.info()["model_class"] == "NeuronQwen2ForCausalLM"
    prompt = [7, 3, 11]
    assert greedy_tokens(runner, prompt) == transformers_greedy(qwen2, prompt)


@pytest.mark.parametrize("version", ["0.3.5591", "0.6.10598", "0.9.17334"])
def test_fused_speculation_compiles_again_in_the_same_process(nxdi, version):
    """NxDI up to 0.6 leaves NeuronFusedSpecModel on the class after a fused instance: a second speculative
    compile, and a plain model after it, must still get the class's own decoder."""
    nxdi(version)
    from neuronx_distributed_inference.models import model_base

    prompt = [1, 2, 3, 4, 5]
    expected = transformers_greedy(TINY / "target", prompt)
    for cfg in (config(speculation=SPEC), config(speculation={**SPEC, "num_speculative_tokens": 2}), config()):
        assert greedy_tokens(loaded(cfg), prompt) == expected
    assert model_base.COMPILES == 3


def test_the_global_top_k_is_within_the_device_limit(nxdi):
    nxdi()
    with pytest.raises(RunnerError, match=r"sampling.global_top_k 300 is above 256.*sampling.on_device"):
        loaded(config(sampling={"global_top_k": 300}))
    host = loaded(config(sampling={"global_top_k": 300, "on_device": False}))  # the host sampler has no limit
    assert host.capabilities().sampling.max_top_k == 300


@pytest.mark.parametrize("version", ["0.3.5591", "0.9.17334"])
def test_neuron_config_overrides_are_merged_last_and_checked(nxdi, version):
    nxdi(version)
    runner = loaded(config(neuron_config_overrides={"fused_qkv": True, "sequence_parallel_enabled": True}))
    neuron_config = runner.model.config.neuron_config
    assert neuron_config.fused_qkv is True and neuron_config.sequence_parallel_enabled is True
    plain = loaded(config())
    assert plain.artifacts.key != runner.artifacts.key  # part of the compile key
    with pytest.raises(RunnerError, match=rf"neuron_config_overrides: no_such_keyword is not a NeuronConfig keyword "
                                          rf"of NxDI {version}"):
        loaded(config(neuron_config_overrides={"no_such_keyword": 1}))
    with pytest.raises(RunnerError, match=r"batch_size is set by max_num_seqs; seq_len is set by max_model_len"):
        loaded(config(neuron_config_overrides={"seq_len": 128, "batch_size": 2}))


def test_a_keyword_of_a_later_release_is_unknown_to_an_earlier_one(nxdi):
    nxdi("0.6.10598")
    with pytest.raises(RunnerError, match="disable_argmax_kernel is not a NeuronConfig keyword of NxDI 0.6"):
        loaded(config(neuron_config_overrides={"disable_argmax_kernel": True}))  # 0.8 (cd3abf3)
    nxdi("0.9.17334")
    assert loaded(config(neuron_config_overrides={"disable_argmax_kernel": True}))


@pytest.mark.parametrize("version, family, patched", [("0.10.17970", "inf2", True), ("0.10.17970", "trn2", False),
                                                      ("0.10.17970", None, None), ("0.8.16251", "inf2", False)])
def test_info_says_whether_aws_still_patches_the_line(nxdi, monkeypatch, caplog, version, family, patched):
    nxdi(version)
    if family:
        monkeypatch.setenv("NEURONMODEL_INSTANCE_FAMILY", family)
    with caplog.at_level(logging.WARNING, logger="neuronmodel_runtime"):
        support = loaded(config()).info()["aws_support"]
    assert support["patched"] is patched and support["family"] == family
    assert ("vLLM Neuron" in support["aws_says"]) is (family != "inf2" and version.startswith("0.10"))
    warned = [r.getMessage() for r in caplog.records if "no longer patches" in r.getMessage()]
    assert bool(warned) is (patched is False)
