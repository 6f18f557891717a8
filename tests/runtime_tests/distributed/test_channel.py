"""The step broadcast's messages: every batch the engine sends survives the trip, less the penalties' history
(a worker's sampled tokens are never used), a slot's unchanged sampling row travels once, and the encoding stays
small at batch 64."""

import dataclasses

from neuronmodel_runtime.distributed.channel import Op, StepCodec
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch, ScoreBatch
from neuronmodel_runtime.sampling.params import RowSampling
from runtime_tests.helpers.group_peers import message_peer

ROW = RowSampling(top_k=40, top_p=0.9, temperature=0.7, seed=7, presence_penalty=0.5, repetition_penalty=1.1,
                  logit_bias=((3, -100.0), (9, 2.5)), masked_token_ids=(2,), prompt_ids=[1, 2, 3], output_ids=[4])


def trip(leader: StepCodec, worker: StepCodec, op: Op, body=None):
    return worker.decode(op, leader.encode(op, body))


def test_every_step_round_trips():
    leader, worker = StepCodec(), StepCodec()
    prefill = PrefillBatch(slots=[0, 3], prompt_ids=[[1, 2, 3], [4]], sampling=[ROW, ROW], num_logprobs=[None, 2])
    decode_batch = DecodeBatch(slots=[1], last_tokens=[5], positions=[9], sampling=[ROW], num_spec_tokens=[2],
                               num_logprobs=[None])
    score = ScoreBatch(slots=[2], last_tokens=[7], positions=[4], draft_tokens=[[8, 9]])
    for op, batch in ((Op.PREFILL, prefill), (Op.DECODE, decode_batch), (Op.SCORE, score)):
        assert trip(leader, worker, op, batch) == batch, op  # RowSampling compares without its history
    got = trip(leader, worker, Op.DECODE, decode_batch).sampling[0]
    assert (got.prompt_ids, got.output_ids) == ((), ()), "the penalties' history stays on the leader"
    assert got.logit_bias == ((3, -100.0), (9, 2.5)) and got.masked_token_ids == (2,)
    assert trip(leader, worker, Op.RELEASE, 5) == 5
    assert leader.encode(Op.NOOP) == b"" and worker.decode(Op.SHUTDOWN, b"") is None


def test_a_slots_row_travels_when_it_changes_and_a_released_slot_starts_over():
    leader, worker = StepCodec(), StepCodec()
    other = dataclasses.replace(ROW, seed=8)

    def step(rows):
        batch = DecodeBatch(slots=list(range(len(rows))), last_tokens=[1] * len(rows), positions=[2] * len(rows),
                            sampling=rows)
        data = leader.encode(Op.DECODE, batch)
        got = worker.decode(Op.DECODE, data)
        assert got.sampling == rows
        return data

    first = step([ROW, ROW])
    again = step([ROW, ROW])
    assert len(again) < len(first) // 2, "unchanged rows travel as null"
    assert step([ROW, other]) != again  # a changed row travels again, and the worker takes it
    trip(leader, worker, Op.RELEASE, 1)
    assert step([ROW, other]) != again  # a released slot's row travels again


def test_a_batch_64_decode_message_is_a_few_kilobytes():
    leader = StepCodec()
    greedy = RowSampling(top_k=1, top_p=1.0, temperature=1.0, seed=None, output_ids=list(range(4000)))
    batch = DecodeBatch(slots=list(range(64)), last_tokens=[31999] * 64, positions=[4000] * 64,
                        sampling=[greedy] * 64, num_logprobs=[None] * 64)
    assert len(leader.encode(Op.DECODE, batch)) < 16_000, "one message per step, independent of the sequences' length"
    assert len(leader.encode(Op.DECODE, batch)) < 2_500, "then the slots, tokens and positions only"


def test_a_message_longer_than_the_inline_part_arrives_whole(tmp_path):
    """Between two processes of a real gloo group: a short message, one past INLINE_BYTES (a prefill of long
    prompts), and a heartbeat, in order."""
    import multiprocessing
    import socket

    from neuronmodel_runtime.distributed.channel import INLINE_BYTES

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    peers = [ctx.Process(target=message_peer, args=(rank, port, out, ROW)) for rank in (0, 1)]
    for p in peers:
        p.start()
    got = out.get(timeout=120)
    for p in peers:
        p.join(60)
    long_prompt = PrefillBatch(slots=[0], prompt_ids=[list(range(INLINE_BYTES // 2))], sampling=[ROW])
    assert got == [(Op.RELEASE, 3), (Op.PREFILL, long_prompt), (Op.NOOP, None)]

