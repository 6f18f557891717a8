"""How `make test` spreads the suite over the machine's cores (pytest-xdist: `-n N --dist loadgroup`).

Each test module stays on one worker, so its module-scoped fixtures (an operator process, a Ready model) start
once; each worker has its own session fixtures (a control plane on free ports, its own data dirs). What exists once
per machine runs on one worker: the real node (its kubelet, containerd, CNI bridge and iptables rules) and the tests
of the OCI registry whose storage is the machine's cache (a second session gets an empty one, and pushes again).
Image builds, wherever they run, take `images.tools.machine_lock`, so one worker's build waits for the other's.

The groups are computed from the test's path by the scheduler itself: xdist 3.8's `xdist_group` marker no longer
reaches its scheduler under pytest 9.2 (it renames `item._nodeid`, which pytest 9.2 no longer reads).
"""

from __future__ import annotations

import pytest

#: Test paths (prefixes of node ids) whose tests share one worker: they use what the machine has once.
MACHINE_WIDE = ("tests/integration/realnode/", "tests/integration/test_chart_oci.py")
MACHINE_GROUP = "machine"


def group_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the machine's group."""
    path = nodeid.split("::", 1)[0]
    return MACHINE_GROUP if path.startswith(MACHINE_WIDE) else path


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup` with `group_of` as the groups (xdist's own scheduler of scopes, unchanged otherwise)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleAndMachine(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            """The machine's group goes out first. xdist hands out the groups with the most tests first; the real
            node's 35 tests came after many bigger modules, yet they are the suite's longest chain (one after
            another, about half of the main suite's time in cold runs), so starting them late made the suite's
            tail a lone worker."""
            if MACHINE_GROUP in self.workqueue:
                self.workqueue.move_to_end(MACHINE_GROUP, last=False)
            super()._assign_work_unit(node)

    return ByModuleAndMachine(config, log)


def pytest_terminal_summary(terminalreporter) -> None:
    """What the machine group's tests printed (image pushes, pods Ready, compile Jobs, TIMINGS lines), each phase's
    under its test, phase and seconds: they run one after another on one worker, the suite's longest chain, and
    `-q` under xdist shows none of their output."""
    printed = [(report, text) for reports in terminalreporter.stats.values() for report in reports
               if group_of(getattr(report, "nodeid", "")) == MACHINE_GROUP and getattr(report, "when", None)
               for text in [dict(report.sections).get(f"Captured stdout {report.when}", "").strip()] if text]
    if printed:
        terminalreporter.write_sep("=", "what the real node's tests printed")
        for report, text in printed:
            terminalreporter.write_line(f"{report.nodeid.split('::')[-1]} [{report.when}, {report.duration:.0f} s]")
            for line in text.splitlines():
                if line.strip():
                    terminalreporter.write_line(f"    {line[:300]}")
