"""The TNx runner (runners/neuron_tnx.py) on the contract fake of transformers-neuronx 0.13, on the committed tiny
Llama (tests/assets/tiny/target, its draft tests/assets/tiny/draft); expected tokens come from transformers."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime_tests.helpers.fake_neuron.install import install_tnx  # noqa: E402
from runtime_tests.helpers.fake_neuron.tiny import DRAFT, TARGET, hf_greedy  # noqa: E402
from neuronmodel_runtime.artifacts.folder import ARTIFACTS_MARKER as LOCAL_MARKER  # noqa: E402
from neuronmodel_runtime.config import RuntimeConfig  # noqa: E402
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch, RunnerError  # noqa: E402
from neuronmodel_runtime.runners.buckets import tnx_buckets  # noqa: E402
from neuronmodel_runtime.runners.neuron_tnx import TnxRunner, chain_token_tree, device_line  # noqa: E402
from neuronmodel_runtime.runners.tnx_config import neuron_config_kwargs  # noqa: E402
from neuronmodel_runtime.sampling.params import GREEDY, RowSampling  # noqa: E402
from runtime_tests.helpers.runner_helpers import generate  # noqa: E402

PROMPTS = [[412, 27, 1021, 9, 300, 77, 5], [88], [7, 1, 2048, 42, 42, 9, 30, 31, 5, 77, 64, 2, 3, 50, 600]]
K = 3


@pytest.fixture
def tnx(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "cache"))  # compiled artifacts stay in the test
    monkeypatch.delenv("NEURON_COMPILED_ARTIFACTS", raising=False)
    return install_tnx(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def hf():
    return transformers.AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def eagle_draft(tmp_path_factory) -> Path:
    """The tiny draft as an EAGLE draft: is_eagle in config.json and an fc projection over [embedding, hidden]."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("eagle-draft")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DRAFT / name, folder / name)
    config = json.loads((DRAFT / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "is_eagle": True}))
    tensors = load_file(str(DRAFT / "model.safetensors"))
    hidden = config["hidden_size"]
    generator = torch.Generator().manual_seed(0)
    tensors["model.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=generator) * 0.02
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def make(model: Path = TARGET, **overrides) -> TnxRunner:
    fields = dict(framework="tnx", model=str(model), max_num_seqs=4, max_model_len=64, max_context_length=32,
                  dtype="float32")
    runner = TnxRunner(RuntimeConfig(**{**fields, **overrides}), str(model))
    runner.load()
    return runner


def retyped(folder: Path, source: Path, model_type: str) -> Path:
    """`source`'s checkpoint (weights and tokenizer linked) with another model_type in its config.json."""
    folder.mkdir()
    for item in source.iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    return folder


def decode_one(runner, slots, tokens, positions, rows=None, spec=()):
    rows = rows or [GREEDY] * len(slots)
    return runner.decode(DecodeBatch(slots, tokens, positions, rows, num_spec_tokens=list(spec)))


# --- plain decoding -------------------------------------------------------------------------------------------------

def test_greedy_rows_equal_transformers_in_slots_out_of_order(tnx, hf):
    runner = make()
    got = generate(runner, [3, 0, 2], PROMPTS, steps=10)  # prefill together, then decode together
    assert got == [hf_greedy(hf, p, 10) for p in PROMPTS]


def test_a_prefill_between_decodes_leaves_every_row_exact(tnx, hf):
    """The engine's order: new prompts prefill, then the older rows decode without them. TNx token generation writes
    every line it is not given at position 0, so the runner must send the prefilled slots too."""
    runner = make()
    first = runner.prefill(PrefillBatch([1], [PROMPTS[0]], [GREEDY])).token_ids[0]
    rows = {1: first}
    for _ in range(2):
        rows[1] += decode_one(runner, [1], [rows[1][-1]], [len(PROMPTS[0]) + len(rows[1]) - 1]).token_ids[0]
    out = runner.prefill(PrefillBatch([0, 3], [PROMPTS[2], PROMPTS[1]], [GREEDY, GREEDY])).token_ids
    rows[0], rows[3] = out
    prompts = {1: PROMPTS[0], 0: PROMPTS[2], 3: PROMPTS[1]}
    rows[1] += decode_one(runner, [1], [rows[1][-1]], [len(prompts[1]) + len(rows[1]) - 1]).token_ids[0]
    for _ in range(6):
        slots = [3, 1, 0]
        out = decode_one(runner, slots, [rows[s][-1] for s in slots],
                         [len(prompts[s]) + len(rows[s]) - 1 for s in slots]).token_ids
        for s, t in zip(slots, out):
            rows[s] += t
    assert all(rows[s] == hf_greedy(hf, prompts[s], len(rows[s])) for s in rows)


def test_per_request_top_k_is_honoured_and_the_device_lists_change_only_when_a_slot_does(tnx, hf, monkeypatch):
    runner = make()
    calls = []
    update = runner.model.update_generation_config
    monkeypatch.setattr(runner.model, "update_generation_config", lambda g: (calls.append(g), update(g)))
    top2 = RowSampling(top_k=2, top_p=1.0, temperature=1.0, seed=None)
    prompt = PROMPTS[2]
    greedy_row, top2_row = generate(runner, [0, 1], [prompt, prompt], steps=12, rows=[GREEDY, top2])
    assert greedy_row == hf_greedy(hf, prompt, 12)
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt + top2_row])).logits[0, len(prompt) - 1: -1]
    best2 = logits.topk(2, dim=-1).indices.tolist()
    assert all(t in best for t, best in zip(top2_row, best2))
    assert len(calls) == 1  # slot 1 changed once, at its prefill
    assert calls[0].top_k == [1, 2, 1, 1] and calls[0].global_top_k == 256
    assert device_line(RowSampling(-1, 0.9, 0.7, None), 256) == (256, 0.9, 0.7)
    assert device_line(RowSampling(999, 1.0, 1.0, None), 256)[0] == 256


