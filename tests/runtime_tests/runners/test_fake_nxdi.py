"""The fake NxDI (tests/runtime_tests/helpers/fake_neuron) against the rules of the real releases it mirrors: it must refuse
what the real refuses, differ between releases where the real ones differ, and compute the tokens and logits of the
checkpoint (transformers' greedy generation, the reference LlamaModel's logits) on the committed tiny Llama."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import logging

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime_tests.helpers.fake_neuron.install import install_nxdi  # noqa: E402
from runtime_tests.helpers.fake_neuron.tiny import DRAFT, TARGET  # noqa: E402

V03, V06, V08, V09, V10 = "0.3.5591", "0.6.10598", "0.8.16251", "0.9.17334", "0.10.17970"
PROMPTS = [[48, 911, 7, 301, 95, 18], [3, 2048, 77, 560, 19, 4000, 5, 61, 640]]
GREEDY = [1.0, 1.0, 1.0]


@pytest.fixture
def nxdi(monkeypatch, tmp_path):
    """Factory: version -> the installed fake package."""
    return lambda version: install_nxdi(monkeypatch, version, tmp_path)


def mod(name: str):
    return importlib.import_module(f"neuronx_distributed_inference.{name}")


def build(tmp_path, *, draft=False, eagle_draft=True, compile_=True, **kwargs):
    """A compiled and loaded NeuronLlamaForCausalLM on the tiny target (continuous batching, 2 slots)."""
    cfg_mod, llama = mod("models.config"), mod("models.llama.modeling_llama")
    load_pretrained_config = mod("utils.hf_adapter").load_pretrained_config
    args = dict(tp_degree=1, batch_size=2, ctx_batch_size=1, seq_len=64, max_context_length=32,
                is_continuous_batching=True, torch_dtype="float32",
                on_device_sampling_config=dict(dynamic=True, global_topk=64))
    args.update(kwargs)
    config = llama.LlamaInferenceConfig(cfg_mod.NeuronConfig(**args), load_config=load_pretrained_config(str(TARGET)))
    if draft:
        import copy

        draft_nc = copy.deepcopy(config.neuron_config)
        draft_nc.enable_fused_speculation = False
        if draft_nc.enable_eagle_speculation:  # the recipe of inference_demo / the docs / vLLM's loader
            draft_nc.is_eagle_draft = eagle_draft
        else:
            draft_nc.speculation_length = 0
        draft_config = llama.LlamaInferenceConfig(draft_nc, load_config=load_pretrained_config(str(DRAFT)))
        config.fused_spec_config = cfg_mod.FusedSpecNeuronConfig(
            llama.NeuronLlamaForCausalLM._model_cls, draft_config=draft_config, draft_model_path=str(DRAFT))
    model = llama.NeuronLlamaForCausalLM(str(TARGET), config)
    if compile_:
        out = tmp_path / "compiled"
        model.compile(str(out))
        model = llama.NeuronLlamaForCausalLM(str(out))  # reload from the compiled folder, as a serving pod does
        model.load(str(out))
    return model


def sp(rows):
    return torch.tensor([GREEDY] * rows)


def prefill(model, prompt, slot):
    return model(input_ids=torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None],
                 seq_ids=torch.tensor([slot]), sampling_params=sp(1))


def decode(model, tokens, positions, slots):
    return model(input_ids=torch.tensor(tokens)[:, None], position_ids=torch.tensor(positions)[:, None],
                 seq_ids=torch.tensor(slots), sampling_params=sp(len(tokens)))


@pytest.fixture(scope="module")
def hf_greedy():
    """transformers' greedy continuation (12 tokens) of each prompt on the tiny target."""
    model = transformers.AutoModelForCausalLM.from_pretrained(TARGET).eval()
    out = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)
            out[tuple(prompt)] = ids[0, len(prompt):].tolist()
    return out


# ---- packaging and release differences -----------------------------------------------------------------------


@pytest.mark.parametrize("version", [V03, V06, V08, V09, V10])
def test_version_and_metadata(nxdi, version):
    package = nxdi(version)
    assert importlib.metadata.version("neuronx-distributed-inference") == version
    assert package.__version__ == ".".join(version.split(".")[:2]) + ".0"
    assert importlib.util.find_spec("transformers_neuronx") is None  # only this fake is exposed


def test_uninstalled_after_the_test():
    with pytest.raises(ImportError):
        importlib.import_module("neuronx_distributed_inference")


