"""What a mutation is: one exact text replacement in one file of the runtime or operator package, and the tests that
must fail once it is applied."""

from __future__ import annotations

from dataclasses import dataclass

PACKAGE = "runtime/neuronmodel_runtime"
OPERATOR = "operator/neuronmodel_operator"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # file under `package`
    old: str  # exact text, present exactly once
    new: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions
    package: str = PACKAGE  # the package `path` is in

    @property
    def module(self) -> str:
        return self.package.split("/")[-1] + "." + self.path.removesuffix(".py").replace("/", ".")