# --- speculation ----------------------------------------------------------------------------------------------------

def speculate(runner, prompts, slots, steps, split=False):
    """Greedy generation with fused steps; with split, the last row decodes plain in a call of its own each step
    (as the engine does near the end of a line), so each call leaves live slots out."""
    out = runner.prefill(PrefillBatch(slots, prompts, [GREEDY] * len(slots))).token_ids
    rows = [list(t) for t in out]
    widths = []
    while min(len(r) for r in rows) < steps:
        groups = [(slots[:-1], K), (slots[-1:], 0)] if split else [(slots, K)]
        for group, k in groups:
            index = [slots.index(s) for s in group]
            result = decode_one(runner, group, [rows[i][-1] for i in index],
                                [len(prompts[i]) + len(rows[i]) - 1 for i in index], spec=[k] * len(group))
            assert result.num_draft_tokens == [k] * len(group)
            for i, tokens in zip(index, result.token_ids):
                assert 1 <= len(tokens) <= k + 1
                rows[i] += tokens
                widths.append(len(tokens))
    return [r[:steps] for r in rows], widths


def test_fused_speculation_steps_emit_several_tokens_and_keep_greedy_output(tnx, hf):
    runner = make(speculation={"mode": "draft", "draft_model": str(DRAFT), "num_speculative_tokens": K})
    assert runner.capacity().speculation_length == K and runner.capabilities().fused_speculation == ("draft",)
    assert not runner.capabilities().per_row_speculation_length
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[1]]
    rows, widths = speculate(runner, prompts, [2, 0, 3], 14, split=True)
    assert rows == [hf_greedy(hf, p, 14) for p in prompts]
    assert max(widths) > 1
    assert runner.info()["speculator"] == "FusedSpeculativeDecoder"


def test_fused_speculation_samples_per_request(tnx, hf):
    """TNx's fused speculation verifies by rejection sampling with each line's on-device distribution: a top_k=2
    row only emits tokens among the target's top two; the runner declares it can sample while speculating."""
    runner = make(speculation={"mode": "draft", "draft_model": str(DRAFT), "num_speculative_tokens": K})
    assert runner.capabilities().sampling.sampled
    top2 = RowSampling(top_k=2, top_p=1.0, temperature=1.0, seed=None)
    prompt = PROMPTS[2]
    row = runner.prefill(PrefillBatch([1], [prompt], [top2])).token_ids[0]
    while len(row) < 12:
        row += decode_one(runner, [1], [row[-1]], [len(prompt) + len(row) - 1], rows=[top2], spec=[K]).token_ids[0]
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt + row])).logits[0, len(prompt) - 1: -1]
    best2 = logits.topk(2, dim=-1).indices.tolist()
    assert all(t in best for t, best in zip(row, best2))