@pytest.mark.parametrize("version,added", [
    (V03, set()), ("0.5.9230", {"llama4", "qwen2", "qwen3"}), (V06, {"llama4", "qwen2", "qwen3", "qwen3_moe"}),
    (V08, {"llama4", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "pixtral", "qwen2_vl", "qwen3_vl"}),
    (V09, {"llama4", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "pixtral", "qwen2_vl", "qwen3_vl", "gemma3",
           "mistral"})])
def test_model_types_per_release(nxdi, version, added):
    nxdi(version)
    assert set(mod("utils.constants").MODEL_TYPES) == {"llama", "mllama", "mixtral", "dbrx"} | added


def test_modules_and_signatures_per_release(nxdi):
    nxdi(V03)
    with pytest.raises(ModuleNotFoundError):
        mod("models.qwen2.modeling_qwen2")
    assert not hasattr(mod("models.config"), "ChunkedPrefillConfig")
    assert not hasattr(mod("modules.generation.sampling"), "infer_sampling_params")
    base = mod("models.application_base").NeuronApplicationBase
    assert "disable_fail_fast" not in inspect.signature(base.compile).parameters
    forward = inspect.signature(mod("models.model_base").NeuronBaseForCausalLM.forward).parameters
    assert list(forward)[:5] == ["self", "input_ids", "seq_ids", "attention_mask", "position_ids"]
    assert "tf_args" not in forward and "tensor_capture_hook" not in forward
    with pytest.raises(TypeError):
        mod("models.config").FusedSpecNeuronConfig(None, draft_model_cls=None)
    nxdi(V09)
    assert mod("models.qwen2.modeling_qwen2").NeuronQwen2ForCausalLM.get_config_cls().__name__ == \
        "Qwen2InferenceConfig"
    assert mod("models.config").ChunkedPrefillConfig().kernel_kv_tile_size == 1024
    assert "disable_fail_fast" in inspect.signature(mod("models.application_base").NeuronApplicationBase.compile
                                                    ).parameters
    assert {"tf_args", "tensor_capture_hook"} <= set(inspect.signature(
        mod("models.model_base").NeuronBaseForCausalLM.forward).parameters)
    assert mod("models.config").FusedSpecNeuronConfig(None, draft_model_cls=None).draft_model_cls is None


def test_neuron_config_defaults_and_derived(nxdi, monkeypatch):
    nxdi(V09)
    config = mod("models.config")
    nc = config.NeuronConfig(batch_size=4, torch_dtype="bfloat16", on_device_sampling_config={"dynamic": True},
                             enable_eagle_speculation=True)
    assert (nc.ctx_batch_size, nc.tkg_batch_size, nc.max_batch_size, nc.seq_len, nc.max_context_length) == \
        (4, 4, 4, 128, 128)
    assert nc.torch_dtype is torch.bfloat16 and nc.overrides_torch_dtype
    assert nc.enable_fused_speculation and nc.skip_warmup is False and nc.save_sharded_checkpoint is False
    ods = nc.on_device_sampling_config
    assert (ods.do_sample, ods.top_k, ods.dynamic, ods.deterministic, ods.global_topk) == (False, 1, True, False, 256)
    assert config.NeuronConfig().torch_dtype is torch.bfloat16
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with pytest.warns(UserWarning, match="does not match"):
        assert config.NeuronConfig(logical_nc_config=1).logical_nc_config == 2  # the environment wins
    with pytest.raises(AssertionError, match="max_context_length cannot be more than max_length"):
        config.NeuronConfig(seq_len=64, max_context_length=128)
    nxdi(V03)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    nc = mod("models.config").NeuronConfig(seq_len=64, max_context_length=128)  # 0.3 has no such assert
    assert nc.skip_warmup is True and nc.logical_nc_config == 2  # 0.3: skip_warmup defaults on trn2


