"""The one settings table: every RuntimeConfig field has an env variable and a flag that really set it, --help
describes each, and the sequence lengths follow the model's config.json as vLLM's do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal, Optional, get_args, get_origin

import pytest
from pydantic import BaseModel, SecretStr

from neuronmodel_runtime import cli
from neuronmodel_runtime.config import (
    SETTINGS,
    ConfigError,
    RuntimeConfig,
    load_config,
    model_length_limit,
    resolve_model_limits,
    settings_table,
)

TINY = Path(__file__).resolve().parents[1] / "assets" / "tiny" / "target"

#: Names documented before the table existed; they must not change.
DOCUMENTED = {
    "model": ("NEURONMODEL_MODEL", "--model"),
    "framework": ("NEURONMODEL_FRAMEWORK", "--framework"),
    "dtype": ("NEURONMODEL_DTYPE", "--dtype"),
    "device": ("NEURONMODEL_DEVICE", "--device"),
    "max_num_seqs": ("NEURONMODEL_MAX_NUM_SEQS", "--max-num-seqs"),
    "max_model_len": ("NEURONMODEL_MAX_MODEL_LEN", "--max-model-len"),
    "max_context_length": ("NEURONMODEL_MAX_CONTEXT_LENGTH", "--max-context-length"),
    "sampling.on_device": ("NEURONMODEL_ON_DEVICE_SAMPLING", "--on-device-sampling"),
    "sampling.global_top_k": ("NEURONMODEL_GLOBAL_TOP_K", None),
    "speculation.mode": ("NEURONMODEL_SPECULATION_MODE", "--speculation-mode"),
    "speculation.draft_model": ("NEURONMODEL_DRAFT_MODEL", "--draft-model"),
    "speculation.num_speculative_tokens": ("NEURONMODEL_NUM_SPECULATIVE_TOKENS", "--num-speculative-tokens"),
    "parallelism.tensor_parallel_degree": ("NEURONMODEL_TENSOR_PARALLEL_DEGREE", None),
    "compile_cache.url": ("NEURONMODEL_COMPILE_CACHE_URL", None),
    "server.host": ("NEURONMODEL_HOST", "--host"),
    "server.port": ("NEURONMODEL_PORT", "--port"),
    "server.api_key": ("NEURONMODEL_API_KEY", "--api-key"),
    "server.max_queue": ("NEURONMODEL_MAX_QUEUE", None),
    "server.request_timeout_s": ("NEURONMODEL_REQUEST_TIMEOUT_S", None),
    "server.served_model_name": ("NEURONMODEL_SERVED_MODEL_NAME", "--served-model-name"),
}

#: Non-default values that other fields' validators also accept (the generic choice would need a draft model).
SAMPLES = {"speculation.mode": "promptLookup"}
#: Other fields a sample needs by the rules across fields (config/rules.py): a draft model only with a draft mode,
#: nodes that divide the TP degree.
COMPANIONS = {"speculation.draft_model": {"speculation.mode": "draft"},
              "parallelism.nodes": {"parallelism.tensor_parallel_degree": "2"}}
#: Fields whose text is JSON: (raw string, the value it must produce).
JSON_SAMPLES = {"neuron_config_overrides": ('{"fused_qkv": true, "cc_pipeline_tiling_factor": 2}',
                                            {"fused_qkv": True, "cc_pipeline_tiling_factor": 2})}


def leaf_fields(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Dotted path -> FieldInfo, walked independently of config.py's own walk."""
    out = {}
    for key, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            out.update(leaf_fields(info.annotation, f"{prefix}{key}."))
        else:
            out[prefix + key] = info
    return out


def sample(path: str) -> tuple[str, Any]:
    """(raw string as a user types it, the value it must produce) for a field, different from its default."""
    if path in SAMPLES:
        return SAMPLES[path], SAMPLES[path]
    if path in JSON_SAMPLES:
        return JSON_SAMPLES[path]
    info = SETTINGS[path].field
    annotation, default = info.annotation, info.default
    if annotation is bool:
        return str(not default).lower(), not default
    if annotation is int:
        return str(default + 1), default + 1
    if annotation == Optional[int]:  # null by default: any count
        return "3", 3
    if annotation is float:
        return str(default + 1.5), default + 1.5
    if get_origin(annotation) is Literal:
        choice = next(c for c in get_args(annotation) if c != default)
        return choice, choice
    return f"sample-{path}", f"sample-{path}"


