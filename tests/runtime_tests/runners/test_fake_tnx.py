"""The contract fake of transformers-neuronx 0.13 (fake_neuron/transformers_neuronx) against the rules of the real
source (aws-neuron/transformers-neuronx at 1ade6d7) and against transformers: each rejection the real library makes,
the rules a caller can get wrong silently (which KV lines token generation writes, which line's sampling a row
uses), and real tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime_tests.helpers.fake_neuron.install import install_tnx  # noqa: E402
from runtime_tests.helpers.fake_neuron.tiny import DRAFT, TARGET, hf_greedy  # noqa: E402

PROMPT = [412, 27, 1021, 9, 300, 77, 5]
B = 2


@pytest.fixture
def tnx(monkeypatch, tmp_path):
    return install_tnx(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def hf():
    return transformers.AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def eagle_draft(tmp_path_factory) -> Path:
    """The tiny draft as an EAGLE draft: is_eagle in config.json and an fc projection over [embedding, hidden]."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("eagle-draft")
    config = json.loads((DRAFT / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "is_eagle": True}))
    tensors = load_file(str(DRAFT / "model.safetensors"))
    hidden = config["hidden_size"]
    tensors["model.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=torch.Generator().manual_seed(0)) * 0.02
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def generation(tnx, lines=None, **extra):
    lines = lines or [(1, 1.0, 1.0)] * B
    return tnx.config.GenerationConfig(dynamic=True, per_batch_line=True, do_sample=True, global_top_k=64,
                                       top_k=[k for k, _, _ in lines], top_p=[p for _, p, _ in lines],
                                       temperature=[t for _, _, t in lines], **extra)


def neuron_config(tnx, on_device=True, **extra):
    return tnx.config.NeuronConfig(
        continuous_batching=tnx.config.ContinuousBatchingConfig(batch_size_for_shared_caches=B),
        on_device_generation=generation(tnx) if on_device else None, **extra)


def model(tnx, path=TARGET, compile=True, **kwargs):
    args = dict(batch_size=B, tp_degree=1, amp="f32", n_positions=[64], context_length_estimate=[16, 32])
    args.update(kwargs)
    args.setdefault("neuron_config", neuron_config(tnx))
    m = tnx.modeling_auto.NEURON_MODEL_FOR_CAUSAL_LM_MAPPING["llama"].from_pretrained(str(path), **args)
    if compile:
        m.to_neuron()
    return m


def ids(*rows):
    return torch.tensor(rows, dtype=torch.int32)


def context(m, prompt, slot):
    return m(ids(prompt), cache_ids=ids(list(range(len(prompt)))), start_ids=ids(slot))


# --- configuration rules ------------------------------------------------------------------------------------------

def test_quantization_configs_refuse_what_they_do_not_implement(tnx):
    with pytest.raises(NotImplementedError, match="int4 is not implemented"):
        tnx.config.QuantizationConfig(quant_dtype="int4")
    with pytest.raises(NotImplementedError, match="vector_dynamic is not implemented"):
        tnx.config.KVCacheQuantizationConfig(quantize_method="vector_dynamic")
    assert tnx.config.KVCacheQuantizationConfig(quant_dtype="f8e4m3fn").dequant_dtype == "bf16"


def test_neuron_config_rejects_unknown_keywords(tnx):
    with pytest.raises(AssertionError, match="Unexpected NeuronConfig keyword arguments"):
        tnx.config.NeuronConfig(on_device_sampling=True)
    with pytest.raises(AssertionError, match="unexpected key word arguments"):
        tnx.config.ContinuousBatchingConfig(batch_size_for_shared_caches=2, block_size=16)
    with pytest.raises(KeyError):
        tnx.config.ContinuousBatchingConfig(max_model_len=64)  # neither max_num_seqs nor its alias


def test_continuous_batching_forces_right_padding(tnx):
    nc = neuron_config(tnx, padding_side="left")
    assert nc.padding_side == "right" and nc.use_2d_cache_ids
    assert not tnx.config.NeuronConfig().use_2d_cache_ids


def test_from_pretrained_checks_the_shared_cache_batch_and_the_buckets(tnx):
    with pytest.raises(AssertionError, match="invalid batch_size_for_shared_caches"):
        model(tnx, compile=False, batch_size=3)
    with pytest.raises(AssertionError, match="cannot be more than max n_positions"):
        model(tnx, compile=False, n_positions=[16], context_length_estimate=[32])


def test_generation_lists_must_have_the_batch_size_and_need_a_dynamic_compiled_model(tnx):
    m = model(tnx, compile=False)
    with pytest.raises(AttributeError):
        m.update_generation_config(generation(tnx))  # before to_neuron: no device tensors yet
    m.to_neuron()
    with pytest.raises(AssertionError, match="same size as bach_size"):
        m.update_generation_config(generation(tnx, lines=[(1, 1.0, 1.0)] * 3))
    with pytest.raises(AssertionError, match="per_batch_line"):
        m.update_generation_config(tnx.config.GenerationConfig(dynamic=True, global_top_k=64))
    with pytest.raises(AssertionError, match="global_top_k is set"):
        model(tnx, neuron_config=tnx.config.NeuronConfig(
            continuous_batching=tnx.config.ContinuousBatchingConfig(max_num_seqs=B),
            on_device_generation=tnx.config.GenerationConfig(per_batch_line=True, global_top_k=64)))


# --- compiled artifacts ---------------------------------------------------------------------------------------------

def test_save_needs_a_compiled_model_and_load_only_records_the_folder(tnx, tmp_path):
    fresh = model(tnx, compile=False)
    with pytest.raises(AttributeError, match="get_kernels"):
        fresh.save(str(tmp_path / "early"))
    fresh.to_neuron()
    fresh.save(str(tmp_path / "neffs"))
    compiles = len(tnx.base.COMPILE_LOG)

    again = model(tnx, compile=False)
    again.load(str(tmp_path / "neffs"))
    assert again.decoder_lm_head.program is None  # load() read nothing yet
    again.to_neuron()
    assert len(tnx.base.COMPILE_LOG) == compiles and tnx.base.LOAD_LOG == ["LlamaForSampling"]
    assert context(again, PROMPT, 0).tolist() == context(fresh, PROMPT, 0).tolist()

    other = model(tnx, compile=False, n_positions=[128])  # another graph: its NEFFs are not in the folder
    other.load(str(tmp_path / "neffs"))
    with pytest.raises(FileNotFoundError, match="matching NEFF"):
        other.to_neuron()
    missing = model(tnx, compile=False)
    missing.load(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="Did not find directory"):
        missing.to_neuron()


# --- forward rules --------------------------------------------------------------------------------------------------

def test_greedy_tokens_equal_transformers(tnx, hf):
    m = model(tnx)
    token = int(context(m, PROMPT, 1)[0, 0])
    got = [token]
    for position in range(len(PROMPT), len(PROMPT) + 9):
        token = int(m(ids([token]), cache_ids=ids([position]), start_ids=ids(1))[0, 0])
        got.append(token)
    assert got == hf_greedy(hf, PROMPT, 10)


def test_token_generation_writes_token_zero_at_position_zero_of_lines_not_in_the_call(tnx):
    """base.py scatters the rows onto the full batch with zeros elsewhere; every line's KV is written."""
    m = model(tnx, neuron_config=neuron_config(tnx, on_device=False))
    first = context(m, PROMPT, 1)[0].argmax().item()
    clean = m(ids([first]), cache_ids=ids([len(PROMPT)]), start_ids=ids(1))  # logits [1, V]
    context(m, PROMPT, 1)  # the same prompt again
    m(ids([5]), cache_ids=ids([3]), start_ids=ids(0))  # token generation of line 0 only
    hit = m(ids([first]), cache_ids=ids([len(PROMPT)]), start_ids=ids(1))
    assert not torch.allclose(clean, hit, atol=1e-3)  # line 1 lost its position 0
    context(m, PROMPT, 1)
    full = m(ids([5], [first]), cache_ids=ids([3], [len(PROMPT)]), start_ids=ids(0, 1))  # both lines sent
    assert torch.allclose(clean[0], full[1], atol=1e-5)


def test_context_encoding_needs_two_tokens_and_position_zero_and_fits_a_bucket(tnx):
    m = model(tnx)
    with pytest.raises(AssertionError, match="invalid input prompt length"):
        context(m, list(range(3, 3 + 33)), 0)  # past the largest context bucket (32)
    with pytest.raises(AssertionError, match="speculative forward"):
        m(ids([5, 6]), cache_ids=ids([4, 5]), start_ids=ids(0))  # several tokens at an offset
    with pytest.raises(TypeError, match="integer"):
        m(ids([5, 6]), cache_ids=torch.tensor([[0.0, 1.0]]), start_ids=ids(0))
    # padded to two tokens with cache id 0, a one-token prompt is context-encoded; the output is read at
    # max(cache_ids), the prompt's only token
    lm = model(tnx, neuron_config=neuron_config(tnx, on_device=False))
    one = lm(ids([412, 0]), cache_ids=ids([0, 0]), start_ids=ids(0))
    at_zero = lm(ids([412, 9, 3]), cache_ids=ids([0, 0, 0]), start_ids=ids(0))
    at_one = lm(ids([412, 9]), cache_ids=ids([0, 1]), start_ids=ids(1))
    assert one.shape == (1, 4096) and one.dtype == torch.float32
    assert torch.allclose(one, at_zero, atol=1e-5) and not torch.allclose(one, at_one, atol=1e-3)


def test_on_device_sampling_reads_each_rows_kv_line_parameters(tnx, hf):
    """Line 1 made to sample hot: a row sent for KV line 1 samples hot whatever its row index; line 0 stays greedy."""
    m = model(tnx)
    m.update_generation_config(generation(tnx, lines=[(1, 1.0, 1.0), (64, 1.0, 50.0)]))
    tnx.layers.generation.GENERATOR.manual_seed(3)
    greedy = hf_greedy(hf, PROMPT, 10)
    hot = [int(context(m, PROMPT, 1)[0, 0]) for _ in range(4)]  # row 0 of each call, line 1
    cold = int(context(m, PROMPT, 0)[0, 0])
    assert cold == greedy[0] and hot != [greedy[0]] * 4
    rows = [[cold], [hot[-1]]]
    for position in range(len(PROMPT), len(PROMPT) + 9):
        out = m(ids([rows[0][-1]], [rows[1][-1]]), cache_ids=ids([position], [position]), start_ids=ids(0, 1))
        rows[0].append(int(out[0, 0]))
        rows[1].append(int(out[1, 0]))
    assert rows[0] == greedy and rows[1] != greedy


def test_top_p_keeps_the_candidate_that_crosses_it(tnx):
    config = tnx.config.GenerationConfig(dynamic=True, per_batch_line=True, global_top_k=4, top_k=[4],
                                         top_p=[0.6], temperature=[1.0])
    device = tnx.layers.generation.DeviceGeneration(config, 1, 4)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs, token_ids = device.candidates(logits, [0])[0]
    kept = token_ids[probs > 1e-6].tolist()
    assert kept == [0, 1]  # 0.5 < 0.6, and 0.8 crosses it: kept too


# --- fused speculation ----------------------------------------------------------------------------------------------

def speculative_config(tnx, **extra):
    return neuron_config(tnx, on_device_embedding=True, **extra)


def test_fused_speculation_asserts_what_the_real_one_does(tnx, tiny_checkpoint):
    target = model(tnx, neuron_config=speculative_config(tnx))
    FSD = tnx.fused_speculation.FusedSpeculativeDecoder
    with pytest.raises(AssertionError, match="draft model must enable on-device embedding"):
        FSD(model(tnx, DRAFT), target, k=3)
    with pytest.raises(AssertionError, match="on-device sampling"):
        FSD(model(tnx, DRAFT, neuron_config=neuron_config(tnx, on_device=False, on_device_embedding=True)), target)
    with pytest.raises(AssertionError, match="same tp degree"):
        FSD(model(tnx, DRAFT, tp_degree=2, neuron_config=speculative_config(tnx)), target, k=3)
    with pytest.raises(AssertionError, match="same vocab size"):
        FSD(model(tnx, tiny_checkpoint("llama"), neuron_config=speculative_config(tnx)), target, k=3)
    with pytest.raises(AssertionError, match="token tree"):
        tnx.eagle_speculation.EagleSpeculativeDecoder(model(tnx, DRAFT, neuron_config=speculative_config(tnx)),
                                                      target)
    assert tnx.util.token_tree.validate_token_tree({0: [1], 1: [2], 2: [3]}) == (4, 4)  # k = nodes, with the root


def test_fused_speculation_output_format_and_greedy_tokens(tnx, hf):
    k = 3
    target = model(tnx, neuron_config=speculative_config(tnx))
    draft = model(tnx, DRAFT, neuron_config=speculative_config(tnx))
    fsd = tnx.fused_speculation.FusedSpeculativeDecoder(draft, target, k=k, pad_token_id=-1)
    with pytest.raises(AttributeError):
        fsd.speculative_iteration(ids(PROMPT), ids(list(range(len(PROMPT)))), ids(0))
    fsd.to_neuron()
    assert tnx.base.COMPILE_LOG[-1] == "FusedSpeculativeDecoder"
    first, counts = fsd.speculative_iteration(ids(PROMPT), ids(list(range(len(PROMPT)))), ids(1))
    assert first.shape == (1, 1) and counts.tolist() == [[1]]  # context encoding: one token
    got, position, widths = [int(first[0, 0])], len(PROMPT), set()
    while len(got) < 12:
        tokens, counts = fsd.speculative_iteration(ids([got[-1]]), ids([position]), ids(1))
        n = int(counts[0, 0])
        assert tokens.shape == (1, k + 1) and 1 <= n <= k + 1
        assert tokens[0, n:].tolist() == [-1] * (k + 1 - n)  # pad past the count
        got += tokens[0, :n].tolist()
        position += n
        widths.add(n)
    assert got[:12] == hf_greedy(hf, PROMPT, 12)
    assert max(widths) > 1


def test_post_processing_overwrites_every_pad_valued_token(tnx):
    """fused_speculation.py replaces tokens equal to pad_token_id by tokens[0, 0] before it pads: a generated token 0
    is lost when pad_token_id is 0."""
    target = model(tnx, neuron_config=speculative_config(tnx))
    fsd = tnx.fused_speculation.FusedSpeculativeDecoder(model(tnx, DRAFT, neuron_config=speculative_config(tnx)),
                                                        target, k=2)
    tokens, counts = fsd.speculative_iteration_post_process(ids([7, 0, 9], [5, 6, 0]), ids([3], [2]))
    assert tokens.tolist() == [[7, 7, 9], [5, 6, 0]]


def test_fused_speculation_samples_the_targets_distribution(tnx, hf):
    """The first token of a fused step, over many steps from one state, follows the target's filtered distribution
    (top_k 8, temperature 1.3, under transformers) although the draft proposes from its own."""
    target = model(tnx, neuron_config=speculative_config(tnx))
    draft = model(tnx, DRAFT, neuron_config=speculative_config(tnx))
    fsd = tnx.fused_speculation.FusedSpeculativeDecoder(draft, target, k=2, pad_token_id=-1)
    fsd.to_neuron()
    fsd.update_generation_config(generation(tnx, lines=[(8, 1.0, 1.3)] * B))
    tnx.layers.generation.GENERATOR.manual_seed(0)
    first, _ = fsd.speculative_iteration(ids(PROMPT), ids(list(range(len(PROMPT)))), ids(0))
    token, draws = int(first[0, 0]), 300
    counts = torch.zeros(4096)
    for _ in range(draws):  # every step rewrites the positions it wrote before reading them: independent draws
        tokens, _ = fsd.speculative_iteration(ids([token]), ids([len(PROMPT)]), ids(0))
        counts[int(tokens[0, 0])] += 1
    with torch.inference_mode():
        logits = hf(torch.tensor([PROMPT + [token]])).logits[0, -1] / 1.3
    values, top = logits.topk(8)
    expected = torch.zeros(4096)
    expected[top] = torch.softmax(values, dim=-1)
    assert counts[top].sum() == draws  # nothing outside the target's top 8
    assert 0.5 * (counts / draws - expected).abs().sum() < 0.12  # total variation


def test_eagle_takes_int64_start_ids_only(tnx, eagle_draft):
    """eagle_speculation.py indexes host tensors with start_ids as given (`pad`), beside the graph's int64 seq ids
    (torch.arange); torch before 2.0 refuses int32 indices and vLLM passes torch.long: the fake refuses any other
    dtype, at context encoding and at a step, before anything runs, and never converts."""
    target = model(tnx, neuron_config=speculative_config(tnx, is_eagle_target=True))
    draft = model(tnx, eagle_draft, neuron_config=speculative_config(tnx, is_eagle_draft=True,
                                                                     has_pre_attention_norm=False))
    esd = tnx.eagle_speculation.EagleSpeculativeDecoder(draft, target, pad_token_id=-1, token_tree={0: [1], 1: [2]})
    esd.to_neuron()
    prompt, cache = ids(PROMPT), ids(list(range(len(PROMPT))))
    with pytest.raises(TypeError, match="start_ids must be an int64 .*got torch.int32"):
        esd.speculative_iteration(prompt, cache, ids(1))  # context encoding
    assert esd.hidden == {}
    first, _ = esd.speculative_iteration(prompt, cache, torch.tensor([1]))
    hidden = esd.hidden[1].clone()
    with pytest.raises(TypeError, match="got torch.int32"):
        esd.speculative_iteration(first, ids([len(PROMPT)]), ids(1))  # a step
    assert torch.equal(esd.hidden[1], hidden)
    tokens, counts = esd.speculative_iteration(first, ids([len(PROMPT)]), torch.tensor([1]))
    assert tokens.shape == (1, 3) and 1 <= int(counts[0, 0]) <= 3


# --- ranks of a multi-node group (config.py NEURON_RANK_ID / NEURON_LOCAL_TP, parallel.py, compiler.py) ----------------

def on_host(monkeypatch, rank, local):
    """NeuronConfig reads the variables when it is built: set them first."""
    monkeypatch.setenv("NEURON_RANK_ID", str(rank))
    if local is None:
        monkeypatch.delenv("NEURON_LOCAL_TP", raising=False)
    else:
        monkeypatch.setenv("NEURON_LOCAL_TP", str(local))


def test_a_host_holds_its_ranks_and_loads_the_neffs_another_host_saved(tnx, monkeypatch, tmp_path):
    on_host(monkeypatch, 0, 2)
    leader = model(tnx, tp_degree=4)
    leader.save(str(tmp_path / "neffs"))
    on_host(monkeypatch, 1, 2)
    worker = model(tnx, tp_degree=4, compile=False)
    worker.load(str(tmp_path / "neffs"))
    worker.to_neuron()  # the NEFFs have no rank in them
    assert (leader.loaded_ranks, worker.loaded_ranks) == ([0, 1], [2, 3])


@pytest.mark.parametrize("rank, local", [(1, None), (2, 2), (0, 3)], ids=["whole-model", "past-group", "uneven"])
def test_ranks_outside_the_group_or_an_uneven_local_tp_are_refused(tnx, monkeypatch, rank, local):
    on_host(monkeypatch, rank, local)
    with pytest.raises(RuntimeError, match=f"NEURON_RANK_ID={rank} with NEURON_LOCAL_TP={local}"):
        model(tnx, tp_degree=4)


def test_every_forward_is_recorded_as_given(tnx):
    m = model(tnx)
    m(ids(PROMPT), cache_ids=ids(list(range(len(PROMPT)))), start_ids=ids(1))
    m(ids([5], [6]), cache_ids=ids([7], [3]), start_ids=ids(1, 0))
    assert m.step_inputs == [
        {"input_ids": [PROMPT], "cache_ids": [list(range(len(PROMPT)))], "start_ids": [1]},
        {"input_ids": [[5], [6]], "cache_ids": [[7], [3]], "start_ids": [1, 0]},
    ]