def test_eagle_speculation_keeps_greedy_output_and_the_state_of_lines_not_in_a_call(tnx, hf, eagle_draft):
    runner = make(speculation={"mode": "eagle", "draft_model": str(eagle_draft), "num_speculative_tokens": K})
    assert runner.speculator.token_tree == chain_token_tree(K) and runner.speculator.depth == K + 1
    prompts = [PROMPTS[0], PROMPTS[1]]
    out = runner.prefill(PrefillBatch([1, 2], prompts, [GREEDY, GREEDY])).token_ids
    hidden = runner.speculator.hidden[2].clone()
    decode_one(runner, [1], [out[0][0]], [len(prompts[0])], spec=[K])
    assert torch.equal(runner.speculator.hidden[2], hidden)  # line 2 was not in the call
    rows, _ = speculate(make(speculation={"mode": "eagle", "draft_model": str(eagle_draft),
                                          "num_speculative_tokens": K}), prompts, [3, 0], 10, split=True)
    assert rows == [hf_greedy(hf, p, 10) for p in prompts]


def test_speculation_runs_to_the_end_of_a_line(tnx, hf):
    """The engine's rule for a runner compiled for one k: a row speculates while k positions are left in its line,
    then decodes plain; a fused step still writes k positions past the row, into the compiled tail."""
    runner = make(max_model_len=24, max_context_length=16, speculation={"mode": "draft", "draft_model": str(DRAFT),
                                                 "num_speculative_tokens": K})
    assert runner.n_positions == 24 + K
    prompt = PROMPTS[2]  # 15 tokens: 9 more fill the line
    row = runner.prefill(PrefillBatch([2], [prompt], [GREEDY])).token_ids[0]
    while len(prompt) + len(row) < 24:
        spec = K if 24 - (len(prompt) + len(row)) >= K else 0
        out = decode_one(runner, [2], [row[-1]], [len(prompt) + len(row) - 1], spec=[spec])
        row += out.token_ids[0][: 24 - len(prompt) - len(row)]
    assert row == hf_greedy(hf, prompt, 9)


def test_a_draft_of_the_wrong_kind_is_refused(tnx, eagle_draft):
    with pytest.raises(RunnerError, match="set speculation.mode to eagle"):
        make(speculation={"mode": "draft", "draft_model": str(eagle_draft), "num_speculative_tokens": K})
    with pytest.raises(RunnerError, match="set speculation.mode to draft"):
        make(speculation={"mode": "eagle", "draft_model": str(DRAFT), "num_speculative_tokens": K})
    with pytest.raises(RunnerError, match="sampling.on_device=true"):
        make(sampling={"on_device": False},
             speculation={"mode": "draft", "draft_model": str(DRAFT), "num_speculative_tokens": K})
    with pytest.raises(RunnerError, match="promptLookup"):
        make(speculation={"mode": "promptLookup"})
    with pytest.raises(RunnerError, match="compile_cache.sharded_weights .* use framework nxdi"):
        make(compile_cache={"sharded_weights": True})


# --- compiled artifacts ---------------------------------------------------------------------------------------------

def test_compiles_once_then_loads_the_saved_artifacts(tnx, hf, tmp_path, monkeypatch):
    first = make()
    assert first.info()["compiled_now"] is True and tnx.base.COMPILE_LOG == ["LlamaForSampling"]
    folder = Path(first.info()["artifacts"]["folder"])
    assert (folder / LOCAL_MARKER).is_file() and (folder / "target").is_dir()
    assert str(folder).startswith(str(tmp_path / "cache"))
    second = make()
    assert second.info()["compiled_now"] is False and second.info()["artifacts"]["source"] == "local"
    assert tnx.base.COMPILE_LOG == ["LlamaForSampling"] and tnx.base.LOAD_LOG == ["LlamaForSampling"]
    assert generate(second, [1], [PROMPTS[0]], steps=6) == [hf_greedy(hf, PROMPTS[0], 6)]
    make(compile_cache={"policy": "Always"})
    assert len(tnx.base.COMPILE_LOG) == 2

    monkeypatch.setenv("NEURON_COMPILED_ARTIFACTS", str(tmp_path / "neffs"))
    with pytest.raises(RunnerError, match="policy is Never"):
        make(compile_cache={"policy": "Never"})
    assert make().artifacts.folder == tmp_path / "neffs" and make().info()["compiled_now"] is False
    assert make(max_num_seqs=2).info()["compiled_now"] is True  # another shape's folder is recompiled, never served
    assert make().info()["compiled_now"] is True


