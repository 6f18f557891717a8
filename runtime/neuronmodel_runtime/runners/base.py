"""The runner contract: what every model runner (reference, NxDI, TNx) implements.

Neuron compiles fixed shapes, so the contract is built around a fixed number of batch *slots*
(`max_num_seqs`), each owning one KV-cache line, as NxDI continuous batching does with `seq_ids`.
A runner samples on its device ("on-device sampling") and returns token ids, never full logits, unless
logprobs are asked for. Beside its capacity a runner declares its capabilities: what its sampler honours per
request (the server refuses the rest at admission, naming the runner and the fix) and how it speculates:

- scored: the engine proposes (prompt lookup, or a draft model the runner loaded: `draft_model()`), the runner
  scores the k+1 positions (`score()`), and the engine verifies with `spec_decode.verify` on the runner's
  per-slot generators (`slot_generators()`);
- fused: `decode()` proposes and verifies on the device itself (NxDI's fused speculation, EAGLE) and returns
  1..k+1 tokens per row.

This module is pure data plus the ABC; it imports no torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from neuronmodel_runtime.sampling.params import RowSampling, SamplingCapabilities


@dataclass(frozen=True)
class RunnerCapacity:
    """The compiled (or configured) limits of a loaded runner."""

    max_num_seqs: int  # batch slots, numbered 0..max_num_seqs-1
    max_context_length: int  # longest prompt one prefill accepts, in tokens
    max_model_len: int  # longest sequence (prompt + output) one slot holds, in tokens
    speculation_length: int = 0  # k: a decode step may return up to k+1 tokens per slot; 0 = no speculation
    vocab_size: int = 0  # size of the output vocabulary


@dataclass(frozen=True)
class RunnerCapabilities:
    """What a loaded runner can do, beyond its capacity; checked at startup (config) and admission (requests)."""

    sampling: SamplingCapabilities  # per-request sampling features, largest top_k, top-p rule
    host_drafts: bool = False  # score() takes drafts proposed on the host (prompt lookup, our draft proposer)
    fused_speculation: tuple[str, ...] = ()  # speculation modes decode() runs on the device itself ("draft", "eagle")
    per_row_speculation_length: bool = True  # False: compiled for one k, a row speculates k tokens or none

    def info(self) -> dict[str, Any]:
        """For /v1/info."""
        s = self.sampling
        return {
            "max_top_k": s.max_top_k, "top_p_rule": s.top_p_rule, "sampled": s.sampled, "seeds": s.seeds,
            "logprobs": s.logprobs,
            "penalties": s.penalties, "logit_bias": s.logit_bias, "stop_token_masking": s.stop_token_masking,
            "host_drafts": self.host_drafts, "fused_speculation": list(self.fused_speculation),
            "per_row_speculation_length": self.per_row_speculation_length,
        }


@dataclass
class PrefillBatch:
    """New sequences entering their slots. Row i of every list belongs to the same sequence."""

    slots: list[int]  # KV-cache line of each row; the runner resets that line
    prompt_ids: list[list[int]]  # full prompt of each row (1..max_context_length tokens)
    sampling: list[RowSampling]  # per-row sampling; `seed` (re)seeds the slot's generator
    num_logprobs: list[Optional[int]] = field(default_factory=list)  # per row: top logprobs wanted, None = none


@dataclass
class DecodeBatch:
    """Running sequences advancing by one step (1..k+1 tokens each with speculation)."""

    slots: list[int]  # KV-cache line of each row (distinct)
    last_tokens: list[int]  # newest token of each row, not yet in the KV cache
    positions: list[int]  # position of last_tokens[i] == tokens of that row already in the KV cache
    sampling: list[RowSampling]  # per-row sampling (the seed is ignored: the slot's generator continues)
    # Fused speculation only (empty otherwise): per row, draft tokens to propose on the device, 0..k.
    num_spec_tokens: list[int] = field(default_factory=list)
    num_logprobs: list[Optional[int]] = field(default_factory=list)  # per row: top logprobs wanted, None = none


@dataclass
class ScoreBatch:
    """Scored speculation: each row feeds its last token and its drafts, and gets the target's logits back."""

    slots: list[int]  # KV-cache line of each row (distinct)
    last_tokens: list[int]  # newest token of each row, not yet in the KV cache
    positions: list[int]  # position of last_tokens[i]
    draft_tokens: list[list[int]]  # per row: k_i >= 1 proposed tokens, fed after the last token