def test_unknown_kwarg_only_warns_and_has_no_effect(nxdi, caplog):
    nxdi(V06)
    NeuronConfig = mod("models.config").NeuronConfig
    with caplog.at_level(logging.WARNING):
        nc = NeuronConfig(batch_size=2, is_eagle3=True, definitely_not_a_field=1)  # is_eagle3 is 0.7's
    assert "Unexpected keyword arguments: {'is_eagle3': True, 'definitely_not_a_field': 1}" in caplog.text
    assert not hasattr(nc, "is_eagle3") and not hasattr(nc, "definitely_not_a_field")
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # up to 0.6 skip_warmup is popped after the check: a warning, but set
        assert NeuronConfig(skip_warmup=True).skip_warmup is True
    assert "Unexpected keyword arguments: {'skip_warmup': True}" in caplog.text
    nxdi(V09)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert mod("models.config").NeuronConfig(skip_warmup=True, is_eagle3=True).is_eagle3 is True
    assert "Unexpected" not in caplog.text


# ---- sampling ------------------------------------------------------------------------------------------------


def test_sampling_validation_up_to_05(nxdi):
    nxdi(V03)
    s, ods = mod("modules.generation.sampling"), mod("models.config").OnDeviceSamplingConfig(global_topk=64)
    s.validate_sampling_params(torch.tensor([[-1, 0.5, 0.7], [64, 1.0, 1.0]]), ods)
    for bad in ([0, 1.0, 1.0], [1, 1.0, 0.0], [65, 1.0, 1.0], [1.5, 1.0, 1.0], [1, 0.0, 1.0], [1, 1.1, 1.0]):
        with pytest.raises(ValueError):
            s.validate_sampling_params(torch.tensor([bad]), ods)


def test_sampling_validation_and_in_place_rewrite_from_06(nxdi, tmp_path, caplog):
    nxdi(V09)
    s, ods = mod("modules.generation.sampling"), mod("models.config").OnDeviceSamplingConfig(global_topk=64)
    with caplog.at_level(logging.WARNING):
        s.validate_sampling_params(torch.tensor([[0, 1.0, 1.0], [-1, 1.0, 1.0], [5, 1.0, 0.0]]), ods)
    assert "uniform distribution" in caplog.text
    for bad in ([0, 1.0, 0.0], [-1, 1.0, 0.0], [65, 1.0, 1.0], [1, 1.0, -0.5]):
        with pytest.raises(ValueError):
            s.validate_sampling_params(torch.tensor([bad]), ods)
    model = build(tmp_path)
    params = torch.tensor([[7, 0.5, 0.0]])
    prompt = PROMPTS[0]
    out = model(input_ids=torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None],
                seq_ids=torch.tensor([0]), sampling_params=params)
    assert params.tolist() == [[1.0, 1.0, 0.0]]  # rewritten in the caller's tensor
    assert out.tokens.tolist() == prefill(model, prompt, 1).tokens.tolist()  # temperature 0 is greedy


def test_greedy_config_ignores_per_request_parameters(nxdi, tmp_path):
    nxdi(V09)
    model = build(tmp_path, on_device_sampling_config=dict(global_topk=64))  # neither do_sample nor dynamic
    prompt = PROMPTS[1]
    hot = model(input_ids=torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None],
                seq_ids=torch.tensor([0]), sampling_params=torch.tensor([[64, 1.0, 50.0]]))
    assert hot.tokens.tolist() == prefill(model, prompt, 1).tokens.tolist()


def test_top_p_drops_the_candidate_that_crosses_it(nxdi):
    nxdi(V09)
    s, config = mod("modules.generation.sampling"), mod("models.config")
    sampler = s.Sampler(config.NeuronConfig(on_device_sampling_config=dict(dynamic=True, global_topk=3)))
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(200, 1)
    drawn = sampler(logits, torch.tensor([[3, 0.6, 1.0]] * 200))  # cumsum 0.5, 0.8: HF would keep 2 tokens
    assert set(drawn.tolist()) == {0}
    drawn = sampler(logits, torch.tensor([[3, 0.85, 1.0]] * 200))
    assert set(drawn.tolist()) == {0, 1}
    drawn = sampler(logits, torch.tensor([[2, 1.0, 1.0]] * 200))  # top_k 2
    assert set(drawn.tolist()) == {0, 1}


# ---- routing, batching and the KV cache ----------------------------------------------------------------------


