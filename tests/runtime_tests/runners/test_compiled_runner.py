"""The reference runner with `compile: true`: fixed-shape compiled graphs (decode at batch buckets with filler rows,
prefill at context-encoding buckets, verify at [slots, k+1]) that serve exactly what eager decoding serves, never
compile while serving, and start warm from their artifacts (torch's compile cache + converted weights).

Tolerance: float32 logits within 1e-4 (max abs) of eager decoding on the same checkpoint. Measured: 2e-7 on the
random tiny checkpoints, 1.5e-5 on the committed tiny target (logits up to 20): the graphs' matmuls run on oneDNN
with packed weights and their attention over whole KV lines, so sums run in another order than eager's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch, RunnerError, ScoreBatch  # noqa: E402
from neuronmodel_runtime.runners.buckets import (  # noqa: E402
    batch_buckets,
    cache_length,
    context_buckets,
    generation_buckets,
    graph_shapes,
)
from neuronmodel_runtime.runners.compiled_graphs import COMPILED_STANCE, FixedShapeModel  # noqa: E402
from neuronmodel_runtime.runners.graph_artifacts import compile_counters  # noqa: E402
from neuronmodel_runtime.sampling.params import GREEDY, SamplingParams  # noqa: E402
from runtime_tests.helpers.runner_helpers import make_runner  # noqa: E402
from runtime_tests.helpers.engine_runs import prompts, run_engine, spec_fields  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "tests" / "assets" / "tiny"
ATOL = 1e-4
KINDS = ["llama", "qwen2", "llama3", "mistral"]
slow = pytest.mark.slow  # compiles graphs: seconds to a minute each on 2 cores


@pytest.fixture(scope="module", autouse=True)
def own_caches(tmp_path_factory):
    """This module's inductor cache and artifacts folder: nothing read from or left in the machine's."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    saved = os.environ.get("NEURONMODEL_CACHE")
    os.environ["NEURONMODEL_CACHE"] = str(tmp_path_factory.mktemp("neuronmodel-cache"))
    with temporary_cache_dir(str(tmp_path_factory.mktemp("inductor"))):
        yield
    if saved is None:
        os.environ.pop("NEURONMODEL_CACHE", None)
    else:
        os.environ["NEURONMODEL_CACHE"] = saved


def test_context_buckets_are_nxdis():
    """NxDI's generate_buckets(128, max_context_length)."""
    assert context_buckets(1024) == [128, 256, 512, 1024]
    assert context_buckets(1000) == [128, 256, 512, 1000]
    assert context_buckets(700) == [128, 256, 700]  # log2 rounded: never a bucket just below the last
    assert context_buckets(200) == [128, 200]
    assert context_buckets(128) == [128]
    assert context_buckets(32) == [32]


class Recorder:
    """Drives a runner through a fixed schedule; records every row's tokens and the logits they were sampled from."""

    def __init__(self, runner):
        self.runner = runner
        self.logits = []
        sample = runner._sample

        def recording(logits, *args):
            self.logits.append(logits.float().cpu().clone())
            return sample(logits, *args)

        runner._sample = recording

    def prefill(self, slots, prompts_):
        return [t[0] for t in self.runner.prefill(PrefillBatch(slots, prompts_, [GREEDY] * len(slots))).token_ids]

    def decode(self, slots, last, positions):
        out = self.runner.decode(DecodeBatch(slots, last, positions, [GREEDY] * len(slots)))
        return [t[0] for t in out.token_ids]


