"""Rules across fields of RuntimeConfig that the NeuronModel CRD checks too: each defined once, written twice.

A rule is data: the fields it relates (RuntimeConfig's dotted paths) and what must hold. `check` tests it on a
section of RuntimeConfig (the validators in model.py call it) and raises RuleViolation naming the field to fix;
`cel` writes it as the CRD's CEL rule and message (api.py attaches it to the spec section that holds the fields),
given how the spec names each field. Single-field bounds and choices are pydantic's on both sides (the operator's
tests compare them); the source grammar is sources.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Union, get_args

from neuronmodel_runtime.config.settings import named

SpeculationMode = Literal["none", "draft", "eagle", "promptLookup"]
SPECULATION_MODES: tuple[str, ...] = get_args(SpeculationMode)
#: The speculation modes that run a draft model (speculation.draft_model).
DRAFT_MODES = ("draft", "eagle")

#: How the spec names a RuntimeConfig field: dotted path -> the spec's dotted camelCase path, e.g.
#: "max_context_length" -> "batching.maxContextLength".
SpecName = Callable[[str], str]


class RuleViolation(ValueError):
    """A rule that does not hold; `field` is the RuntimeConfig field (dotted path) the message asks to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _key(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _get(section: Any, path: str) -> Any:
    return getattr(section, _key(path))


@dataclass(frozen=True)
class Ordered:
    """low <= high, two fields of one section."""

    low: str
    high: str
    low_note: str = ""  # what the field means, in the CRD's message
    high_note: str = ""

    def check(self, section: Any) -> None:
        low, high = _get(section, self.low), _get(section, self.high)
        if low > high:
            raise RuleViolation(self.low, f"{self.low} must be <= {self.high} ({low} > {high}): lower {self.low} or "
                                f"raise {self.high}")

    def cel(self, spec: SpecName) -> tuple[str, str]:
        def label(path: str, note: str) -> str:
            return spec(path) + (f" ({note})" if note else "")
        return (f"self.{_key(spec(self.low))} <= self.{_key(spec(self.high))}",
                f"{label(self.low, self.low_note)} must be <= {label(self.high, self.high_note)}")


@dataclass(frozen=True)
class Divides:
    """divisor divides dividend, two fields of one section."""

    divisor: str
    dividend: str
    note: str  # why, in both messages

    def check(self, section: Any) -> None:
        divisor, dividend = _get(section, self.divisor), _get(section, self.dividend)
        if dividend % divisor:
            raise RuleViolation(self.divisor, f"{self.divisor} must divide {self.dividend} ({self.note}): "
                                f"{dividend} is not a multiple of {divisor}; change one of them")

    def cel(self, spec: SpecName) -> tuple[str, str]:
        return (f"self.{_key(spec(self.dividend))} % self.{_key(spec(self.divisor))} == 0",
                f"{spec(self.divisor)} must divide {spec(self.dividend)} ({self.note})")


@dataclass(frozen=True)
class SetExactlyWhen:
    """`field` is set exactly when the choice `switch` is one of `values` (of `choices`)."""

    field: str
    switch: str
    values: tuple[str, ...]
    choices: tuple[str, ...]

    def check(self, section: Any) -> None:
        value, switch = _get(section, self.field), _get(section, self.switch)
        wanted = switch in self.values
        if wanted and not value:
            raise RuleViolation(self.field, f"{self.field} is required when {self.switch} is {switch!r}: set "
                                f"{named(self.field)} or choose another {self.switch}")
        if not wanted and value:
            raise RuleViolation(self.field, f"{self.field} is used by {self.switch} {' and '.join(self.values)} "
                                f"only, not {switch!r}: remove it or set {self.switch}")

    def cel(self, spec: SpecName) -> tuple[str, str]:
        field, switch = _key(spec(self.field)), _key(spec(self.switch))
        others = [choice for choice in self.choices if choice not in self.values]
        return (f"self.{switch} in {list(self.values)} ? has(self.{field}) : !has(self.{field})",
                f"{spec(self.field)} is required by {switch} {' and '.join(self.values)}, and must be absent for "
                f"{' and '.join(others)}")


Rule = Union[Ordered, Divides, SetExactlyWhen]

DRAFT_MODEL = SetExactlyWhen("speculation.draft_model", "speculation.mode", DRAFT_MODES, SPECULATION_MODES)
PROMPT_LOOKUP = Ordered("speculation.prompt_lookup_min", "speculation.prompt_lookup_max")
CONTEXT_LENGTH = Ordered("max_context_length", "max_model_len", "longest prompt", "prompt + output")
NODES = Divides("parallelism.nodes", "parallelism.tensor_parallel_degree", "each node holds TP/nodes NeuronCores")

#: Every rule (the CRD has each as a CEL rule).
RULES: tuple[Rule, ...] = (DRAFT_MODEL, PROMPT_LOOKUP, CONTEXT_LENGTH, NODES)
