"""Mutation testing of the sampling and speculative-verification math, and of the operator's subtle rules (the
scale subresource, status, compile gating, HPA ownership, reconcile under change, placement): each known mistake
must fail the tests.

For every mutation in scripts/mutations/, the script copies the repository's runtime and operator packages and their
tests into a temporary directory, applies the mutation as an exact text replacement (it stops at once, naming the
mutation, when the target text is not found exactly once, so the list cannot rot silently), runs only the test files
that mutation needs against the mutated copy, and requires that run to FAIL. Every selection of tests the mutations
run must pass on the unmutated code first, in the copies: `--suite-passed` skips that proof where the full suite has
just passed on this tree (`make test` runs the mutations after it: the proof re-ran ~4 minutes of those tests). Each
pytest run is a process forked from a fork server that has imported the heavy third-party modules once (PRELOAD)
and none of ours; it asserts, before collecting, that `neuronmodel_runtime` is imported from the copy and that the
imported module holds the mutated text; bytecode is never written, so no stale cache can hide a mutation.

Prints one line per mutation ("caught" / "NOT CAUGHT" / "ERROR") and exits non-zero if any mutation survives, any run
errors, or the unmutated run fails. Runs go on one worker per CPU core (`-j`), each worker on its own copy with torch's
threads split between them; each mutated run stops at its first failure.

Usage: python scripts/mutation.py [--only NAME_SUBSTRING] [-j JOBS] [--suite-passed] [-v]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import multiprocessing
import os
import queue
import shutil
import sys
import tempfile
import time
from pathlib import Path

from mutations import MUTATIONS, Mutation  # scripts/mutations/, beside this file

REPO = Path(__file__).resolve().parents[1]


#: Runs pytest in the copy after checking that the copy (and the mutated text) is what gets imported.
BOOT = """
import importlib, sys
root, module, needle, *args = sys.argv[1:]


def refuse(message):
    print("mutation.py:", message, file=sys.stderr)
    sys.exit(10)  # not a pytest exit status: never read as "tests failed"


sys.path[:0] = [root + "/runtime", root + "/operator"]
try:
    import neuronmodel_runtime, neuronmodel_operator
    mod = importlib.import_module(module) if module else None
except Exception as exc:
    refuse(f"importing the copy failed: {type(exc).__name__}: {exc}")
for package in (neuronmodel_runtime, neuronmodel_operator):
    if not package.__file__.startswith(root):
        refuse(f"{package.__name__} imported from {package.__file__}, not from the copy in {root}")
if mod is not None and (not mod.__file__.startswith(root) or needle not in open(mod.__file__).read()):
    refuse(f"{module} ({mod.__file__}) is not the mutated copy")
import pytest
sys.exit(pytest.main(args))
"""


#: What a mutation may change (copied, no bytecode); everything else in the repository but its hidden entries (.git,
#: the venvs, hypothesis' example database: mutated runs must not save their failures there) is linked into the copy,
#: so a test finds each file it reads where the suite found it (the suite's pass stands for the copy's).
COPIED = ("runtime", "operator", "tests/runtime_tests", "tests/operator_tests")


def make_copy(root: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in COPIED:
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    for entry in (*REPO.iterdir(), *(REPO / "tests").iterdir()):
        relative = entry.relative_to(REPO)
        copied = any(str(relative) == c or c.startswith(f"{relative}/") for c in COPIED)
        if not (copied or entry.name.startswith(".") or entry.name == "__pycache__"):
            (root / relative).symlink_to(entry)


def check_targets(mutations: list[Mutation]) -> None:
    """Every mutation's text occurs exactly once in the repository's current source; stop loudly otherwise."""
    for m in mutations:
        source = (REPO / m.package / m.path).read_text()
        count = source.count(m.old)
        if count != 1:
            sys.exit(f"mutation {m.name!r}: its target text occurs {count} times in {m.package}/{m.path} (expected "
                     f"once); update scripts/mutations/ to the current code:\n    {m.old}")


#: Every pytest run is a process this fork server forks.
FORKS = multiprocessing.get_context("forkserver")
#: What the fork server imports once, so that each pytest run it forks starts with them loaded (torch alone takes
#: seconds to import, and there are ~130 runs): third-party modules only; each run imports our packages from its own
#: copy, which BOOT checks. A module missing here is skipped by multiprocessing, never an error.
PRELOAD = ["torch", "numpy", "transformers", "safetensors", "pydantic", "fastapi", "starlette", "httpx", "kopf",
           "kubernetes", "yaml", "hypothesis", "pytest", "_pytest.python", "pytest_asyncio"]


def _pytest_in_copy(argv: list[str], env: dict[str, str], root: str, log: str) -> None:
    """One run, in a process forked from the fork server: its output into `log`, the copy as its directory and
    PYTHONPATH (subprocesses the tests start import the copy too), no bytecode, then BOOT, which exits."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.chdir(root)
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = True
    sys.argv = argv
    exec(compile(BOOT, "<mutation.py BOOT>", "exec"), {"__name__": "__main__"})