def schedule(runner) -> tuple[list[list[int]], list]:
    """Batched prefill (a one-token prompt among them), batched decode in slot and in other orders, a slot freed and
    reused, prefill while others rest, a decode of one row alone (every other slot a filler), and of slot 0 alone
    (the batch bucket of 1: the other slots untouched)."""
    rec = Recorder(runner)
    out: dict[int, list[int]] = {}
    pos: dict[int, int] = {}

    def prefill(slots, ps):
        for slot, p, t in zip(slots, ps, rec.prefill(slots, ps)):
            out[slot], pos[slot] = [t], len(p)

    def decode(slots, steps):
        for _ in range(steps):
            tokens = rec.decode(slots, [out[s][-1] for s in slots], [pos[s] for s in slots])
            for s, t in zip(slots, tokens):
                out[s].append(t)
                pos[s] += 1

    prefill([2, 0, 3], [[3, 17, 5, 60, 2], [9], [7, 1, 88, 42, 42, 9, 30, 31, 5, 77, 64, 2, 3, 50]])
    decode([0, 2, 3], 5)
    decode([3, 0, 2], 3)
    finished = out.pop(0)
    runner.release(0)
    prefill([0, 1], [[11, 12, 13, 14, 15, 16, 17, 18, 90], [44]])
    decode([1, 3, 0, 2], 6)
    decode([1], 4)
    decode([0], 3)
    decode([2, 1], 2)
    return [finished] + [out[s] for s in sorted(out)], rec.logits


@pytest.fixture(scope="module", params=KINDS)
def compiled_and_eager(request, tiny_checkpoint):
    folder = tiny_checkpoint(request.param)
    return make_runner(folder, compile=True), make_runner(folder)


@slow
def test_compiled_runner_serves_what_eager_serves(compiled_and_eager):
    compiled, eager = compiled_and_eager
    assert compiled.info()["graphs"] == {"decode_64_b1": [1, 1], "decode_64": [4, 1], "prefill_32": [1, 32],
                                         "batchprefill_32": [4, 32]}
    before = compile_counters()
    tokens, logits = schedule(compiled)
    assert compile_counters()["graphs"] == before["graphs"], "serving after warm-up compiled a graph"
    expected_tokens, expected_logits = schedule(eager)
    assert tokens == expected_tokens
    assert len(logits) == len(expected_logits)
    worst = max(float((a - b).abs().max()) for a, b in zip(logits, expected_logits))
    assert worst < ATOL, worst


@slow
def test_prefill_buckets_and_bucket_choice(tiny_checkpoint):
    """Buckets 32 .. 256: prompts of 1, 32, 33, 128, 129 and 256 tokens each land in the smallest that holds them."""
    folder = tiny_checkpoint("llama")
    fields = dict(max_num_seqs=2, max_model_len=256, max_context_length=256)
    compiled, eager = make_runner(folder, compile=True, **fields), make_runner(folder, **fields)
    assert set(compiled.info()["graphs"]) == {"decode_128", "decode_256", "decode_128_b1", "decode_256_b1",
                                              "prefill_32", "prefill_64", "prefill_128", "prefill_256",
                                              "batchprefill_32", "batchprefill_64", "batchprefill_128"}
    assert [compiled.graphs.bucket(n) for n in (1, 32, 33, 128, 129, 256)] == [32, 32, 64, 128, 256, 256]
    with pytest.raises(ValueError, match="max_context_length"):
        compiled.graphs.bucket(257)
    for n in (1, 33, 128, 129, 256):
        prompt = [(5 * i + n) % 95 + 1 for i in range(n)]
        got = Recorder(compiled)
        want = Recorder(eager)
        assert got.prefill([1], [prompt]) == want.prefill([1], [prompt]), n
        assert float((got.logits[0] - want.logits[0]).abs().max()) < ATOL


def test_generation_buckets_are_nxdis_token_generation_buckets():
    """NxDI's token_generation_buckets (generate_buckets(128, max_length)) over the KV line; verify rows count
    their k scratch positions."""
    assert generation_buckets(2048) == [128, 256, 512, 1024, 2048]
    assert generation_buckets(64) == [64]
    shapes = graph_shapes(16, 1024, cache_length(2048, 5), 5)
    assert [g for g in shapes if g.startswith("verify")] == [f"verify_{b}" for b in (128, 256, 512, 1024, 2052)]
    assert [g for g in shapes if g.startswith("decode")] == [
        f"decode_{b}{n}" for b in (128, 256, 512, 1024, 2052) for n in ("_b1", "_b4", "")]


def test_batch_buckets_grow_by_four_up_to_the_slots():
    assert batch_buckets(32) == [1, 4, 16, 32]
    assert batch_buckets(16) == [1, 4, 16]
    assert batch_buckets(8) == [1, 4, 8]
    assert batch_buckets(3) == [1, 3]
    assert batch_buckets(1) == [1]
    assert graph_shapes(8, 32, 64, 0) == {"decode_64_b1": [1, 1], "decode_64_b4": [4, 1], "decode_64": [8, 1],
                                          "prefill_32": [1, 32], "batchprefill_32": [8, 32]}


