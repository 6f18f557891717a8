"""One engine-level suite, run against every runner: the reference runner and the NxDI (three release generations)
and TNx runners over their contract fakes. Each runner is built the production way (`cli.build_engine`: framework
selection, the runner registry, the model's limits), on the committed tiny Llama (tests/assets/tiny/target, its draft
tests/assets/tiny/draft); the expected tokens come from transformers, never from the code under test.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
import pytest
import torch

from neuronmodel_runtime.config import load_config
from neuronmodel_runtime.sampling.params import SamplingParams

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "tiny"
TARGET, DRAFT = ASSETS / "target", ASSETS / "draft"
PROMPTS = ["The quick brown fox", "Once upon a time there", "In a hole in the ground", "1 2 3 4 5"]
STEPS = 12

#: runner id -> (framework, fake installer or None)
RUNNERS = ["torch", "nxdi-0.3.5591", "nxdi-0.6.10598", "nxdi-0.9.17334", "tnx-0.13.798"]


def _install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runner: str) -> str:
    """Put the runner's library (a contract fake of that release) on the path; returns the framework name."""
    framework, _, version = runner.partition("-")
    if framework == "nxdi":
        from runtime_tests.helpers.fake_neuron.install import install_nxdi

        install_nxdi(monkeypatch, version, tmp_path / "site")
    elif framework == "tnx":
        from runtime_tests.helpers.fake_neuron.install import install_tnx

        install_tnx(monkeypatch, tmp_path / "site", version)
    return framework


@pytest.fixture(params=RUNNERS)
def build(request, monkeypatch, tmp_path) -> Callable[..., Any]:
    """Factory: RuntimeConfig overrides -> a loaded AsyncEngine of this runner (its `.engine` steps synchronously)."""
    from neuronmodel_runtime.cli import build_engine

    monkeypatch.setenv("NEURONMODEL_CACHE", str(tmp_path / "cache"))  # compiled artifacts stay in the test
    monkeypatch.delenv("NEURON_COMPILED_ARTIFACTS", raising=False)
    framework = _install(monkeypatch, tmp_path, request.param)

    def make(**overrides: Any) -> Any:
        fields = {"model": str(TARGET), "framework": framework, "max_num_seqs": 4, "max_model_len": 64,
                  "max_context_length": 32, "dtype": "float32", **overrides}
        return build_engine(load_config(None, fields, env={}))

    make.runner = request.param  # type: ignore[attr-defined]
    return make


