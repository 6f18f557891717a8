"""RuntimeConfig: defaults, file + env + flag precedence, errors that name the field, and the rules across fields
it shares with the CRD (config/rules.py)."""

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from neuronmodel_runtime.config import ConfigError, RuntimeConfig, SpeculationConfig, load_config, rules


def test_defaults_match_the_design_document():
    cfg = RuntimeConfig()
    assert (cfg.model, cfg.framework, cfg.max_num_seqs, cfg.max_model_len, cfg.max_context_length) == (
        None, "auto", 8, 2048, 1024)
    assert cfg.sampling.on_device and cfg.sampling.global_top_k == 256
    assert cfg.speculation.mode == "none" and cfg.speculation.num_speculative_tokens == 4
    assert (cfg.server.host, cfg.server.port, cfg.server.max_queue) == ("127.0.0.1", 8000, 256)
    assert cfg.compile_cache.policy == "IfNotCached"


def test_file_then_env_then_flags(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"max_num_seqs": 4, "server": {"port": 9000}, "sampling": {"global_top_k": 64}}))
    env = {"NEURONMODEL_PORT": "9100", "NEURONMODEL_ON_DEVICE_SAMPLING": "false"}
    cfg = load_config(path, {"max_num_seqs": 2}, env=env)
    assert cfg.max_num_seqs == 2 and cfg.server.port == 9100 and cfg.sampling.global_top_k == 64
    assert cfg.sampling.on_device is False


def test_vllm_framework_variable_is_honoured_and_checked():
    assert load_config(env={"VLLM_NEURON_FRAMEWORK": "transformers-neuronx"}).framework == "tnx"
    assert load_config(env={"VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference"}).framework == "nxdi"
    with pytest.raises(ConfigError, match="VLLM_NEURON_FRAMEWORK"):
        load_config(env={"VLLM_NEURON_FRAMEWORK": "tnx"})
    # NEURONMODEL_FRAMEWORK wins over the vLLM variable
    assert load_config(env={"VLLM_NEURON_FRAMEWORK": "transformers-neuronx",
                            "NEURONMODEL_FRAMEWORK": "torch"}).framework == "torch"


@pytest.mark.parametrize(
    "data, field",
    [
        ({"max_num_seq": 4}, "max_num_seq: unknown key"),
        ({"server": {"prot": 1}}, "server.prot: unknown key"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"framework": "cuda"}, "framework"),
        ({"speculation": {"mode": "draft"}}, "draft_model is required"),
        ({"max_context_length": 4096}, "max_context_length must be <= max_model_len"),
        ({"speculation": {"draft_model": "/d"}}, "speculation.draft_model is used by speculation.mode draft and "
         "eagle only, not 'none'"),
        ({"speculation": {"prompt_lookup_min": 5}}, "prompt_lookup_min must be <= speculation.prompt_lookup_max"),
        ({"parallelism": {"tensor_parallel_degree": 32, "nodes": 3}}, "parallelism.nodes must divide "
         "parallelism.tensor_parallel_degree"),
        ({"parallelism": {"nodes": 65}}, "parallelism.nodes"),
        ({"sampling": {"global_top_k": "many"}}, "sampling.global_top_k"),
    ],
)
def test_bad_values_name_the_field(tmp_path, data, field):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(path, env={})


def test_bad_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json", env={})
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path / "bad.json", env={})


def test_api_key_is_masked_and_never_echoed_in_errors():
    cfg = load_config(env={"NEURONMODEL_API_KEY": "s3cret"})
    assert cfg.server.api_key.get_secret_value() == "s3cret"
    assert "s3cret" not in json.dumps(cfg.public_dict()) and "s3cret" not in repr(cfg)
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"server.api_key": "s3cret", "server.port": "s3cret"}, env={})
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize("fields, field", [
    ({"mode": "eagle"}, "speculation.draft_model"),
    ({"mode": "promptLookup", "draft_model": "/d"}, "speculation.draft_model"),
    ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "speculation.prompt_lookup_min"),
])
def test_a_broken_rule_names_the_field_to_change(fields, field):
    """The operator maps RuleViolation.field to the spec field it comes from (builders/configmap.py)."""
    with pytest.raises(ValidationError) as info:
        SpeculationConfig(**fields)
    violation = info.value.errors()[0]["ctx"]["error"]
    assert isinstance(violation, rules.RuleViolation) and violation.field == field


def test_each_rule_holds_on_the_defaults_and_writes_itself_as_cel():
    RuntimeConfig(max_context_length=1024)  # every rule checked, the context rule explicitly
    names = {"speculation.draft_model": "s.draftModel", "speculation.mode": "s.mode",
             "speculation.prompt_lookup_min": "s.lo", "speculation.prompt_lookup_max": "s.hi",
             "max_context_length": "b.ctx", "max_model_len": "b.seq", "parallelism.nodes": "p.nodes",
             "parallelism.tensor_parallel_degree": "p.tp"}
    assert [rule.cel(names.__getitem__)[0] for rule in rules.RULES] == [
        "self.mode in ['draft', 'eagle'] ? has(self.draftModel) : !has(self.draftModel)",
        "self.lo <= self.hi", "self.ctx <= self.seq", "self.tp % self.nodes == 0"]


def test_whole_seconds_are_written_as_json_integers():
    """The operator's ConfigMaps are named by their bytes, which have always had `"drain_timeout_s": 30`."""
    server = RuntimeConfig(server={"drain_timeout_s": 30, "request_timeout_s": 2.5}).model_dump(mode="json")["server"]
    assert (server["drain_timeout_s"], server["request_timeout_s"], server["liveness_timeout_s"]) == (30, 2.5, 120)
    assert isinstance(RuntimeConfig().server.drain_timeout_s, float)


def test_the_contract_package_imports_nothing_heavy():
    code = ("import sys, neuronmodel_runtime.config; heavy = {'torch', 'transformers', 'huggingface_hub', 'boto3', "
            "'fastapi', 'uvicorn', 'neuronmodel_runtime.fetch', 'neuronmodel_runtime.server'}; "
            "print(sorted(heavy & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