def run_tests(root: Path, tests: tuple[str, ...], mutation: Mutation | None, verbose: bool) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": f"{root / 'runtime'}:{root / 'operator'}"}
    module, needle = (mutation.module, mutation.new) if mutation else ("", "")
    argv = ["BOOT", str(root), module, needle, "-q", "-x", "-p", "no:cacheprovider", "--rootdir", str(root), *tests]
    start = time.monotonic()
    with tempfile.NamedTemporaryFile(prefix="pytest-", suffix=".log", dir=root.parent) as log:
        proc = FORKS.Process(target=_pytest_in_copy, args=(argv, env, str(root), log.name))
        proc.start()
        proc.join()
        output = Path(log.name).read_text(errors="replace")
    if verbose:
        print(output[-4000:])
    return proc.exitcode, output, time.monotonic() - start


class Copies:
    """One copy of the sources per worker: a mutation is applied to a worker's own copy, run, then undone."""

    def __init__(self, tmp: Path, workers: int):
        self.free: queue.Queue[Path] = queue.Queue()
        for i in range(workers):
            root = tmp / f"copy{i}"
            root.mkdir()
            make_copy(root)
            self.free.put(root)

    @contextlib.contextmanager
    def take(self):
        root = self.free.get()
        try:
            yield root
        finally:
            self.free.put(root)


def mutated_run(copies: Copies, m: Mutation, verbose: bool) -> tuple[int, str, float]:
    with copies.take() as root:
        target = root / m.package / m.path
        original = target.read_text()
        target.write_text(original.replace(m.old, m.new, 1))
        try:
            return run_tests(root, m.tests, m, verbose)
        finally:
            target.write_text(original)


def unmutated_run(copies: Copies, tests: tuple[str, ...], verbose: bool) -> tuple[int, str, float]:
    with copies.take() as root:
        return run_tests(root, tests, None, verbose)


def baseline_runs(selections: list[tuple[str, ...]], jobs: int) -> list[tuple[str, ...]]:
    """Few pytest runs whose passing proves every selection passes on the unmutated code (each run's start, torch's
    import, costs seconds): the files some selection takes whole, in one run per worker; every other file alone, with
    its selections' `-k` expressions or'ed. A run holds each selection's tests, and maybe more, never fewer."""
    whole = list(dict.fromkeys(tests[0] for tests in selections if len(tests) == 1))
    narrowed: dict[str, list[str]] = {}
    for tests in selections:
        if len(tests) != 1 and tests[0] not in whole:
            file, flag, expression = tests
            assert flag == "-k", tests
            narrowed.setdefault(file, []).append(f"({expression})")
    return [tuple(whole[i::jobs]) for i in range(min(jobs, len(whole)))] + [
        (file, "-k", " or ".join(dict.fromkeys(expressions))) for file, expressions in narrowed.items()]


def verdict_of(m: Mutation, rc: int, output: str) -> tuple[str, bool, str]:
    """("caught" / "NOT CAUGHT" / "ERROR (rc)", whether that fails the script, the first failed test)."""
    if rc == 1:  # pytest: some tests failed
        failed_tests = [line.split()[1] for line in output.splitlines() if line.startswith("FAILED ")]
        return "caught     ", False, f" by {failed_tests[0].split('/')[-1]}" if failed_tests else ""
    if rc == 0:
        return "NOT CAUGHT ", True, ""
    return f"ERROR ({rc})  ", True, ""  # collection error, crash, or the import check above


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the mutations whose name contains this text")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the tail of every pytest run")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="pytest processes at once, each on its own copy (default: one per CPU core)")
    parser.add_argument("--suite-passed", action="store_true",
                        help="the full suite just passed on this tree: skip re-running the selections unmutated")
    opts = parser.parse_args()
    mutations = [m for m in MUTATIONS if not opts.only or opts.only in m.name]
    check_targets(MUTATIONS)
    started = time.monotonic()
    jobs = max(1, opts.jobs)
    if jobs > 1:  # torch's intra-op pool, split between the workers: set before the fork server imports torch
        threads = str(max(1, (os.cpu_count() or 1) // jobs))
        os.environ |= {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    FORKS.set_forkserver_preload(PRELOAD)
    failed = False
    with tempfile.TemporaryDirectory(prefix="neuronmodel-mutation-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        copies = Copies(Path(tmp), jobs)
        # the unmutated code passes every test a mutation runs
        selections = list(dict.fromkeys(m.tests for m in mutations))
        baseline = [] if opts.suite_passed else baseline_runs(selections, jobs)
        runs = pool.map(lambda tests: unmutated_run(copies, tests, opts.verbose), baseline)
        seconds = 0.0
        for tests, (rc, output, took) in zip(baseline, runs):
            seconds += took
            if rc != 0:
                print(output[-4000:])
                print(f"unmutated run of {' '.join(tests)} FAILED (exit {rc}) [{took:.0f}s]: fix the tests "
                      "before mutating")
                return 1
        if baseline:
            print(f"passes      unmutated code ({len(selections)} test selections in {len(baseline)} runs) "
                  f"[{seconds:.0f}s]", flush=True)
        else:
            print(f"passed      unmutated code: the full suite, just before ({len(selections)} test selections)",
                  flush=True)
        results = pool.map(lambda m: mutated_run(copies, m, opts.verbose), mutations)
        for m, (rc, output, took) in zip(mutations, results):  # in the list's order, as each finishes
            verdict, bad, by = verdict_of(m, rc, output)
            failed |= bad
            if verdict.startswith("ERROR"):
                print(output[-4000:])
            print(f"{verdict} {m.name}{by} [{took:.0f}s]", flush=True)
    print(f"{len(mutations)} mutations in {time.monotonic() - started:.0f}s on {jobs} worker(s): "
          + ("some mutations survived or errored" if failed else "all caught"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