def test_prefill_iff_min_position_is_zero(nxdi, tmp_path, monkeypatch):
    nxdi(V09)
    model = build(tmp_path)
    tags = []
    run = model._run_graph
    monkeypatch.setattr(model, "_run_graph", lambda tag, *a: tags.append(tag) or run(tag, *a))
    first = prefill(model, PROMPTS[0], 0).tokens
    decode(model, [int(first[0])], [len(PROMPTS[0])], [0])
    decode(model, [int(first[0]), 5], [len(PROMPTS[0]) + 1, 0], [0, 1])  # one row at 0: all go to prefill
    assert tags == ["context_encoding_model", "token_generation_model", "context_encoding_model",
                    "context_encoding_model"]
    with pytest.raises(RuntimeError, match="one token per row"):  # a continuation chunk is not a prefill
        model(input_ids=torch.tensor([[5, 6, 7]]), position_ids=torch.tensor([[3, 4, 5]]),
              seq_ids=torch.tensor([0]), sampling_params=sp(1))


def test_full_unsorted_batch_reads_the_wrong_kv_lines_and_partial_batch_is_fixed(nxdi, tmp_path):
    nxdi(V09)
    sorted_model, unsorted_model = build(tmp_path / "a"), build(tmp_path / "b")
    firsts = {}
    for model in (sorted_model, unsorted_model):
        for slot, prompt in enumerate(PROMPTS):
            firsts[slot] = int(prefill(model, prompt, slot).tokens[0])
    positions = [len(p) for p in PROMPTS]
    right = decode(sorted_model, [firsts[0], firsts[1]], positions, [0, 1]).tokens.tolist()
    wrong = decode(unsorted_model, [firsts[1], firsts[0]], positions[::-1], [1, 0]).tokens.tolist()
    assert wrong[::-1] != right  # row 0 (slot 1's request) attended and overwrote KV line 0
    partial = build(tmp_path / "c")
    for slot, prompt in enumerate(PROMPTS):
        prefill(partial, prompt, slot)
    assert decode(partial, [firsts[1]], [positions[1]], [1]).tokens.tolist() == [right[1]]  # padded and sorted


def test_partial_batch_writes_row_zero_into_absent_lines_unless_masked(nxdi, tmp_path):
    """_forward_with_pad repeats row 0 into the absent rows: line 1 gets slot 0's token at slot 0's position."""
    results = []
    for version, masked in ((V09, False), (V09, True), (V09, None)):
        nxdi(version)
        model = build(tmp_path / f"{masked}", on_device_sampling_config=None, apply_seq_ids_mask=bool(masked))
        short, long_ = PROMPTS[0][:3], PROMPTS[1]
        prefill(model, short, 0)
        prefill(model, long_, 1)
        if masked is not None:
            decode(model, [9], [len(short)], [0])  # slot 0 alone, at position 3 < len(long_)
        results.append(decode(model, [11], [len(long_)], [1]).logits)
    assert not torch.allclose(results[0], results[2])  # line 1 position 3 was overwritten
    assert torch.allclose(results[1], results[2], atol=1e-6)


def test_prompt_longer_than_the_context_bucket(nxdi, tmp_path):
    nxdi(V03)
    model = build(tmp_path, max_context_length=8)
    with pytest.raises(ValueError, match=r"Input len 9 exceeds largest bucket \(8\) for context_encoding_model"):
        prefill(model, PROMPTS[1], 0)
    truncating = build(tmp_path / "t", max_context_length=8, allow_input_truncation=True)
    with pytest.warns(UserWarning, match="Truncating input"):
        assert prefill(truncating, PROMPTS[1], 0).tokens.tolist() == prefill(truncating, PROMPTS[1][:8], 1
                                                                               ).tokens.tolist()


def test_a_one_token_prompt_reads_nxdi_s_own_padding(nxdi, tmp_path):
    """The context graph pads position_ids with 1 and reads the first maximal position: for [0] that is the pad."""
    nxdi(V09)
    model = build(tmp_path, on_device_sampling_config=None)
    llama = reference()
    alone = prefill(model, [48], 0).logits[0, 0]
    assert torch.allclose(alone, llama.last_logits(torch.tensor([[48, 0]]), [0], [0])[0], atol=1e-4)
    padded = model(input_ids=torch.tensor([[48] + [0] * 31]), position_ids=torch.zeros(1, 32, dtype=torch.long),
                   seq_ids=torch.tensor([1]), sampling_params=sp(1)).logits[0, 0]
    assert torch.allclose(padded, llama.last_logits(torch.tensor([[48]]), [0], [0])[0], atol=1e-4)