@pytest.fixture(scope="module")
def reference() -> Any:
    """transformers' model and tokenizer of the tiny target: the independent reference."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(str(TARGET))


def hf_greedy(reference: Any, prompt_ids: list[int], steps: int = STEPS) -> list[int]:
    model, _ = reference
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=steps, do_sample=False, min_new_tokens=steps)
    return out[0, len(prompt_ids):].tolist()


def run(engine: Any, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    """Submit every prompt at once and step the engine until all finish; token ids per prompt."""
    out: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, (ids, p) in enumerate(zip(prompts, params)):
        engine.add(engine.make_request(str(i), ids, p))

    def collect(outputs: list) -> None:
        for o in outputs:
            out[o.request_id] += list(o.token_ids)

    while engine.has_work:
        engine.step(collect)
    return [out[str(i)] for i in range(len(prompts))]


def greedy(steps: int = STEPS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)


def encode(reference: Any, text: str) -> list[int]:
    return reference[1].encode(text)


def test_greedy_generation_equals_transformers(build, reference):
    engine = build().engine
    prompt = encode(reference, PROMPTS[0])
    assert run(engine, [prompt], [greedy()]) == [hf_greedy(reference, prompt)]


def test_a_one_token_prompt_is_answered_from_its_token(build, reference):
    engine = build().engine
    prompt = encode(reference, "The")[:1]
    assert run(engine, [prompt], [greedy()]) == [hf_greedy(reference, prompt)]


def test_batched_rows_each_equal_their_own_greedy_generation(build, reference):
    """Four prompts of different lengths in one batch, in slots taken and freed out of order."""
    engine = build().engine
    prompts = [encode(reference, p) for p in PROMPTS]
    run(engine, [prompts[1]], [greedy(3)])  # slot 0 is used and released first
    got = run(engine, prompts, [greedy(STEPS - i) for i in range(4)])
    assert got == [hf_greedy(reference, p, STEPS - i) for i, p in enumerate(prompts)]


def test_decoding_some_slots_leaves_the_other_slots_sequences_intact(build, reference):
    """The runner contract: a decode names the slots it advances; a sequence resting in another slot (the engine
    splits a step's rows when only some speculate) must come out as if it had never paused."""
    from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch
    from neuronmodel_runtime.sampling.params import GREEDY

    runner = build().engine.runner
    short, long = encode(reference, PROMPTS[3])[:3], encode(reference, PROMPTS[2])
    first = runner.prefill(PrefillBatch([0, 2], [short, long], [GREEDY, GREEDY])).token_ids
    last, position = first[0][0], len(short)
    for _ in range(len(long)):  # slot 0 alone, through positions the resting slot 2 holds
        last = runner.decode(DecodeBatch([0], [last], [position], [GREEDY])).token_ids[0][0]
        position += 1
    runner.prefill(PrefillBatch([1], [short[:1]], [GREEDY]))  # a one-token prompt into another slot
    resumed, position = [first[1][0]], len(long)
    for _ in range(5):
        resumed.append(runner.decode(DecodeBatch([2], [resumed[-1]], [position], [GREEDY])).token_ids[0][0])
        position += 1
    assert resumed == hf_greedy(reference, long, 6)


def test_per_request_sampling_is_honoured_row_by_row(build, reference):
    """In one batch: a top_k=1 row at a high temperature is greedy; a top_k=2 row only ever emits one of the two most
    likely tokens (under transformers); a temperature-2 row with the full vocabulary leaves the greedy path; rows
    without a top-k limit draw from the global top-k by their temperature (a near-zero one follows greedy)."""
    engine = build().engine
    prompt = encode(reference, PROMPTS[2])
    rows = [SamplingParams(temperature=1.7, top_k=1, max_tokens=STEPS, ignore_eos=True),
            SamplingParams(temperature=1.0, top_k=2, max_tokens=STEPS, ignore_eos=True),
            SamplingParams(temperature=2.0, top_k=-1, max_tokens=STEPS, ignore_eos=True),
            SamplingParams(temperature=0.7, top_k=-1, max_tokens=STEPS, ignore_eos=True),
            SamplingParams(temperature=0.02, top_k=-1, max_tokens=STEPS, ignore_eos=True)]
    # "1 2 3 4 5" has a top-2 logit gap >= 0.57 at each of its greedy steps: at temperature 0.02 (gap / T > 28) a
    # sampled row follows the greedy path, unless its temperature or top-k were not applied as sent.
    counting = encode(reference, PROMPTS[3])
    top1, top2, hot, cool, cold = run(engine, [prompt] * 4 + [counting], rows)
    assert top1 == hf_greedy(reference, prompt)
    assert all(t in best for t, best in zip(top2, hf_top(reference, prompt, top2, 2))), top2
    assert hot != top1  # 12 tokens at temperature 2 over 4096 tokens: equal to greedy only if sampling was ignored
    # No per-request limit still means the global top-k (256 of 4096 tokens), never a uniform draw over the vocabulary
    assert all(t in best for t, best in zip(cool, hf_top(reference, prompt, cool, 256))), cool
    assert cold == hf_greedy(reference, counting)


def hf_top(reference: Any, prompt: list[int], generated: list[int], k: int) -> list[list[int]]:
    """Per generated position, transformers' k most likely tokens there."""
    model, _ = reference
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1: -1]  # [T, V]
    return logits.topk(k, dim=-1).indices.tolist()


def test_each_rows_sampling_follows_it_whatever_the_slot_order(build, reference):
    """Rows arrive in slots 2, 0: the greedy row (slot 0) stays greedy next to a hot row, in prefill and decode."""
    from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch

    runner = build().engine.runner
    hot = SamplingParams(temperature=2.0).validate(runner.capabilities().sampling, max_model_len=64).row()
    cold = SamplingParams(temperature=0.0).validate(runner.capabilities().sampling, max_model_len=64).row()
    prompt = encode(reference, PROMPTS[1])
    out = runner.prefill(PrefillBatch([2, 0], [prompt, prompt], [hot, cold])).token_ids
    greedy_row, position = [out[1][0]], len(prompt)
    last = [out[0][0], out[1][0]]
    for _ in range(STEPS - 1):
        out = runner.decode(DecodeBatch([2, 0], last, [position, position], [hot, cold])).token_ids
        last = [out[0][0], out[1][0]]
        greedy_row.append(out[1][0])
        position += 1
    assert greedy_row == hf_greedy(reference, prompt)


def test_speculation_emits_several_tokens_per_step_and_keeps_greedy_output(build, reference):
    spec = {"speculation": {"mode": "draft", "draft_model": str(DRAFT), "num_speculative_tokens": 3}}
    engine = build(**spec).engine
    prompts = [encode(reference, p) for p in PROMPTS[:2]]
    steps = 0
    for i, p in enumerate(prompts):
        engine.add(engine.make_request(str(i), p, greedy(16)))
    out: dict[str, list[int]] = {"0": [], "1": []}
    while engine.has_work:
        engine.step(lambda outs: [out[o.request_id].extend(o.token_ids) for o in outs])
        steps += 1
    assert [out["0"], out["1"]] == [hf_greedy(reference, p, 16) for p in prompts]
    assert engine.stats.spec_accepted_tokens_total > 0
    assert steps < 16  # a prefill step plus fewer decode steps than tokens: some steps emitted several tokens


