"""How the suite spreads over the cores (tests/conftest.py) and how the mutation script proves its selections pass
before mutating (scripts/mutation.py): neither may drop a test or split what must stay together."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def suite_conftest():
    """tests/conftest.py, loaded by its path: `import conftest` finds whichever conftest a run imported first."""
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mutation():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import mutation
        yield mutation
    finally:
        sys.path.remove(str(ROOT / "scripts"))


@pytest.mark.parametrize("nodeid, group", [
    ("tests/integration/realnode/test_end_to_end.py::test_x", "machine"),
    ("tests/integration/realnode/test_real_node.py::test_y[a]", "machine"),
    ("tests/integration/test_image_build.py::test_z", "tests/integration/test_image_build.py"),
    ("tests/integration/test_chart_oci.py::test_w", "machine"),
    ("tests/integration/test_operator.py::test_v", "tests/integration/test_operator.py"),
    ("tests/runtime_tests/server/test_fuzz.py::test_generated[GET /health]", "tests/runtime_tests/server/test_fuzz.py"),
])
def test_a_module_stays_on_one_worker_and_the_real_node_on_one_for_all(suite_conftest, nodeid, group):
    assert suite_conftest.group_of(nodeid) == group


def test_every_module_that_uses_the_real_node_or_the_cached_registry_is_in_the_machines_group(suite_conftest):
    users = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
             if p != Path(__file__) and any(word in p.read_text() for word in ("real_node", "oci_registry"))}
    assert users and {u for u in users if not u.startswith(suite_conftest.MACHINE_WIDE)} == set()


def test_the_real_nodes_chain_goes_out_first_though_bigger_modules_wait(suite_conftest):
    """xdist's own scheduler, given two workers and a collection where the machine's group is the smallest."""
    collection = ([f"tests/runtime_tests/test_big.py::test_{i}" for i in range(50)]
                  + [f"tests/operator_tests/test_mid.py::test_{i}" for i in range(20)]
                  + [f"tests/integration/realnode/test_end_to_end.py::test_{i}" for i in range(3)])

    class Config:
        option = type("Option", (), {"loadscopereorder": True})()

        def getvalue(self, name):
            return {"dist": "loadgroup", "tx": ["2*popen"]}[name]

    class Worker:
        def __init__(self, name):
            self.gateway = type("Gateway", (), {"id": name})()
            self.sent, self.shutting_down = [], False

        def send_runtest_some(self, indexes):
            self.sent.append([collection[i] for i in indexes])

    scheduler = suite_conftest.pytest_xdist_make_scheduler(Config(), None)
    first, second = Worker("gw0"), Worker("gw1")
    for worker in (first, second):
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    assert first.sent[0] == collection[70:]
    assert second.sent[0] == collection[:50]


def test_the_baseline_runs_hold_every_selection_a_mutation_runs(mutation):
    selections = list(dict.fromkeys(m.tests for m in mutation.MUTATIONS))
    for jobs in (1, 2, 3):
        runs = mutation.baseline_runs(selections, jobs)
        whole = {file for run in runs if "-k" not in run for file in run}
        narrowed = {run[0]: run[2] for run in runs if "-k" in run}
        assert len([run for run in runs if "-k" not in run]) <= jobs
        for tests in selections:
            if len(tests) == 1:
                assert tests[0] in whole, tests
            else:
                assert tests[0] in whole or f"({tests[2]})" in narrowed[tests[0]], tests
        assert len(runs) < len(selections)


def test_the_summary_shows_each_phase_of_the_machines_tests_once_under_its_test(suite_conftest):
    """A call report carries its setup's output too: only each phase's own is shown, and no other module's."""
    from types import SimpleNamespace

    def report(nodeid, when, duration, **sections):
        return SimpleNamespace(nodeid=nodeid, when=when, duration=duration,
                               sections=[(f"Captured stdout {w}", text) for w, text in sections.items()])

    e2e, other = "tests/integration/realnode/test_end_to_end.py::test_a", "tests/integration/test_operator.py::test_b"
    written: list[str] = []
    reporter = SimpleNamespace(
        stats={"": [report(e2e, "setup", 91.4, setup="\nimage runtime-cpu: pushed in 65 s\n"),
                    report(e2e, "teardown", 0.1, setup="\nimage runtime-cpu: pushed in 65 s\n")],
               "passed": [report(e2e, "call", 2.0, setup="\nimage runtime-cpu: pushed in 65 s\n", call="TIMINGS x"),
                          report(other, "call", 1.0, call="not the machine's")]},
        write_sep=lambda sep, title: written.append(f"== {title}"), write_line=written.append)
    suite_conftest.pytest_terminal_summary(reporter)
    assert written == ["== what the real node's tests printed", "test_a [setup, 91 s]",
                       "    image runtime-cpu: pushed in 65 s", "test_a [call, 2 s]", "    TIMINGS x"]