# --- capabilities, capacity, errors ---------------------------------------------------------------------------------

def test_capabilities_refuse_seeds_and_logprobs_on_the_device_and_grant_them_on_the_host(tnx):
    device = make().capabilities().sampling
    assert (device.seeds, device.logprobs, device.penalties, device.top_p_rule, device.max_top_k) == \
        (False, False, False, "keep", 256)
    assert "on_device=false" in device.fixes["seeds"]
    runner = make(sampling={"on_device": False})
    host = runner.capabilities().sampling
    assert host.seeds and host.logprobs and host.penalties
    seeded = RowSampling(top_k=-1, top_p=0.9, temperature=1.3, seed=11)
    out = runner.prefill(PrefillBatch([0, 2], [PROMPTS[0], PROMPTS[0]], [seeded, seeded], [2, None]))
    assert out.token_ids[0] == out.token_ids[1] and len(out.logprobs[0][0].top) == 2 and out.logprobs[1] is None
    again = decode_one(runner, [0, 2], [out.token_ids[0][0]] * 2, [len(PROMPTS[0])] * 2, rows=[seeded, seeded])
    assert again.token_ids[0] == again.token_ids[1]


def test_capacity_is_the_compiled_shape(tnx):
    capacity = make(max_context_length=24).capacity()
    assert (capacity.max_num_seqs, capacity.max_context_length, capacity.max_model_len, capacity.vocab_size) == \
        (4, 24, 64, 4096)
    assert tnx_buckets(32) == [32] and tnx_buckets(1024) == [128, 256, 512, 1024]
    assert tnx_buckets(200) == [128, 200]