@slow
def test_prompts_filling_most_slots_are_prefilled_in_one_call(tiny_checkpoint):
    """4 slots: 3 prompts of one bucket go in one batchprefill call (its spare row repeats the first prompt), 2 go
    one by one; either way the logits are eager's and the lines hold the prompts (decoding continues as eager)."""
    folder = tiny_checkpoint("llama")
    compiled, eager = make_runner(folder, compile=True), make_runner(folder)
    graphs = compiled.graphs
    ran = []
    run = graphs._run
    graphs._run = lambda graph, *inputs: ran.append(graph) or run(graph, *inputs)
    got, want = Recorder(compiled), Recorder(eager)
    three = [[3, 17, 5, 60, 2], [9, 4], [7, 1, 88, 42, 42, 9, 30, 31, 5, 77, 64, 2, 3, 50]]
    assert got.prefill([2, 0, 3], three) == want.prefill([2, 0, 3], three)
    assert ran == ["batchprefill_32"]
    assert got.decode([0, 2, 3], [5, 6, 7], [2, 5, 14]) == want.decode([0, 2, 3], [5, 6, 7], [2, 5, 14])
    for rec in (got, want):
        rec.runner.release(0)
        rec.runner.release(3)
    two = [[11, 12, 13], [44]]
    assert got.prefill([0, 3], two) == want.prefill([0, 3], two)
    assert ran[-2:] == ["prefill_32", "prefill_32"]
    assert got.decode([0, 2, 3], [1, 2, 3], [3, 6, 1]) == want.decode([0, 2, 3], [1, 2, 3], [3, 6, 1])
    assert max(float((a - b).abs().max()) for a, b in zip(got.logits, want.logits)) < ATOL


@slow
def test_each_decode_step_runs_the_smallest_line_bucket_that_holds_its_rows(tiny_checkpoint):
    """Lines of 256 positions, buckets 128 and 256: rows below 128 decode in the 128 graph, and a row crossing it
    moves the whole step to the 256 graph (a resting row's filler past the bucket changes nothing); the tokens
    and logits are eager decoding's. (The prefill test's shapes: the artifacts it compiled are loaded.)"""
    folder = tiny_checkpoint("llama")
    fields = dict(max_num_seqs=2, max_model_len=256, max_context_length=256)
    compiled, eager = make_runner(folder, compile=True, **fields), make_runner(folder, **fields)
    graphs = compiled.graphs
    ran = []
    run = graphs._run
    graphs._run = lambda graph, *inputs: ran.append(graph) or run(graph, *inputs)
    got, want = Recorder(compiled), Recorder(eager)
    long, short = [(7 * i) % 95 + 1 for i in range(120)], [5, 9, 2]
    for rec in (got, want):
        rec.out = rec.prefill([0, 1], [long, short])
        rec.positions = [len(long), len(short)]
    for step in range(12):  # row 0 crosses position 128 at step 8
        for rec in (got, want):
            rec.out = rec.decode([0, 1], rec.out, rec.positions)
            rec.positions = [p + 1 for p in rec.positions]
        assert got.out == want.out, step
    assert [g for g in ran if g.startswith("decode")] == ["decode_128"] * 8 + ["decode_256"] * 4
    for step in range(3):  # row 0 rests past 128 (a filler at its next position): row 1 alone fits 128
        got.out[1:] = got.decode([1], got.out[1:], got.positions[1:])
        want.out[1:] = want.decode([1], want.out[1:], want.positions[1:])
        got.positions[1] += 1
        want.positions[1] += 1
        assert got.out == want.out
    assert ran[-1] == "decode_128"
    assert max(float((a - b).abs().max()) for a, b in zip(got.logits, want.logits)) < ATOL