def value_at(config: RuntimeConfig, path: str) -> Any:
    value: Any = config
    for key in path.split("."):
        value = getattr(value, key)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def flags_config(*argv: str) -> RuntimeConfig:
    return cli._config(cli._parser().parse_args(["info", *argv]))


def test_every_leaf_field_is_in_the_table_with_a_unique_env_variable_and_flag():
    fields = leaf_fields(RuntimeConfig)
    assert set(SETTINGS) == set(fields)
    for path in ("max_num_batched_tokens", "server.drain_timeout_s", "server.liveness_timeout_s",
                 "speculation.prompt_lookup_min", "speculation.prompt_lookup_max", "compile_cache.policy",
                 "parallelism.nodes"):
        assert path in SETTINGS
    envs = [s.env for s in SETTINGS.values()]
    flags = [s.flag for s in SETTINGS.values()]
    assert len(set(envs)) == len(envs) and len(set(flags)) == len(flags)
    assert all(env.startswith("NEURONMODEL_") for env in envs) and all(f.startswith("--") for f in flags)
    assert all(s.field.description for s in SETTINGS.values()), "every field needs its description (shown in --help)"


def test_documented_names_are_kept():
    for path, (env, flag) in DOCUMENTED.items():
        assert SETTINGS[path].env == env
        assert flag is None or SETTINGS[path].flag == flag


def test_the_naming_rule():
    assert (SETTINGS["server.drain_timeout_s"].env, SETTINGS["server.drain_timeout_s"].flag) == (
        "NEURONMODEL_DRAIN_TIMEOUT_S", "--drain-timeout-s")
    assert SETTINGS["compile_cache.policy"].env == "NEURONMODEL_COMPILE_CACHE_POLICY"
    assert SETTINGS["parallelism.nodes"].flag == "--nodes"


def test_a_name_clash_is_refused_when_the_table_is_built():
    class A(BaseModel):
        mode: str = "x"

    class B(BaseModel):
        mode: str = "y"

    class Both(BaseModel):
        a: A = A()
        b: B = B()

    with pytest.raises(TypeError, match="b.mode and a.mode would both be NEURONMODEL_MODE"):
        settings_table(Both)


@pytest.mark.parametrize("path", sorted(SETTINGS))
def test_env_variable_and_flag_set_the_field(path):
    raw, expected = sample(path)
    setting = SETTINGS[path]
    companions = {SETTINGS[other]: value for other, value in COMPANIONS.get(path, {}).items()}
    env = {setting.env: raw, **{other.env: value for other, value in companions.items()}}
    flags = [setting.flag, raw, *(arg for other, value in companions.items() for arg in (other.flag, value))]
    assert value_at(load_config(env=env), path) == expected
    assert value_at(flags_config(*flags), path) == expected


@pytest.mark.parametrize("raw, expected", [("false", False), ("0", False), ("no", False), ("true", True),
                                           ("1", True), ("yes", True)])
def test_boolean_flags_and_variables_parse_words(raw, expected):
    assert flags_config("--on-device-sampling", raw).sampling.on_device is expected
    assert load_config(env={"NEURONMODEL_ON_DEVICE_SAMPLING": raw}).sampling.on_device is expected


def test_flags_override_env_which_overrides_the_file(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"server": {"drain_timeout_s": 1, "liveness_timeout_s": 5},
                                "max_num_batched_tokens": 100, "compile_cache": {"policy": "Never"}}))
    monkeypatch.setenv("NEURONMODEL_DRAIN_TIMEOUT_S", "2")
    monkeypatch.setenv("NEURONMODEL_MAX_NUM_BATCHED_TOKENS", "200")
    monkeypatch.setenv("VLLM_NEURON_FRAMEWORK", "transformers-neuronx")
    cfg = flags_config("--config", str(path), "--drain-timeout-s", "3", "--compile-cache-policy", "Always")
    assert (cfg.server.drain_timeout_s, cfg.server.liveness_timeout_s) == (3, 5)
    assert cfg.max_num_batched_tokens == 200 and cfg.compile_cache.policy == "Always" and cfg.framework == "tnx"
    assert flags_config("--framework", "torch").framework == "torch"


def test_help_shows_every_flag_with_its_meaning(capsys):
    assert cli.main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    text = "".join(out.split())  # argparse wraps lines, also at hyphens
    for setting in SETTINGS.values():
        assert f"  {setting.flag} " in out
        assert "".join(setting.field.description.split()) in text, setting.path
        assert setting.env in text