def test_bad_inputs_are_refused(nxdi, tmp_path):
    nxdi(V09)
    model = build(tmp_path)
    ids, pos = torch.tensor([PROMPTS[0]]), torch.arange(len(PROMPTS[0]))[None]
    with pytest.raises(TypeError, match="input_ids"):
        model(input_ids=ids.float(), position_ids=pos, seq_ids=torch.tensor([0]), sampling_params=sp(1))
    with pytest.raises(TypeError, match="position_ids"):
        model(input_ids=ids, position_ids=pos.float(), seq_ids=torch.tensor([0]), sampling_params=sp(1))
    with pytest.raises(TypeError, match="sampling_params"):
        model(input_ids=ids, position_ids=pos, seq_ids=torch.tensor([0]), sampling_params=sp(1).double())
    with pytest.raises(TypeError):
        model(input_ids=ids, position_ids=pos, not_a_parameter=1)
    assert model(ids, torch.tensor([0]), None, pos, None, None, sp(1)).tokens.dtype == torch.int32  # positional


# ---- lifecycle -----------------------------------------------------------------------------------------------


def test_load_before_compile_and_trace_time_failures(nxdi, tmp_path):
    nxdi(V09)
    model_base = mod("models.model_base")
    model = build(tmp_path, compile_=False)
    with pytest.raises(ValueError, match="model.pt does not exist"):
        model.load(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError):
        mod("models.llama.modeling_llama").NeuronLlamaForCausalLM(str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError, match="before load"):
        prefill(model, PROMPTS[0], 0)
    model.compile(str(tmp_path / "dry"), dry_run=True)
    assert (tmp_path / "dry/neuron_config.json").exists() and not (tmp_path / "dry/model.pt").exists()
    assert model_base.COMPILES == 0
    with pytest.raises(AssertionError, match="only supports single seq_id"):
        build(tmp_path / "cb", ctx_batch_size=2)
    with pytest.raises(AssertionError):
        build(tmp_path / "ods", draft=True, enable_fused_speculation=True, speculation_length=4,
              on_device_sampling_config=None)
    with pytest.raises(IndexError):
        build(tmp_path / "sample", draft=True, enable_fused_speculation=True, speculation_length=4,
              on_device_sampling_config=dict(do_sample=True, global_topk=64))
    with pytest.raises(AssertionError, match="EAGLE3 and token tree"):
        build(tmp_path / "eagle3", draft=True, enable_eagle_speculation=True, is_eagle3=True, speculation_length=4,
              token_tree_config={0: [1]})
    with pytest.raises(ValueError, match="is_eagle_draft"):
        build(tmp_path / "eagle", draft=True, eagle_draft=False, enable_eagle_speculation=True, speculation_length=4)
    with pytest.raises(AttributeError, match="draft_config"):
        build(tmp_path / "nodraft", enable_fused_speculation=True, speculation_length=4)
    build(tmp_path / "ok")
    assert model_base.COMPILES == 1


def test_unbacked_model_types_construct_but_do_not_load(nxdi, tmp_path):
    nxdi(V09)
    mixtral = mod("utils.constants").MODEL_TYPES["mixtral"]["causal-lm"]
    config = build(tmp_path, compile_=False).config
    model = mixtral(str(TARGET), config)
    model.compile(str(tmp_path / "m"))
    with pytest.raises(NotImplementedError, match="Llama-family"):
        model.load(str(tmp_path / "m"))


# ---- the math ------------------------------------------------------------------------------------------------


def reference():
    from neuronmodel_runtime.runners.checkpoint import build_weights, read_config, read_tensors
    from neuronmodel_runtime.runners.llama import LlamaModel

    config = read_config(TARGET, 64)
    return LlamaModel(config, build_weights(config, read_tensors(TARGET), torch.device("cpu"), torch.float32), 2, 64)


@pytest.mark.parametrize("version", [V03, V09])
def test_without_on_device_sampling_logits_match_the_reference(nxdi, tmp_path, version):
    nxdi(version)
    model = build(tmp_path, on_device_sampling_config=None)
    llama = reference()
    out = prefill(model, PROMPTS[1], 1)
    assert out.logits.shape == (1, 1, 4096) and out.logits.dtype == torch.float32
    want = llama.last_logits(torch.tensor([PROMPTS[1]]), [1], [0])
    assert torch.allclose(out.logits[:, 0], want, atol=1e-5)
    nxt = int(want.argmax())
    step = decode(model, [nxt], [len(PROMPTS[1])], [1]).logits
    assert torch.allclose(step[:, 0], llama.last_logits(torch.tensor([[nxt]]), [1], [len(PROMPTS[1])]), atol=1e-5)