@slow
def test_decode_runs_the_smallest_batch_bucket_holding_the_highest_slot(tiny_checkpoint):
    """8 slots, batch buckets 1, 4 and 8: a step decodes slots 0..n-1 for the smallest bucket n above its highest
    slot (the resting slots below it are fillers, those above are not touched), and the tokens and logits are eager
    decoding's, whichever bucket each step ran; none of them compiles while serving."""
    folder = tiny_checkpoint("llama")
    compiled, eager = make_runner(folder, compile=True, max_num_seqs=8), make_runner(folder, max_num_seqs=8)
    before = compile_counters()
    graphs = compiled.graphs
    ran = []
    run = graphs._run
    graphs._run = lambda graph, *inputs: ran.append(graph) or run(graph, *inputs)
    got, want = Recorder(compiled), Recorder(eager)
    prompts_ = {0: [3, 17, 5, 60, 2], 3: [9, 4], 4: [7, 1, 88, 42, 42, 9, 30, 31, 5, 77]}
    steps = [[0], [0], [3], [0, 3], [4], [0], [4, 0, 3], [0], [3]]
    for rec in (got, want):
        rec.out = {s: rec.prefill([s], [p])[0] for s, p in prompts_.items()}
        rec.positions = {s: len(p) for s, p in prompts_.items()}
        for slots in steps:
            tokens = rec.decode(slots, [rec.out[s] for s in slots], [rec.positions[s] for s in slots])
            for s, t in zip(slots, tokens):
                rec.out[s] = t
                rec.positions[s] += 1
    assert [g for g in ran if g.startswith("decode")] == ["decode_64_b1", "decode_64_b1", "decode_64_b4",
                                                          "decode_64_b4", "decode_64", "decode_64_b1", "decode_64",
                                                          "decode_64_b1", "decode_64_b4"]
    assert compile_counters()["graphs"] == before["graphs"], "serving after warm-up compiled a graph"
    assert got.out == want.out
    assert len(got.logits) == len(want.logits) == len(prompts_) + len(steps)
    assert max(float((a - b).abs().max()) for a, b in zip(got.logits, want.logits)) < ATOL


def test_a_decode_step_picks_the_smallest_line_and_batch_buckets_holding_its_rows(tiny_checkpoint):
    """The graph a decode step runs, every graph a stub that records its name (nothing compiled: milliseconds; the
    two tests above show the compiled graphs serving eager's tokens through the same choice): 8 slots, lines of
    256 positions (buckets 128, 256), batch buckets 1, 4, 8."""
    eager = make_runner(tiny_checkpoint("llama"), max_num_seqs=8, max_model_len=256)
    graphs = FixedShapeModel(eager.model, eager.config.max_context_length, 256)
    assert (graphs.lines, graphs.batches) == ([128, 256], [1, 4, 8])
    ran = []

    def stub(name):
        def run(_traced, tokens, _positions, _line):
            ran.append(name)
            return torch.zeros((tokens.shape[0], graphs.vocab_size))
        return run

    graphs._graphs = {name: stub(name) for name in graphs.shapes() if name.startswith("decode")}
    steps = [([0], [5], "decode_128_b1"), ([3], [5], "decode_128_b4"), ([0, 3], [127, 5], "decode_128_b4"),
             ([4], [5], "decode_128"), ([0], [128], "decode_256_b1"), ([2, 1], [9, 200], "decode_256_b4"),
             ([7, 0], [3, 255], "decode_256")]
    for slots, positions, expected in steps:
        assert len(graphs.decode(slots, [1] * len(slots), positions)) == len(slots)
        assert ran[-1] == expected, (slots, positions)


@slow
def test_serving_a_shape_that_was_not_compiled_fails_instead_of_compiling(tiny_checkpoint):
    graphs = make_runner(tiny_checkpoint("llama"), compile=True).graphs
    with pytest.raises(Exception, match="recompile"):
        with torch.inference_mode(), torch.compiler.set_stance(COMPILED_STANCE):
            graphs._graphs["decode_64"](graphs._traced, torch.zeros((3, 1), dtype=torch.int64),
                                        torch.ones((3, 1), dtype=torch.int64), 64)


