"""The artifact-key inputs: which model, which versions, which target; each changes the key, nothing else does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from neuronmodel_runtime.artifacts.key import key_inputs, model_identity
from neuronmodel_runtime.config import load_config
from neuronmodel_runtime.frameworks import FrameworkDetection

TARGET = Path(__file__).resolve().parents[2] / "assets" / "tiny" / "target"


def host(**related) -> FrameworkDetection:
    return FrameworkDetection({"nxdi": "0.9.17334", "tnx": None, "torch": "2.9.0"},
                              {"neuronx-cc": "2.23.6484.0", **related}, [], neuron_runtime="2.25.57.0")


def test_a_fetched_model_is_its_source_and_revision(tmp_path):
    (tmp_path / ".neuronmodel-fetch.json").write_text(json.dumps(
        {"source": "hf://meta-llama/Llama-3.1-8B", "revision": "main", "commit": "abc123", "files": {}}))
    assert model_identity(tmp_path) == {"source": "hf://meta-llama/Llama-3.1-8B", "revision": "main",
                                        "commit": "abc123"}


def test_any_other_model_is_a_digest_of_its_weights_remembered_per_folder(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(TARGET, model)
    first = model_identity(model, tmp_path / "memo")
    assert set(first) == {"weights_sha256"} and len(first["weights_sha256"]) == 64
    assert model_identity(model, tmp_path / "memo") == first and len(list((tmp_path / "memo").iterdir())) == 1
    (model / "tokenizer.json").write_text("{}")  # not a weight: same model
    assert model_identity(model, tmp_path / "memo") == first
    data = bytearray((model / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (model / "model.safetensors").write_bytes(bytes(data))  # one bit of one weight
    assert model_identity(model, tmp_path / "memo") != first


def test_versions_target_lnc_and_parallelism_are_in_the_inputs(tmp_path):
    config = load_config(None, {"model": str(TARGET)}, env={})
    inputs = key_inputs(config, TARGET, "nxdi", "0.9.17334", {"batch_size": 8}, detection=host(),
                        env={"NEURONMODEL_INSTANCE_FAMILY": "trn2", "NEURON_LOGICAL_NC_CONFIG": "2"},
                        memo_dir=tmp_path)
    assert inputs["versions"] == {"neuronx-cc": "2.23.6484.0", "torch": "2.9.0", "neuron_runtime": "2.25.57.0"}
    assert (inputs["instance_family"], inputs["logical_nc_config"]) == ("trn2", "2")
    assert inputs["shape"] == {"batch_size": 8} and inputs["draft_model"] is None
    bare = key_inputs(config, TARGET, "nxdi", "0.9.17334", {"batch_size": 8}, detection=host(), env={},
                      memo_dir=tmp_path)
    assert (bare["instance_family"], bare["logical_nc_config"]) == (None, None)
    other_compiler = key_inputs(config, TARGET, "nxdi", "0.9.17334", {"batch_size": 8},
                                detection=host(**{"neuronx-cc": "2.26.6360.0"}), env={}, memo_dir=tmp_path)
    assert other_compiler["versions"] != bare["versions"]


def test_the_operator_sets_the_variable_the_key_reads(tmp_path):
    from neuronmodel_operator import api

    config = load_config(None, {"model": str(TARGET)}, env={})
    inputs = key_inputs(config, TARGET, "nxdi", "0.9.17334", {}, detection=host(),
                        env={api.ENV_INSTANCE_FAMILY: "inf2"}, memo_dir=tmp_path)
    assert inputs["instance_family"] == "inf2"