@pytest.mark.parametrize("version", [V03, V06, V09])
def test_greedy_tokens_equal_transformers_generate(nxdi, tmp_path, hf_greedy, version):
    nxdi(version)
    model = build(tmp_path)
    width = max(len(p) for p in PROMPTS)  # one call, right padded with token 0 at position 0: rows one by one
    first = model(input_ids=torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS]),
                  position_ids=torch.tensor([list(range(len(p))) + [0] * (width - len(p)) for p in PROMPTS]),
                  seq_ids=torch.tensor([0, 1]), sampling_params=sp(2)).tokens
    assert first.shape == (2,) and first.dtype == torch.int32
    outs, tokens = {slot: [int(first[slot])] for slot in (0, 1)}, []
    for step in range(11):
        tokens = decode(model, [outs[0][-1], outs[1][-1]], [len(PROMPTS[0]) + step, len(PROMPTS[1]) + step],
                        [0, 1]).tokens
        for slot in (0, 1):
            outs[slot].append(int(tokens[slot]))
    for slot, prompt in enumerate(PROMPTS):
        assert outs[slot] == hf_greedy[tuple(prompt)]


@pytest.mark.parametrize("version,pad,eagle", [(V06, 0, False), (V09, -1, False), (V09, -1, True)])
def test_fused_speculation_steps(nxdi, tmp_path, hf_greedy, version, pad, eagle):
    nxdi(version)
    k = 4
    model = build(tmp_path, draft=True, enable_fused_speculation=True, speculation_length=k,
                  enable_eagle_speculation=eagle)
    prompt = PROMPTS[1]
    first = prefill(model, prompt, 0).fused_outputs
    assert [tuple(t.shape) for t in first] == [(1, k), (1, 1), (1, 64), (1, 1)]
    assert first[0][0, 1:].tolist() == [pad] * (k - 1) and int(first[3][0, 0]) == len(prompt)
    emitted, token, pos, counts = [int(first[0][0, 0])], int(first[1][0, 0]), len(prompt), []
    while len(emitted) < 12:
        accepted, next_ids, _, next_pos = decode(model, [token], [pos], [0]).fused_outputs
        n = int(next_pos[0, 0]) - pos  # the accepted count: never read it from the padding
        assert 1 <= n <= k and accepted[0, n:].tolist() == [pad] * (k - n)
        emitted += accepted[0, :n].tolist()
        counts.append(n)
        if pad not in accepted[0, :n].tolist():  # next_input_ids counts non-pad tokens (wrong for token 0 < 0.8)
            assert int(next_ids[0, 0]) == int(accepted[0, n - 1])
        token, pos = int(accepted[0, n - 1]), pos + n
    assert emitted[:12] == hf_greedy[tuple(prompt)]  # greedy verification: the target's own greedy tokens
    assert min(counts) < k and max(counts) > 1  # both a rejection and an acceptance happened


def test_qwen2_math_and_a_class_that_does_not_fit_the_checkpoint(nxdi, tmp_path, tiny_checkpoint):
    nxdi("0.5.9230")
    folder = tiny_checkpoint("qwen2")
    qwen2 = mod("utils.constants").MODEL_TYPES["qwen2"]["causal-lm"]
    load_pretrained_config = mod("utils.hf_adapter").load_pretrained_config
    nc = qwen2.get_neuron_config_cls()(batch_size=1, seq_len=32, torch_dtype="float32")
    model = qwen2(str(folder), qwen2.get_config_cls()(nc, load_config=load_pretrained_config(str(folder))))
    model.compile(str(tmp_path / "q"))
    model.load(str(tmp_path / "q"))
    prompt = [5, 17, 33, 2, 60]
    ours = model(input_ids=torch.tensor([prompt]), position_ids=torch.arange(5)[None]).logits[0, 0]
    with torch.inference_mode():
        want = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()(torch.tensor([prompt])).logits[0, -1]
    assert torch.allclose(ours, want, atol=1e-4)
    llama = mod("models.llama.modeling_llama")
    wrong = llama.NeuronLlamaForCausalLM(str(folder), llama.LlamaInferenceConfig(
        mod("models.config").NeuronConfig(seq_len=32), load_config=load_pretrained_config(str(folder))))
    wrong.compile(str(tmp_path / "w"))
    with pytest.raises(NotImplementedError, match="Qwen2ForCausalLM checkpoint"):
        wrong.load(str(tmp_path / "w"))