@pytest.fixture(scope="module")
def greedy_plain(tiny_checkpoint):
    """Plain (eager, no speculation) greedy outputs of 10 requests through 3 slots: slots are reused."""
    target = tiny_checkpoint("llama")
    reqs = [(str(i), p, SamplingParams(temperature=0, max_tokens=20)) for i, p in enumerate(prompts(10))]
    reqs.append(("one", [42], SamplingParams(temperature=0, max_tokens=20)))  # a one-token prompt
    outputs, _ = run_engine(make_runner(target, max_num_seqs=3), reqs)
    return target, reqs, outputs


@slow
@pytest.mark.parametrize("mode", ["draft", "promptLookup"])
def test_compiled_speculation_matches_plain_decoding(greedy_plain, tiny_checkpoint, mode):
    target, reqs, expected = greedy_plain
    draft = tiny_checkpoint("qwen2") if mode == "draft" else None  # same vocabulary, another model
    runner = make_runner(target, max_num_seqs=3, compile=True, **spec_fields(mode, 3, draft))
    graphs = runner.info()
    assert graphs["graphs"]["verify_67"] == [3, 4]  # the line: max_model_len 64 + k 3 scratch positions
    if mode == "draft":
        assert graphs["draft_graphs"] == {"decode_67_b1": [1, 1], "decode_67": [3, 1], "prefill_32": [1, 32],
                                          "batchprefill_32": [3, 32], "verify_67": [3, 4]}
        assert runner.draft_model() is runner.draft_graphs
    before = compile_counters()
    outputs, engine = run_engine(runner, reqs)
    assert compile_counters()["graphs"] == before["graphs"]
    assert outputs == expected
    assert engine.stats.spec_drafts_total > 0


@slow
def test_compiled_score_logits_match_eager(tiny_checkpoint):
    """The verify graph: rows of different k, in any slot order, with the other slots as fillers."""
    target = tiny_checkpoint("llama")
    fields = dict(max_num_seqs=3, **spec_fields("promptLookup", 3))
    compiled, eager = make_runner(target, compile=True, **fields), make_runner(target, **fields)
    batches = [ScoreBatch([2, 0], [5, 9], [6, 3], [[1, 2, 3], [4]]), ScoreBatch([1], [7], [0], [[8, 8]])]
    for runner in (compiled, eager):
        runner.prefill(PrefillBatch([0, 2], [[1, 2, 3], [4, 5, 6, 7, 8, 9]], [GREEDY, GREEDY]))
    for batch in batches:
        got, want = compiled.score(batch), eager.score(batch)
        assert got.shape == want.shape
        for row, drafts in enumerate(batch.draft_tokens):
            width = len(drafts) + 1
            assert float((got[row, :width] - want[row, :width]).abs().max()) < ATOL


