"""RequestOutput on the engine core's channel: its tuple holds every field, in the order the dataclass reads back."""

from __future__ import annotations

import dataclasses
import pickle

from neuronmodel_runtime.engine.outputs import RequestMetrics, RequestOutput
from neuronmodel_runtime.runners.base import TokenLogprob


def test_an_output_crosses_the_channel_as_a_tuple_and_comes_back_equal():
    fields = dataclasses.fields(RequestOutput)
    # a distinct, non-default value in every field: a field left out or out of order cannot come back equal
    out = RequestOutput(request_id="r-1", text="é!", token_ids=[5, 6], num_prompt_tokens=3, num_output_tokens=7,
                        finished=True, finish_reason="stop", stop_reason=13,
                        logprobs=[TokenLogprob(-0.5, {5: -0.5}), TokenLogprob(-1.5, {6: -1.5, 2: -2.0})],
                        error="none really", metrics=RequestMetrics(1.0, 2.0, 3.0, 4.0))
    assert all(getattr(out, f.name) != f.default for f in fields)
    assert len(out.as_tuple()) == len(fields)
    assert RequestOutput(*pickle.loads(pickle.dumps(out.as_tuple()))) == out
