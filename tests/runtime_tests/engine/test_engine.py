"""The engine over a scripted runner: continuous batching, slot reuse, fairness and every stop condition."""

import threading

import pytest

from runtime_tests.helpers.fakes_runner import EOS, ByteTokenizer, ScriptedRunner, text_script
from neuronmodel_runtime.config import SpeculationConfig
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.speculation import build_speculation
from neuronmodel_runtime.engine.outputs import FINISH_ABORT, FINISH_ERROR, FINISH_LENGTH, FINISH_STOP
from neuronmodel_runtime.sampling.params import SamplingParams

TOK = ByteTokenizer()


def make_engine(runner, budget=1000, timeout=600.0, async_scheduling=False):
    return Engine(runner, TOK, {EOS}, max_num_batched_tokens=budget, request_timeout_s=timeout,
                  async_scheduling=async_scheduling)


#: What a client sees is the same whether a step's text is made between runner calls or beside the next one.
BOTH = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def run_all(engine, requests):
    """Add (id, prompt, params) requests, step until idle; return id -> (text, tokens, finish, stop_reason)."""
    results = {rid: ["", [], None, None] for rid, _, _ in requests}
    for rid, prompt, params in requests:
        engine.add(engine.make_request(rid, TOK.encode(prompt), params))

    def emit(outputs):
        for out in outputs:
            r = results.setdefault(out.request_id, ["", [], None, None])
            r[0] += out.text
            r[1] += out.token_ids
            if out.finished:
                r[2], r[3] = out.finish_reason, out.stop_reason

    steps = 0
    while engine.has_work:
        engine.step(emit)
        steps += 1
        assert steps < 10_000
    return {k: tuple(v) for k, v in results.items()}


@BOTH
def test_eos_finishes_with_stop_and_is_not_in_the_text(async_scheduling):
    engine = make_engine(ScriptedRunner(text_script("héllo")), async_scheduling=async_scheduling)
    res = run_all(engine, [("a", "hi", SamplingParams(temperature=0))])
    assert res["a"] == ("héllo", list("héllo".encode()) + [EOS], FINISH_STOP, EOS)


@BOTH
def test_max_tokens_finishes_with_length_exactly(async_scheduling):
    engine = make_engine(ScriptedRunner(text_script("abcdef")), async_scheduling=async_scheduling)
    res = run_all(engine, [("a", "x", SamplingParams(max_tokens=3))])
    assert res["a"][:3] == ("abc", [97, 98, 99], FINISH_LENGTH)


@BOTH
def test_stop_string_across_tokens_truncates_output(async_scheduling):
    res = run_all(
        make_engine(ScriptedRunner(text_script("one two STOP three")), async_scheduling=async_scheduling),
        [("a", "x", SamplingParams(stop=("STOP",)))],
    )
    assert res["a"][0] == "one two " and res["a"][2:] == (FINISH_STOP, "STOP")


@BOTH
def test_ignore_eos_and_min_tokens(async_scheduling):
    runner = ScriptedRunner(text_script("ab"))  # then EOS forever
    res = run_all(
        make_engine(runner, async_scheduling=async_scheduling),
        [("ign", "x", SamplingParams(ignore_eos=True, max_tokens=5)), ("min", "x", SamplingParams(min_tokens=4))],
    )
    assert res["ign"][1] == [97, 98, EOS, EOS, EOS] and res["ign"][2] == FINISH_LENGTH
    assert res["min"][1] == [97, 98, EOS, EOS, EOS] and res["min"][2] == FINISH_STOP  # 5th token may stop


@BOTH
def test_stop_token_ids(async_scheduling):
    engine = make_engine(ScriptedRunner(text_script("abcd")), async_scheduling=async_scheduling)
    res = run_all(engine, [("a", "x", SamplingParams(stop_token_ids=(99,)))])
    assert res["a"][:4] == ("ab", [97, 98, 99], FINISH_STOP, 99)


@BOTH
def test_max_model_len_bounds_prompt_plus_output(async_scheduling):
    runner = ScriptedRunner(text_script("z" * 100), max_model_len=10)
    res = run_all(make_engine(runner, async_scheduling=async_scheduling), [("a", "abcd", SamplingParams())])
    assert len(res["a"][1]) == 6 and res["a"][2] == FINISH_LENGTH


@BOTH
def test_more_requests_than_slots_all_finish_and_slots_are_reused(async_scheduling):
    runner = ScriptedRunner(text_script("xyz"), slots=2)
    reqs = [(str(i), f"p{i}", SamplingParams()) for i in range(7)]
    res = run_all(make_engine(runner, async_scheduling=async_scheduling), reqs)
    assert all(r == ("xyz", [120, 121, 122, EOS], FINISH_STOP, EOS) for r in res.values())
    assert sorted(set(runner.released)) == [0, 1] and len(runner.released) == 7
    assert all(len(slots) <= 2 for _, slots in runner.calls)