@dataclass
class TokenLogprob:
    """Log-probability of one generated token and the most likely alternatives at its position."""

    logprob: float  # of the chosen token, under the sampling distribution's source logits (log_softmax)
    top: dict[int, float]  # token id -> logprob of the top-N tokens at that position


@dataclass
class StepOutput:
    """What a prefill or decode returns: new token ids per row, in the batch's row order."""

    token_ids: list[list[int]]  # per row: 1..k+1 new tokens (exactly 1 for prefill and plain decode)
    logprobs: Optional[list[Optional[list[TokenLogprob]]]] = None  # per row, aligned with token_ids, when asked
    num_draft_tokens: Optional[list[int]] = None  # per row: draft tokens proposed this step (speculation only)


class RunnerError(RuntimeError):
    """A runner cannot be built or loaded; the message says what to change."""


def check_slots(slots: Sequence[int], max_num_seqs: int) -> None:
    """A step's slots are distinct and in [0, max_num_seqs) (the engine's contract; a bug otherwise).

    Raises:
        ValueError: naming the slots.
    """
    if len(set(slots)) != len(slots) or not all(0 <= s < max_num_seqs for s in slots):
        raise ValueError(f"slots {list(slots)} must be distinct and in [0, {max_num_seqs})")


class ModelRunner(ABC):
    """A model behind fixed slots. Implementations: torch_reference (CPU/GPU), neuron_nxdi, neuron_tnx.

    Call order: `load()` once, then any sequence of `prefill` / `decode` / `release` from one thread.
    """

    #: Framework name reported in /v1/info and metrics: "torch", "nxdi" or "tnx".
    framework: str = ""
    #: After load() or compile(): the compiled artifacts (`artifacts.prepare.Artifacts`), None if it compiles nothing.
    artifacts: Any = None

    @abstractmethod
    def load(self) -> None:
        """Load (and compile, for Neuron) the model; heavy, called once before serving."""

    def compile(self) -> Any:
        """`neuronmodel-runtime compile` (the compile Job): make this config's compiled artifacts exist, locally and
        in compile_cache.url, and return them (None: this runner compiles nothing). The default loads, for runners
        that compile only while loading; a runner that can compile without its devices overrides it."""
        self.load()
        return self.artifacts

    @abstractmethod
    def capacity(self) -> RunnerCapacity:
        """The limits the engine must respect."""

    @abstractmethod
    def capabilities(self) -> RunnerCapabilities:
        """What the runner honours; valid after load()."""

    @abstractmethod
    def prefill(self, batch: PrefillBatch) -> StepOutput:
        """Encode each prompt into its slot's KV line and sample the first token of each row."""

    @abstractmethod
    def decode(self, batch: DecodeBatch) -> StepOutput:
        """Feed each row's last token at its position, sample 1 (or up to k+1 with speculation) tokens."""

    def score(self, batch: ScoreBatch) -> Any:
        """Scored speculation (`host_drafts`): write the fed tokens' K/V and return the target's logits at every
        fed position, `[B, k+1, V]` (k = the longest row; shorter rows' extra positions are unused), on the
        device the runner samples on."""
        raise NotImplementedError(f"the {self.framework} runner does not score host-proposed drafts")

    def slot_generators(self, slots: Sequence[int]) -> list[Any]:
        """Scored speculation: each slot's random generator (seeded at prefill), for the verifier's draws."""
        raise NotImplementedError(f"the {self.framework} runner does not expose its generators")

    def draft_model(self) -> Any:
        """Scored draft-model speculation: the loaded draft model (a `spec_decode.draft.SlotModel`)."""
        raise NotImplementedError(f"the {self.framework} runner loads no draft model for scored speculation")

    def release(self, slot: int) -> None:
        """The sequence in `slot` finished or was aborted; drop per-slot state (its generator)."""

    def info(self) -> dict[str, Any]:
        """Runner facts for /v1/info: framework, versions, device, dtype."""
        return {"framework": self.framework}

    def shutdown(self) -> None:
        """Free devices and worker processes."""
