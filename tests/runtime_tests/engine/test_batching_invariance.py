"""Continuous batching never changes a greedy result: 32 concurrent requests equal each request run alone.

Runs the real stack below HTTP (AsyncEngine -> Engine -> TorchReferenceRunner) on the committed tiny model, with
8 slots, so requests join and leave the batch at different steps and reuse each other's slots.
"""

import asyncio
from pathlib import Path

import pytest

from neuronmodel_runtime.cli import build_engine
from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.server.tokenizer import chat_prompt_ids
from neuronmodel_runtime.sampling.params import SamplingParams

TINY = Path(__file__).resolve().parents[2] / "assets" / "tiny" / "target"
QUESTIONS = ["What does {} do?", "Explain {} briefly.", "Return the value of {}", "How is {} used?"]
NAMES = ["os.path.join", "json.dumps", "list.sort", "dict.get", "re.match", "zip", "open", "print"]

pytestmark = pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="tiny model not committed")


async def collect(stream):
    tokens, text = [], ""
    async for out in stream:
        tokens += out.token_ids
        text += out.text
    return tokens, text, out.finish_reason


async def test_32_concurrent_greedy_requests_equal_their_outputs_alone():
    config = RuntimeConfig(model=str(TINY), framework="torch", max_num_seqs=8, max_model_len=256,
                           max_context_length=128)
    engine = build_engine(config)
    engine.start()
    try:
        prompts = [chat_prompt_ids(engine.tokenizer, [{"role": "user", "content": q.format(n)}])
                   for q in QUESTIONS for n in NAMES]
        # Varied lengths: some finish on EOS early, others run to max_tokens, so slots free at different steps.
        params = [SamplingParams(temperature=0, max_tokens=8 + 3 * (i % 7)) for i in range(len(prompts))]
        together = await asyncio.gather(*(collect(engine.add_request(f"c{i}", p, sp))
                                          for i, (p, sp) in enumerate(zip(prompts, params))))
        alone = [await collect(engine.add_request(f"a{i}", p, sp)) for i, (p, sp) in enumerate(zip(prompts, params))]
        assert len(together) == 32
        assert together == alone
        assert engine.stats().generation_tokens_total == 2 * sum(len(t) for t, _, _ in alone)
    finally:
        await engine.shutdown()