def test_running_requests_decode_every_step_while_others_are_admitted():
    """Fairness: arrivals never stall decodes; a long request keeps advancing while short ones cycle through."""
    runner = ScriptedRunner(lambda p, o: 97 if p[0] == ord("L") or len(o) < 1 else EOS, slots=2)
    engine = make_engine(runner)
    engine.add(engine.make_request("long", TOK.encode("L"), SamplingParams(max_tokens=20)))
    engine.step(lambda outs: None)  # long is prefilled
    for i in range(5):
        engine.add(engine.make_request(f"s{i}", TOK.encode("s"), SamplingParams()))
    long_req = engine.scheduler.running[0]
    before = len(long_req.output_ids)
    for k in range(6):
        engine.step(lambda outs: None)
        assert len(long_req.output_ids) == before + k + 1


def test_prefill_token_budget_limits_admissions_per_step_but_never_blocks_a_long_prompt():
    runner = ScriptedRunner(text_script("a"), slots=4)
    engine = make_engine(runner, budget=5)
    for i in range(3):
        engine.add(engine.make_request(str(i), TOK.encode("abcd"), SamplingParams()))
    engine.add(engine.make_request("long", TOK.encode("x" * 9), SamplingParams()))
    engine.step(lambda o: None)
    assert runner.calls[0] == ("prefill", [0])  # 4 tokens; a second prompt would exceed 5
    res = run_all(engine, [])
    assert res["long"][0] == "a"  # the 9-token prompt, over the budget, still ran (alone)
    assert all(len(slots) == 1 for kind, slots in runner.calls if kind == "prefill")


@BOTH
def test_abort_frees_the_slot_and_reports_abort(async_scheduling):
    runner = ScriptedRunner(text_script("a" * 50), slots=1)
    engine = make_engine(runner, async_scheduling=async_scheduling)
    got = []
    engine.add(engine.make_request("a", [1], SamplingParams()))
    engine.add(engine.make_request("b", [1], SamplingParams(max_tokens=2)))
    engine.step(got.extend)
    engine.abort(["a"])
    for _ in range(10):  # "b" waits for the only slot: a leaked one would leave it waiting for ever
        engine.step(got.extend)
    finals = {o.request_id: o.finish_reason for o in got if o.finished}
    assert finals == {"a": FINISH_ABORT, "b": FINISH_LENGTH}
    assert not engine.has_work
    assert runner.released == [0, 0]


@BOTH
def test_timeout_aborts(async_scheduling):
    engine = make_engine(ScriptedRunner(text_script("a" * 50)), timeout=0.0, async_scheduling=async_scheduling)
    res = run_all(engine, [("a", "x", SamplingParams())])
    assert res["a"][2] == FINISH_ABORT


def test_runner_failure_fails_only_that_step_and_the_engine_keeps_serving():
    runner = ScriptedRunner(text_script("ok"), slots=2, fail_on=lambda slot: slot == 0)
    engine = make_engine(runner)
    outs = []
    engine.add(engine.make_request("bad", [1], SamplingParams()))
    engine.step(outs.extend)
    assert outs[-1].finished and outs[-1].finish_reason == FINISH_ERROR and "injected" in outs[-1].error
    runner.fail_on = None
    res = run_all(engine, [("good", "x", SamplingParams())])
    assert res["good"][0] == "ok"


@BOTH
@pytest.mark.parametrize("n_slots", [1, 3, 8])
def test_outputs_do_not_depend_on_batching(n_slots, async_scheduling):
    script = lambda p, o: (sum(p) + 7 * len(o)) % 200 + 32 if len(o) < 10 else EOS  # noqa: E731
    reqs = [(str(i), f"prompt {i}" * (i + 1), SamplingParams()) for i in range(10)]
    runner = lambda slots: ScriptedRunner(script, slots=slots, max_model_len=256)  # noqa: E731
    alone = {rid: run_all(make_engine(runner(1)), [(rid, p, s)])[rid] for rid, p, s in reqs}
    together = run_all(make_engine(runner(n_slots), async_scheduling=async_scheduling), reqs)
    assert together == alone


def spec_engine(text, k=4, max_model_len=64, fixed_k=False, async_scheduling=False):
    """An engine over a fused-speculation runner whose drafts are always right."""
    runner = ScriptedRunner(text_script(text), slots=2, max_model_len=max_model_len, spec_k=k, fixed_k=fixed_k)
    return Engine(runner, TOK, {EOS}, 1000, speculation=build_speculation(
        SpeculationConfig(mode="draft", draft_model="unused", num_speculative_tokens=k), runner),
                  async_scheduling=async_scheduling), runner