@slow
def test_committed_tiny_target_and_draft():
    """The committed tiny models (a trained target and its distilled draft), greedy, with draft speculation."""
    reqs = [(str(i), p, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
            for i, p in enumerate([[1, 300, 301, 302], [1, 77], [5]])]
    plain, _ = run_engine(make_runner(TINY / "target", max_num_seqs=2), reqs)
    runner = make_runner(TINY / "target", max_num_seqs=2, compile=True,
                         **spec_fields("draft", 3, TINY / "draft"))
    spec, engine = run_engine(runner, reqs)
    assert spec == plain and engine.stats.spec_accepted_tokens_total > 0


@slow
def test_host_sampling_and_logprobs_match_eager(tiny_checkpoint):
    """sampling.on_device false: the logits leave the graphs for the host sampler; logprobs as eager's."""
    folder = tiny_checkpoint("llama")
    fields = dict(sampling={"on_device": False})
    compiled, eager = make_runner(folder, compile=True, **fields), make_runner(folder, **fields)
    outs = []
    for runner in (compiled, eager):
        first = runner.prefill(PrefillBatch([3, 1], [[5, 6, 7], [8]], [GREEDY] * 2, num_logprobs=[2, None]))
        step = runner.decode(DecodeBatch([1, 3], [first.token_ids[1][0], first.token_ids[0][0]], [1, 3],
                                         [GREEDY] * 2, num_logprobs=[None, 3]))
        outs.append((first, step))
    (first_c, step_c), (first_e, step_e) = outs
    assert first_c.token_ids == first_e.token_ids and step_c.token_ids == step_e.token_ids
    for got, want in ((first_c.logprobs[0][0], first_e.logprobs[0][0]), (step_c.logprobs[1][0], step_e.logprobs[1][0])):
        assert got.top.keys() == want.top.keys() and abs(got.logprob - want.logprob) < ATOL
    assert first_c.logprobs[1] is None and step_c.logprobs[0] is None


@slow
def test_a_local_folder_missing_a_file_is_compiled_again_never_served(tiny_checkpoint):
    """The default shape's folder (serves_what_eager_serves[llama] compiled it into this module's cache, or this
    test's first runner does), a file of it removed: the next runner compiles it again."""
    runner = make_runner(tiny_checkpoint("llama"), compile=True)
    assert (runner.artifacts_folder / "weights.safetensors").is_file()
    (runner.artifacts_folder / "weights.safetensors").unlink()
    again = make_runner(tiny_checkpoint("llama"), compile=True)
    assert again.info()["compiled_now"] and (again.artifacts_folder / "weights.safetensors").is_file()


def test_policy_never_without_artifacts_fails_fast(tiny_checkpoint):
    with pytest.raises(RunnerError, match="policy is Never"):
        make_runner(tiny_checkpoint("llama"), compile=True, max_num_seqs=2,
                    compile_cache={"policy": "Never"})


START = r"""
import json, sys
from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch
from neuronmodel_runtime.runners.torch_reference import TorchReferenceRunner
from neuronmodel_runtime.sampling.params import GREEDY
config = RuntimeConfig(framework="torch", compile=True, max_num_seqs=2, max_model_len=64, max_context_length=32,
                       compile_cache={"policy": sys.argv[2]})
runner = TorchReferenceRunner(config, sys.argv[1])
runner.load()
out = [runner.prefill(PrefillBatch([1], [[3, 4, 5]], [GREEDY])).token_ids[0][0]]
for step in range(6):
    out.append(runner.decode(DecodeBatch([1], [out[-1]], [3 + step], [GREEDY])).token_ids[0][0])
print(json.dumps({"info": runner.info(), "tokens": out}))
"""


def start(model: Path, tmp_path: Path, inductor: str, policy: str = "IfNotCached") -> dict:
    """A runner started in a fresh process with its own (empty) inductor cache; its info() and greedy tokens."""
    env = {**os.environ, "NEURONMODEL_CACHE": str(tmp_path / "neuronmodel"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / inductor)}
    env.pop("NEURON_COMPILED_ARTIFACTS", None)
    done = subprocess.run([sys.executable, "-c", START, str(model), policy], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@slow
def test_warm_start_loads_the_artifacts_and_compiles_nothing(tiny_checkpoint, tmp_path):
    """Cold: compiles (FX-graph cache misses) and writes the artifacts. Warm, in another fresh process with an empty
    inductor cache and policy Never: converted weights, cache artifacts and kernels loaded, every graph a cache hit,
    no miss, no kernel built (the inductor cache holds exactly the shipped ones), the same tokens."""
    model = tiny_checkpoint("llama")
    cold = start(model, tmp_path, "inductor-cold")
    info = cold["info"]
    assert info["compiled_now"] and info["graph_cache"]["fxgraph_cache_miss"] >= 2
    folder = Path(info["artifacts"]["folder"])
    assert {p.name for p in folder.iterdir()} == {".neuronmodel-cache.json", "torch-compile-cache.bin",
                                                  "inductor-kernels.tar", "weights.safetensors"}
    with tarfile.open(folder / "inductor-kernels.tar") as tar:
        shipped = set(tar.getnames())
    assert shipped and all(name.endswith(".so") for name in shipped)
    assert info["convert_s"] >= 0 and info["compile_s"] > 0

    warm = start(model, tmp_path, "inductor-warm", policy="Never")
    info = warm["info"]
    assert not info["compiled_now"] and info["artifacts"]["folder"] == str(folder) and "load_s" in info
    assert info["graph_cache"]["fxgraph_cache_miss"] == 0
    assert info["graph_cache"]["fxgraph_cache_hit"] >= len(info["graphs"])
    inductor = tmp_path / "inductor-warm"
    assert {p.relative_to(inductor).as_posix() for p in inductor.glob("*/*.so")} == shipped
    assert warm["tokens"] == cold["tokens"]