# ---- rules of the second pass: checkpoint paths, image-to-text configs, the fused class swap -----------------------


@pytest.mark.parametrize("version", [V03, V06, V09])
def test_load_shards_from_the_path_recorded_at_compile(nxdi, tmp_path, version):
    """compile writes the checkpoint's path (_name_or_path) into neuron_config.json; load shards the weights from
    it: up to 0.6 a missing path is taken for a Hub id, from 0.7 it falls back to the compiled folder (no weights).
    Another model at that path is loaded without complaint."""
    import json
    import shutil

    nxdi(version)
    moved = tmp_path / "host" / "target"
    shutil.copytree(TARGET, moved)
    cfg_mod, llama = mod("models.config"), mod("models.llama.modeling_llama")
    load_pretrained_config = mod("utils.hf_adapter").load_pretrained_config
    nc = cfg_mod.NeuronConfig(batch_size=1, seq_len=32, torch_dtype="float32")
    config = llama.LlamaInferenceConfig(nc, load_config=load_pretrained_config(str(moved)))
    out = tmp_path / "compiled"
    llama.NeuronLlamaForCausalLM(str(moved), config).compile(str(out))
    assert json.loads((out / "neuron_config.json").read_text())["_name_or_path"] == str(moved)
    shutil.rmtree(moved)
    missing = OSError if version != V09 else FileNotFoundError
    with pytest.raises(missing, match="Hugging Face Hub model id" if version != V09 else "no checkpoint"):
        llama.NeuronLlamaForCausalLM(str(out)).load(str(out))
    shutil.copytree(DRAFT, moved)  # another model where the compile host's was
    model = llama.NeuronLlamaForCausalLM(str(out))
    model.load(str(out))
    prompt = PROMPTS[0]
    logits = model(input_ids=torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None]).logits[0, 0]
    with torch.inference_mode():
        draft = transformers.AutoModelForCausalLM.from_pretrained(DRAFT).eval()(torch.tensor([prompt])).logits[0, -1]
    assert torch.allclose(logits, draft, atol=1e-4)  # the draft's logits: the path's model, not the compiled one
    model = llama.NeuronLlamaForCausalLM(str(out))
    model.config._name_or_path = str(TARGET)  # rebound before load: the target again
    model.load(str(out))


@pytest.mark.parametrize("model_type", ["llama4", "pixtral", "qwen2_vl", "qwen3_vl"])
def test_image_to_text_classes_reject_a_text_only_config(nxdi, model_type):
    nxdi(V08)
    cls = mod("utils.constants").MODEL_TYPES[model_type]["causal-lm"]
    load_pretrained_config = mod("utils.hf_adapter").load_pretrained_config
    nc = cls.get_neuron_config_cls()(batch_size=1, seq_len=32)
    with pytest.raises(TypeError, match="vision_neuron_config"):
        cls.get_config_cls()(nc, load_config=load_pretrained_config(str(TARGET)))
    with pytest.raises(AssertionError, match="vision_config"):  # a text-only checkpoint has no vision config
        cls.get_config_cls()(nc, nc, load_config=load_pretrained_config(str(TARGET)))


def test_mllama_needs_a_vision_config(nxdi):
    nxdi(V08)
    cls = mod("utils.constants").MODEL_TYPES["mllama"]["causal-lm"]
    nc = cls.get_neuron_config_cls()(batch_size=1, seq_len=32)
    with pytest.raises(AssertionError, match="Config must define .*text_config"):
        cls.get_config_cls()(nc, load_config=mod("utils.hf_adapter").load_pretrained_config(str(TARGET)))


