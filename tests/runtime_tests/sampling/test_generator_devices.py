"""Where sampling happens: generators live on the device of the tensors they draw for (CUDA only)."""

from __future__ import annotations

import pytest
import torch

from runtime_tests.helpers.fakes_runner import ByteTokenizer
from runtime_tests.helpers.runner_helpers import make_runner
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.speculation import build_speculation
from neuronmodel_runtime.sampling.params import SamplingParams


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("on_device", [True, False])
@pytest.mark.parametrize("mode", ["draft", "promptLookup"])
def test_speculation_samples_where_the_generators_live(tiny_checkpoint, on_device, mode):
    """Host sampling on an accelerator keeps logits, generators and the verifier on the host; on-device sampling
    keeps all of them on the device. Either way a seeded speculative run completes and is reproducible."""
    target = tiny_checkpoint("llama")
    spec = {"mode": mode, "num_speculative_tokens": 3, "draft_model": str(target) if mode == "draft" else None}

    def run() -> list[int]:
        runner = make_runner(target, device="cuda", sampling={"on_device": on_device}, speculation=spec)
        engine = Engine(runner, ByteTokenizer(), set(), 4096, speculation=build_speculation(runner.config.speculation,
                                                                                           runner))
        engine.add(engine.make_request("a", [5, 6, 5, 6, 5], SamplingParams(temperature=0.8, seed=3, max_tokens=12)))
        out: list[int] = []
        while engine.has_work:
            engine.step(lambda outs: out.extend(t for o in outs for t in o.token_ids))
        assert runner.slot_generators([0])[0].device.type == ("cuda" if on_device else "cpu")
        return out

    first = run()
    assert len(first) == 12 and run() == first