def test_unknown_model_type_lists_the_supported_ones(tnx, tmp_path):
    folder = tmp_path / "qwen"
    folder.mkdir()
    config = json.loads((TARGET / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    runner = TnxRunner(RuntimeConfig(framework="tnx", model=str(folder), max_model_len=64), str(folder))
    with pytest.raises(RunnerError) as error:
        runner.load()
    message = str(error.value)
    assert "'qwen2'" in message and "llama, mistral, mixtral" in message and "framework nxdi or torch" in message


@pytest.mark.parametrize("model_type, reason", [
    ("gptj", "cache_offset"), ("gpt_neox", "cache_offset"), ("bloom", "context_batch_sizes"),
    ("opt", "context_batch_sizes"), ("gpt2", "no continuous batching")])
def test_registry_model_types_the_runner_cannot_drive_are_refused_at_load(tnx, tmp_path, model_type, reason):
    """TNx's registry lists them, but their classes lack what the runner drives (save/load, forward by cache_ids and
    start_ids, continuous batching): refused up front, as target or as draft, naming the type, why and the fix."""
    folder = retyped(tmp_path / model_type, TARGET, model_type)
    with pytest.raises(RunnerError) as error:
        make(folder)
    message = str(error.value)
    assert f"model_type {model_type!r}" in message and reason in message and "framework nxdi or torch" in message
    draft = retyped(tmp_path / f"{model_type}-draft", DRAFT, model_type)
    with pytest.raises(RunnerError, match=f"speculation.draft_model: model_type {model_type!r}.*{reason}"):
        make(speculation={"mode": "draft", "draft_model": str(draft), "num_speculative_tokens": K})


def test_served_model_types_reach_the_library(tnx, tmp_path, hf):
    """code_llama is TNx's LlamaForSampling: served. mixtral is served too, but the fake backs no Mixtral math
    (`_unbacked`): all this test can show is that the runner goes on to from_pretrained instead of refusing it."""
    runner = make(retyped(tmp_path / "code-llama", TARGET, "code_llama"))
    assert runner.info()["model_class"] == "LlamaForSampling"
    assert generate(runner, [1], [PROMPTS[0]], steps=4) == [hf_greedy(hf, PROMPTS[0], 4)]
    with pytest.raises(NotImplementedError, match="does not back transformers_neuronx MixtralForSampling"):
        make(retyped(tmp_path / "mixtral", TARGET, "mixtral"))


def test_eagle_gets_int64_start_ids_the_models_and_the_fused_decoder_int32(tnx, eagle_draft, monkeypatch):
    """vLLM passes its input_block_ids as torch.long; TNx's EAGLE decoder indexes host tensors with start_ids as
    given (the fake refuses anything else), while the models and FusedSpeculativeDecoder take int32 as before."""
    seen: dict[str, list] = {"eagle": [], "fused": [], "model": []}

    def spy(cls, name):
        original = cls.speculative_iteration if name != "model" else cls._run

        def call(self, *args):
            seen[name].append(args[2].dtype)
            return original(self, *args)
        monkeypatch.setattr(cls, "speculative_iteration" if name != "model" else "_run", call)

    spy(tnx.eagle_speculation.EagleSpeculativeDecoder, "eagle")
    spy(tnx.fused_speculation.FusedSpeculativeDecoder, "fused")
    runner = make(speculation={"mode": "eagle", "draft_model": str(eagle_draft), "num_speculative_tokens": K})
    assert seen["eagle"] == [torch.int64] * 4  # every line context-encoded once at load
    first = runner.prefill(PrefillBatch([1], [PROMPTS[0]], [GREEDY])).token_ids[0]
    decode_one(runner, [1], first, [len(PROMPTS[0])], spec=[K])
    assert seen["eagle"] == [torch.int64] * 6
    fused = make(speculation={"mode": "draft", "draft_model": str(DRAFT), "num_speculative_tokens": K})
    first = fused.prefill(PrefillBatch([1], [PROMPTS[0]], [GREEDY])).token_ids[0]
    decode_one(fused, [1], first, [len(PROMPTS[0])], spec=[K])
    assert seen["fused"] == [torch.int32] * 2
    spy(tnx.base.NeuronModelBase, "model")
    plain = make()
    first = plain.prefill(PrefillBatch([1], [PROMPTS[0]], [GREEDY])).token_ids[0]
    decode_one(plain, [1], first, [len(PROMPTS[0])])
    assert seen["model"] == [torch.int32] * 2


# --- neuron_config_overrides and the device top-k -------------------------------------------------------------------

def test_neuron_config_overrides_reach_the_target_last_and_key_its_artifacts(tnx):
    overrides = {"fuse_qkv": False, "sequence_parallel_norm": True, "quant": {"quant_dtype": "s8",
                                                                              "dequant_dtype": "f32"}}
    config = RuntimeConfig(framework="tnx", max_num_seqs=4, neuron_config_overrides=overrides)
    kwargs = neuron_config_kwargs(config, 4096)
    assert kwargs["fuse_qkv"] is False and kwargs["quant"] == overrides["quant"]  # merged over the defaults
    assert "sequence_parallel_norm" not in neuron_config_kwargs(config, 4096, "draft")  # vLLM: the target's only
    plain, overridden = make(), make(neuron_config_overrides=overrides)
    received = overridden.model.neuron_config
    assert (received.fuse_qkv, received.sequence_parallel_norm) == (False, True)
    assert isinstance(received.quant, tnx.config.QuantizationConfig) and received.quant.dequant_dtype == "f32"
    assert plain.model.neuron_config.fuse_qkv is True
    assert overridden.artifacts.key.digest != plain.artifacts.key.digest
    assert overridden.artifacts.folder != plain.artifacts.folder and overridden.info()["compiled_now"] is True
    speculating = make(neuron_config_overrides={"sequence_parallel_norm": True},
                       speculation={"mode": "draft", "draft_model": str(DRAFT), "num_speculative_tokens": K})
    assert speculating.model.neuron_config.sequence_parallel_norm is True
    assert speculating.draft.neuron_config.sequence_parallel_norm is False


def test_neuron_config_overrides_refused_at_load_name_the_key_and_the_fix(tnx):
    with pytest.raises(RunnerError, match=r"neuron_config_overrides: on_device_sampling is not a NeuronConfig "
                                          r"keyword of transformers-neuronx 0\.13\.798"):
        make(neuron_config_overrides={"on_device_sampling": True})
    with pytest.raises(RunnerError, match="continuous_batching is set by max_num_seqs"):
        make(neuron_config_overrides={"continuous_batching": {"max_num_seqs": 4}})
    with pytest.raises(RunnerError, match="is_eagle_target is set by speculation.mode"):
        make(neuron_config_overrides={"is_eagle_target": True})
    with pytest.raises(RunnerError, match="on_device_generation is set by sampling.on_device"):
        make(neuron_config_overrides={"on_device_generation": {"top_k": 1}})
    with pytest.raises(RunnerError, match="neuron_config_overrides: sparse_attn: .*quant, kv_cache_quant"):
        make(neuron_config_overrides={"sparse_attn": {"window_size": 8}})
    with pytest.raises(RunnerError, match="neuron_config_overrides: transformers-neuronx 0.13.798 refuses .*"
                                          "cast_logits_dtype"):
        make(neuron_config_overrides={"cast_logits_dtype": "int8"})
    with pytest.raises(RunnerError, match="neuron_config_overrides: quant: .*int4"):
        make(neuron_config_overrides={"quant": {"quant_dtype": "int4"}})


def test_the_device_top_k_is_capped_when_sampling_on_the_device(tnx):
    with pytest.raises(RunnerError, match="sampling.global_top_k 300"):
        make(sampling={"on_device": True, "global_top_k": 300})
    assert make(sampling={"on_device": False, "global_top_k": 300}).capabilities().sampling.max_top_k == 300


def test_load_logs_the_deprecation(tnx, caplog):
    with caplog.at_level(logging.WARNING, logger="neuronmodel_runtime.runners.neuron_tnx"):
        runner = make()
    assert any("end of support on 2025-09-16" in r.getMessage() and "nxdi" in r.getMessage()
               for r in caplog.records)
    info = runner.info()
    assert (info["tnx"], info["written_against"], info["model_class"]) == ("0.13.798", True, "LlamaForSampling")


# --- multi-node ------------------------------------------------------------------------------------------------------

GROUP = {"tensor_parallel_degree": 4, "nodes": 2}


def host_env(monkeypatch, rank, local="2", **extra):
    """What distributed/topology.backend_env sets on host `rank` of TP 4 over two hosts."""
    env = {"NEURON_RANK_ID": str(rank), "NEURON_LOCAL_TP": local, "NEURON_RT_ROOT_COMM_ID": "10.0.0.1:63423", **extra}
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("speculation", [{}, {"mode": "draft", "draft_model": str(DRAFT), "num_speculative_tokens": K}],
                         ids=["plain", "draft"])
def test_each_host_of_a_group_holds_only_its_ranks_of_one_compile(tnx, hf, monkeypatch, speculation):
    """TP 4 over two hosts: every host builds tp_degree 4 and holds ranks NEURON_RANK_ID * 2 .. + 1; the second
    loads the NEFFs the first saved; each serves the checkpoint's greedy tokens (the fake computes the whole model
    on every host)."""
    hosts = []
    for rank in (0, 1):
        host_env(monkeypatch, rank)
        hosts.append(make(parallelism=GROUP, speculation=speculation or {"mode": "none"}))
    assert [h.model.loaded_ranks for h in hosts] == [[0, 1], [2, 3]]
    assert hosts[1].info()["tp_degree"] == 4 and [h.info()["compiled_now"] for h in hosts] == [True, False]
    assert generate(hosts[1], [0], [PROMPTS[0]], steps=6) == [hf_greedy(hf, PROMPTS[0], 6)]


@pytest.mark.parametrize("env, error", [
    ({"NEURON_LOCAL_TP": ""}, "NEURON_LOCAL_TP=None but .* is 2 per host"),
    ({"NEURON_LOCAL_TP": "4"}, "NEURON_LOCAL_TP=4 but"),
    ({"NEURON_RANK_ID": "2"}, "NEURON_RANK_ID=2 is not a host of the group of 2"),
    ({"NEURON_RT_ROOT_COMM_ID": ""}, "NEURON_RT_ROOT_COMM_ID is not set"),
    ({"NEURON_PP_STAGES": "2"}, "NEURON_PP_STAGES=2: transformers-neuronx's pipeline parallelism"),
    ({"NEURONMODEL_INSTANCE_FAMILY": "inf2"}, "multi-node on trn1 .* only; use framework nxdi"),
])
def test_rank_variables_that_do_not_fit_the_group_are_refused_naming_them(tnx, monkeypatch, env, error):
    host_env(monkeypatch, 1, **{"NEURONMODEL_INSTANCE_FAMILY": "trn1"})
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RunnerError, match=error):
        make(parallelism=GROUP)


def test_a_stray_local_tp_on_one_node_is_refused(tnx, monkeypatch):
    monkeypatch.setenv("NEURON_LOCAL_TP", "1")
    with pytest.raises(RunnerError, match="NEURON_LOCAL_TP=1 with parallelism.nodes 1"):
        make(parallelism={"tensor_parallel_degree": 2})
    monkeypatch.setenv("NEURON_LOCAL_TP", "2")
    assert make(parallelism={"tensor_parallel_degree": 2}).model.loaded_ranks == [0, 1]