@pytest.mark.parametrize("version,swapped", [(V03, True), (V06, True), (V09, False)])
def test_a_fused_instance_swaps_the_class_decoder_up_to_0_6(nxdi, tmp_path, version, swapped):
    """Up to 0.6 a fused-speculation instance sets NeuronFusedSpecModel on its class: a later FusedSpecNeuronConfig
    built from the class's _model_cls, and a later plain instance, then fail at compile; from 0.7 the swap is the
    instance's own."""
    nxdi(version)
    llama, model_base = mod("models.llama.modeling_llama"), mod("models.model_base")
    own = llama.NeuronLlamaForCausalLM._model_cls
    build(tmp_path / "first", draft=True, enable_fused_speculation=True, speculation_length=4)
    assert (llama.NeuronLlamaForCausalLM._model_cls is model_base.NeuronFusedSpecModel) is swapped
    if not swapped:
        build(tmp_path / "second", draft=True, enable_fused_speculation=True, speculation_length=4)
        build(tmp_path / "plain")
        return
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'draft_config'"):
        build(tmp_path / "second", draft=True, enable_fused_speculation=True, speculation_length=4)
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'draft_config'"):
        build(tmp_path / "plain")
    llama.NeuronLlamaForCausalLM._model_cls = own  # what the runner's decoder_class does before each instance
    build(tmp_path / "again", draft=True, enable_fused_speculation=True, speculation_length=4)


# ---- ranks of a multi-node group (examples/multi_node.md, application_base.py load_weights) -----------------------


def compiled_for_two_hosts(tmp_path, **kwargs):
    """A folder compiled for TP 4 over two hosts (local_ranks_size 2, at start_rank_id 0), and a fresh instance of
    it that a host would load."""
    build(tmp_path, compile_=False, tp_degree=4, local_ranks_size=2, **kwargs).compile(str(tmp_path / "compiled"))
    return lambda: mod("models.llama.modeling_llama").NeuronLlamaForCausalLM(str(tmp_path / "compiled"))


@pytest.mark.parametrize("version", [V03, V09])
def test_a_host_loads_the_ranks_it_names_to_load_and_to_its_neuron_config(nxdi, tmp_path, version):
    nxdi(version)
    fresh = compiled_for_two_hosts(tmp_path)
    for host in (0, 1):
        model = fresh()
        model.neuron_config.start_rank_id = 2 * host  # sharding on load shards the NeuronConfig's ranks
        model.load(str(tmp_path / "compiled"), start_rank_id=2 * host, local_ranks_size=2)
        assert model.loaded_ranks == [2 * host, 2 * host + 1]
        assert prefill(model, PROMPTS[0], 0).tokens.shape == (1,)


def test_a_rank_shard_mismatch_or_the_whole_model_is_refused_as_the_real_fails(nxdi, tmp_path):
    nxdi(V09)
    fresh = compiled_for_two_hosts(tmp_path)
    folder = str(tmp_path / "compiled")
    with pytest.raises(RuntimeError, match="sharding on load shards ranks 0..1 .* initializes ranks 2..3"):
        fresh().load(folder, start_rank_id=2, local_ranks_size=2)  # the folder's NeuronConfig still says rank 0
    with pytest.raises(RuntimeError, match="SPMD models of 2 local ranks .* cannot be initialized with 4"):
        fresh().load(folder, start_rank_id=0, local_ranks_size=4)  # the whole model on one host of the group
    for start in (1, 4):
        model = fresh()
        model.neuron_config.start_rank_id = start
        with pytest.raises(ValueError, match=f"start_rank_id {start} must be a multiple of local_ranks_size 2"):
            model.load(folder, start_rank_id=start, local_ranks_size=2)


def test_the_compile_writes_the_pre_sharded_weights_of_its_own_ranks_only(nxdi, tmp_path):
    nxdi(V09)
    fresh = compiled_for_two_hosts(tmp_path, save_sharded_checkpoint=True)
    weights = sorted(p.name for p in (tmp_path / "compiled" / "weights").iterdir())
    assert weights == ["tp0_sharded_checkpoint.safetensors", "tp1_sharded_checkpoint.safetensors"]
    with pytest.raises(FileNotFoundError, match="tp2_sharded_checkpoint"):
        fresh().load(str(tmp_path / "compiled"), start_rank_id=2, local_ranks_size=2)
    fresh().load(str(tmp_path / "compiled"), start_rank_id=0, local_ranks_size=2)


def test_every_forward_is_recorded_as_given(nxdi, tmp_path):
    nxdi(V09)
    model = build(tmp_path)
    prefill(model, PROMPTS[0], 1)
    decode(model, [5, 6], [6, 3], [0, 1])
    assert model.step_inputs == [
        {"input_ids": [PROMPTS[0]], "position_ids": [list(range(6))], "seq_ids": [1], "sampling_params": [GREEDY]},
        {"input_ids": [[5], [6]], "position_ids": [[6], [3]], "seq_ids": [0, 1], "sampling_params": [GREEDY] * 2},
    ]