def test_errors_name_the_flag_the_variable_and_a_misspelt_key(tmp_path):
    with pytest.raises(ConfigError, match=r"server\.port \(--port, NEURONMODEL_PORT\): Input should be less"):
        load_config(env={"NEURONMODEL_PORT": "70000"})
    (tmp_path / "c.json").write_text(json.dumps({"server": {"drain_timout_s": 1}}))
    with pytest.raises(ConfigError, match=r"server\.drain_timout_s: unknown key \(did you mean server\.drain_timeout_s"):
        load_config(tmp_path / "c.json", env={})
    (tmp_path / "c.json").write_text(json.dumps({"server": 5}))
    with pytest.raises(ConfigError, match="server: must be a JSON object"):
        load_config(tmp_path / "c.json", env={"NEURONMODEL_PORT": "9000"})


def test_config_imports_no_torch():
    code = "import sys, neuronmodel_runtime.config; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- sequence lengths from the model's config.json -------------------------------------------------------------


def test_an_unset_max_context_length_follows_a_shorter_max_model_len():
    cfg = RuntimeConfig(max_model_len=512)
    assert cfg.max_context_length == 512 and "max_context_length" not in cfg.model_fields_set
    cfg.max_model_len = 300
    assert cfg.max_context_length == 300
    assert RuntimeConfig(max_model_len=4096).max_context_length == 1024
    with pytest.raises(ValueError, match="max_context_length must be <= max_model_len"):
        RuntimeConfig(max_model_len=512, max_context_length=600)


@pytest.mark.parametrize("model_config, limit", [
    ({"max_position_embeddings": 1024}, ("max_position_embeddings", 1024)),
    ({"n_positions": 512}, ("n_positions", 512)),
    ({"max_seq_len": 4096, "seq_length": 300}, ("seq_length", 300)),  # the smallest wins, as in vLLM
    ({"hidden_size": 64}, None),
    ({"max_position_embeddings": True}, None),
])
def test_model_length_limit(model_config, limit):
    assert model_length_limit(model_config) == limit


def test_unset_lengths_are_capped_at_the_model_limit():
    cfg = resolve_model_limits(load_config(env={}), {"max_position_embeddings": 1024})
    assert (cfg.max_model_len, cfg.max_context_length) == (1024, 1024)
    cfg = resolve_model_limits(load_config(env={}), {"max_position_embeddings": 600})
    assert (cfg.max_model_len, cfg.max_context_length) == (600, 600)
    cfg = resolve_model_limits(load_config(env={}), {"max_position_embeddings": 8192})
    assert (cfg.max_model_len, cfg.max_context_length) == (2048, 1024)
    assert resolve_model_limits(cfg, {"max_position_embeddings": 8192}) == cfg
    unbounded = load_config(env={})
    assert resolve_model_limits(unbounded, {}) is unbounded


def test_explicit_lengths_are_kept_or_refused_with_the_fix(tmp_path):
    small = {"max_position_embeddings": 1024}
    cfg = resolve_model_limits(load_config(overrides={"max_model_len": 800}, env={}), small)
    assert (cfg.max_model_len, cfg.max_context_length) == (800, 800)
    cfg = resolve_model_limits(load_config(overrides={"max_context_length": 512}, env={}), small)
    assert (cfg.max_model_len, cfg.max_context_length) == (1024, 512)
    (tmp_path / "c.json").write_text(json.dumps({"max_model_len": 2048}))  # set in the file: explicit too
    for explicit in (load_config(tmp_path / "c.json", env={}), load_config(env={"NEURONMODEL_MAX_MODEL_LEN": "2048"})):
        with pytest.raises(ConfigError, match=r"^max_model_len 2048 exceeds the model's limit \(max_position_embeddings "
                                              r"1024 in its config.json\): set max_model_len \(--max-model-len, "
                                              r"NEURONMODEL_MAX_MODEL_LEN\) to 1024 or less, or leave it unset$"):
            resolve_model_limits(explicit, small)
    with pytest.raises(ConfigError, match=r"max_context_length 2000 exceeds the model's limit .* to 1024 or less"):
        resolve_model_limits(load_config(overrides={"max_context_length": 2000}, env={}), small)


def test_the_cli_fits_the_lengths_to_the_tiny_model():
    cfg = cli.with_model_limits(flags_config("--model", str(TINY)))
    assert (cfg.max_model_len, cfg.max_context_length) == (1024, 1024)