@asynccontextmanager
async def serving(engine: Any) -> AsyncIterator[Callable[[dict], Awaitable[httpx.Response]]]:
    """The real app around `engine`, lifespan included; yields `post(body)` for /v1/completions."""
    from neuronmodel_runtime.server.app import create_app

    config = load_config(None, {"model": str(TARGET), "max_num_seqs": 4, "max_model_len": 64,
                                "max_context_length": 32}, env={})
    app = create_app(engine, config)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            yield lambda body: client.post("/v1/completions", json={"model": "target", **body})


async def test_a_speculating_runner_serves_sampled_requests_only_if_it_samples_them(build):
    """NxDI's fused speculation verifies by argmax: its runner refuses sampled requests (400 naming temperature)
    instead of answering them greedily; the reference and TNx runners verify by rejection sampling and serve them."""
    engine = build(speculation={"mode": "draft", "draft_model": str(DRAFT), "num_speculative_tokens": 3})
    async with serving(engine) as post:
        sampled = await post({"prompt": "Hello", "max_tokens": 4, "temperature": 0.8})
        greedy_reply = await post({"prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert greedy_reply.status_code == 200, greedy_reply.text
    if engine.engine.capabilities.sampling.sampled:
        assert sampled.status_code == 200, sampled.text
    else:
        assert sampled.status_code == 400 and sampled.json()["error"]["param"] == "temperature"
    assert engine.engine.capabilities.sampling.sampled == (not build.runner.startswith("nxdi"))


async def test_a_prompt_longer_than_the_compiled_context_is_a_400_before_the_runner(build):
    async with serving(build()) as post:
        reply = await post({"prompt": list(range(5, 5 + 33)), "max_tokens": 2})
    assert reply.status_code == 400, reply.text
    assert "max_context_length" in reply.json()["error"]["message"]


async def test_what_the_runner_cannot_honour_is_refused_with_a_400_naming_the_field(build):
    """Seeds and logprobs: refused on the device by every Neuron runner (their samplers have neither), served by
    the reference runner (seeds) and by every runner once sampling leaves the device (sampling.on_device false)."""
    engine = build()
    caps = engine.engine.capabilities.sampling
    seeded = {"prompt": "Hello", "max_tokens": 3, "temperature": 1.0, "seed": 7}
    async with serving(engine) as post:
        reply = await post(seeded)
        if build.runner == "torch":
            assert reply.status_code == 200 and caps.seeds
        else:
            assert reply.status_code == 400, reply.text
            message = reply.json()["error"]["message"]
            assert message.startswith("seed:") and build.runner.split("-")[0] in message and "on_device" in message
        reply = await post({"prompt": "Hello", "max_tokens": 2, "logprobs": 2})
        assert reply.status_code == 400 and reply.json()["error"]["message"].startswith("logprobs:")

    async with serving(build(sampling={"on_device": False})) as post:
        first, second = [await post({**seeded, "logprobs": 2}) for _ in range(2)]
    assert first.status_code == 200, first.text
    assert first.json()["choices"][0]["text"] == second.json()["choices"][0]["text"]  # the seed is honoured
    assert len(first.json()["choices"][0]["logprobs"]["top_logprobs"][0]) == 2


def test_runner_info_names_the_framework_and_release(build):
    info = build().engine.runner.info()
    framework, _, version = build.runner.partition("-")
    assert info["framework"] == framework
    if version:
        assert info[framework] == version and info["written_against"] is True
        assert info["compiled_now"] is True
    json.dumps(info)


@pytest.mark.parametrize("speculating", [False, True], ids=["plain", "speculating"])
def test_selftest_passes_with_the_selected_framework(build, capsys, speculating):
    """What a user runs on a Neuron pod, here on each runner (the fakes for the Neuron ones): every check passes,
    and the Neuron runners' compiled artifacts make the round trip."""
    from neuronmodel_runtime import cli

    build(max_model_len=64)  # installs the runner's library; selftest then selects it like a pod would
    framework = build.runner.partition("-")[0]
    argv = ["selftest", "--model", str(TARGET), "--framework", framework, "--max-num-seqs", "4",
            "--max-model-len", "64", "--max-context-length", "32", "--dtype", "float32", "--tokens", "10"]
    if speculating:
        argv += ["--speculation-mode", "draft", "--draft-model", str(DRAFT), "--num-speculative-tokens", "3"]
    assert cli.main(argv) == 0, capsys.readouterr().out
    lines = capsys.readouterr().out.splitlines()
    results = {line.split()[1]: line.split()[0] for line in lines if line.split()[0] in ("pass", "FAIL", "skip")}
    expected_artifacts = "skip" if framework == "torch" else "pass"
    expected_sampled = "skip" if speculating and framework == "nxdi" else "pass"
    assert results == {"greedy": "pass", "sampled": expected_sampled, "speculation": "pass" if speculating else "skip",
                       "compiled": expected_artifacts}, "\n".join(lines)
