"""Test doubles for the engine: a byte-level tokenizer and a deterministic runner that honours the contract."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from neuronmodel_runtime.runners.base import (
    DecodeBatch,
    ModelRunner,
    PrefillBatch,
    RunnerCapabilities,
    RunnerCapacity,
    StepOutput,
)
from neuronmodel_runtime.sampling.params import SamplingCapabilities

EOS = 256  # the first id past the 256 byte tokens; special, so decode skips it


class ByteTokenizer:
    """Token i < 256 is byte i; ids >= 256 are special tokens (skipped). Multi-byte UTF-8 spans tokens."""

    eos_token_id = EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def decode_single_token_bytes(self, token_id: int) -> bytes:
        """A token's raw bytes (tiktoken's name, which server.tokenizer.token_bytes uses)."""
        return bytes([token_id]) if token_id < 256 else b""


class ScriptedRunner(ModelRunner):
    """Next token of a slot = script(prompt_ids, output_so_far); records every call for assertions."""

    framework = "fake"

    def __init__(self, script: Callable[[list[int], list[int]], int], slots: int = 4, max_model_len: int = 64,
                 max_context_length: Optional[int] = None, fail_on: Optional[Callable[[int], bool]] = None,
                 spec_k: int = 0, fixed_k: bool = False):
        self.script = script
        self.cap = RunnerCapacity(slots, max_context_length or max_model_len, max_model_len, spec_k, 257)
        self.fixed_k = fixed_k  # speculation compiled for one k (NxDI): a row speculates spec_k tokens or none
        self.spec_calls: list[list[int]] = []  # num_spec_tokens per decode
        self.seqs: dict[int, tuple[list[int], list[int]]] = {}  # slot -> (prompt, outputs)
        self.calls: list[tuple[str, list[int]]] = []  # (kind, slots)
        self.released: list[int] = []
        self.fail_on = fail_on  # slot -> raise during a step that includes it

    def load(self) -> None:
        pass

    def capacity(self) -> RunnerCapacity:
        return self.cap

    def capabilities(self) -> RunnerCapabilities:
        """Fused speculation of any k per row (a perfect proposer), and a sampler that honours everything."""
        sampling = SamplingCapabilities("scripted", max_top_k=256, top_p_rule="keep", logprobs=True, penalties=True,
                                        logit_bias=True, stop_token_masking=True)
        return RunnerCapabilities(sampling, fused_speculation=("draft",) if self.cap.speculation_length else (),
                                  per_row_speculation_length=not self.fixed_k)

    def _check(self, slots: list[int]) -> None:
        assert len(set(slots)) == len(slots) and all(0 <= s < self.cap.max_num_seqs for s in slots)
        if self.fail_on and any(self.fail_on(s) for s in slots):
            raise RuntimeError("injected failure")

    def prefill(self, batch: PrefillBatch) -> StepOutput:
        self._check(batch.slots)
        self.calls.append(("prefill", list(batch.slots)))
        out = []
        for slot, prompt in zip(batch.slots, batch.prompt_ids):
            assert len(prompt) <= self.cap.max_context_length
            token = self.script(prompt, [])
            self.seqs[slot] = (list(prompt), [token])
            out.append([token])
        return StepOutput(out)

    def decode(self, batch: DecodeBatch) -> StepOutput:
        self._check(batch.slots)
        self.calls.append(("decode", list(batch.slots)))
        self.spec_calls.append(list(batch.num_spec_tokens))
        assert not self.fixed_k or set(batch.num_spec_tokens) <= {self.cap.speculation_length}
        out = []
        for i, (slot, last, pos) in enumerate(zip(batch.slots, batch.last_tokens, batch.positions)):
            prompt, outputs = self.seqs[slot]
            assert last == outputs[-1] and pos == len(prompt) + len(outputs) - 1, "engine fed a wrong token/position"
            k = batch.num_spec_tokens[i] if batch.num_spec_tokens else 0
            assert pos + k < self.cap.max_model_len, "speculation would write past max_model_len"
            # A perfect proposer: every draft is accepted, so the step returns k + 1 tokens.
            new = []
            for _ in range(k + 1):
                new.append(self.script(prompt, outputs))
                outputs.append(new[-1])
            out.append(new)
        drafts = list(batch.num_spec_tokens) if self.cap.speculation_length else None
        return StepOutput(out, num_draft_tokens=drafts)

    def release(self, slot: int) -> None:
        self.released.append(slot)
        self.seqs.pop(slot, None)


def text_script(text: str, then: int = EOS) -> Callable[[list[int], list[int]], int]:
    """Generates the UTF-8 bytes of `text`, then `then` forever."""
    data = list(text.encode("utf-8"))
    return lambda prompt, outputs: data[len(outputs)] if len(outputs) < len(data) else then