@BOTH
@pytest.mark.parametrize(
    "params, text, finish",
    [
        (SamplingParams(stop=("CD",)), "abCDefgh", FINISH_STOP),  # stop string inside an accepted run
        (SamplingParams(), "abc", FINISH_STOP),  # EOS inside a run
        (SamplingParams(max_tokens=1), "abcdefgh", FINISH_LENGTH),
        (SamplingParams(max_tokens=6), "abcdefghijk", FINISH_LENGTH),  # max_tokens reached mid-run
    ],
)
def test_multi_token_steps_stop_exactly_where_plain_decoding_would(params, text, finish, async_scheduling):
    plain = run_all(make_engine(ScriptedRunner(text_script(text))), [("a", "xy", params)])["a"]
    engine, runner = spec_engine(text, async_scheduling=async_scheduling)
    spec = run_all(engine, [("a", "xy", params)])["a"]
    assert spec == plain and spec[2] == finish
    assert engine.stats.spec_accepted_tokens_total > 0 or params.max_tokens == 1


@BOTH
def test_speculation_shrinks_near_max_model_len_instead_of_failing(async_scheduling):
    engine, runner = spec_engine("z" * 100, k=4, max_model_len=12, async_scheduling=async_scheduling)
    res = run_all(engine, [("a", "abcd", SamplingParams())])["a"]
    assert len(res[1]) == 8 and res[2] == FINISH_LENGTH  # 4 prompt + 8 output = max_model_len
    assert [k for ks in runner.spec_calls for k in ks] == [4, 1]  # 4+1 tokens, then room for only 1+1


def test_speculation_metrics_count_drafts_and_acceptance_per_position():
    engine, _ = spec_engine("abcdefghij", k=3)
    run_all(engine, [("a", "x", SamplingParams(max_tokens=9))])
    s = engine.stats
    # max_tokens 9 = 1 (prefill) + 4 + 4: two decode steps with 3 drafts each, all accepted
    assert s.spec_drafts_total == 2 and s.spec_draft_tokens_total == 6 and s.spec_accepted_tokens_total == 6
    assert s.spec_accepted_per_position == [2, 2, 2]


@BOTH
def test_fixed_k_runner_never_writes_past_its_kv_line(async_scheduling):
    """A runner compiled for one k gets k or nothing: in a slot's last k positions the engine decodes plainly."""
    plain = run_all(make_engine(ScriptedRunner(text_script("z" * 100), max_model_len=12)), [("a", "abcd", SamplingParams())])
    engine, runner = spec_engine("z" * 100, k=4, max_model_len=12, fixed_k=True, async_scheduling=async_scheduling)
    res = run_all(engine, [("a", "abcd", SamplingParams())])["a"]
    assert res == plain["a"] and len(res[1]) == 8 and res[2] == FINISH_LENGTH
    assert [ks for ks in runner.spec_calls] == [[4], [], []]  # 5 -> 10 tokens, then 2 plain steps to 12


def test_a_speculation_mode_the_runner_cannot_serve_fails_at_startup():
    """Prompt lookup needs a runner that scores host drafts; a fused-only runner is refused with a clear error."""
    from neuronmodel_runtime.config import ConfigError

    runner = ScriptedRunner(text_script("abc"), spec_k=2)
    with pytest.raises(ConfigError, match="scripted runner cannot speculate with 'promptLookup'.*serves: draft"):
        build_speculation(SpeculationConfig(mode="promptLookup", num_speculative_tokens=2), runner)


def test_async_scheduling_hands_on_a_calls_text_while_the_next_call_runs():
    """Each decode meets the text of the call before it, handed on from another thread while the decode runs: made
    between the two calls instead, the decode waits for it in vain and fails its request."""
    meet = threading.Barrier(2, timeout=10)

    class MeetingRunner(ScriptedRunner):
        def decode(self, batch):
            meet.wait()
            return super().decode(batch)

    engine = make_engine(MeetingRunner(text_script("abc")), async_scheduling=True)
    engine.add(engine.make_request("a", [1], SamplingParams()))
    got, threads = [], set()

    def emit(outputs):
        got.extend(outputs)
        if threading.current_thread() is not threading.main_thread():
            threads.add(threading.current_thread().name)
            meet.wait()

    while engine.has_work:
        engine.step(emit)
    assert "".join(o.text for o in got) == "abc" and got[-1].finish_reason == FINISH_STOP
    assert [o.token_ids for o in got] == [[97], [98], [99], [EOS]]  # one output per call, in order
    assert len(threads) == 1 and engine.runner.calls == [("prefill", [0])] + [("decode", [0])] * 3


def test_async_scheduling_ends_a_stop_string_one_call_late_and_drops_that_calls_token():
    """The text that shows a stop string is made while the next call runs: the request's slot decodes once more
    than it would have, and that token never reaches the client (the output equals the synchronous engine's)."""
    outputs, calls = {}, {}
    for async_scheduling in (False, True):
        runner = ScriptedRunner(text_script("ab STOP cd"))
        engine = make_engine(runner, async_scheduling=async_scheduling)
        outputs[async_scheduling] = run_all(engine, [("a", "x", SamplingParams(stop=("STOP",)))])
        calls[async_scheduling] = runner.calls
    assert outputs[True] == outputs[False] == {"a": ("ab ", list(b"ab STOP"), FINISH_STOP, "STOP")}
    assert calls[True] == calls[False] + [("decode", [0])]
