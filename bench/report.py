"""`make bench`: run every benchmark of the project, collect its figures, and write docs/benchmarks.md.

Each bench (every bench/[!_]*.py but this file) runs as its own process, one after another; the JSON figure lines
it prints (bench/_harness.py's `figure` and `skipped`) are collected into bench/out/figures.jsonl as they come,
each with the bench's name, beside one `run` record per bench (ok or failed, its seconds, and a failed one's exit
status and the tail of its stderr; its whole stderr is bench/out/NAME.stderr) and one `machine` record. A bench
that fails is reported and the others still run; `--only` runs some benches and keeps the others' records from the
file's last run. The report (bench/_report_render.py) is then built from that file alone, so `--from` rebuilds it
from a saved one without running anything.

Usage: .venv/bin/python bench/report.py [--only NAME ...] [--from FIGURES.jsonl ...] [--out bench/out] [--docs docs]
       [--bench-args ARGS] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from importlib import metadata
from pathlib import Path
from typing import Iterator, Optional

from _report_render import write_report

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
STDERR_TAIL_LINES = 20


def benches(folder: Path, only: Optional[list[str]] = None) -> list[Path]:
    """The benches in `folder` (not helpers, not this report), or those of them named in `only` (with or
    without .py).

    Raises:
        SystemExit: a name in `only` is no bench.
    """
    found = {p.stem: p for p in sorted(folder.glob("[!_]*.py")) if p.name != Path(__file__).name}
    if not only:
        return list(found.values())
    unknown = [name for name in only if name.removesuffix(".py") not in found]
    if unknown:
        raise SystemExit(f"report.py: no bench {', '.join(unknown)} (benches: {', '.join(found)})")
    return [found[name.removesuffix(".py")] for name in only]


def machine() -> dict:
    """What the figures were measured on."""
    info = {"cores": os.cpu_count(), "cpu": _cpu_model(), "ram_gib": _ram_gib(), "python": platform.python_version(),
            "load_average_1m": round(os.getloadavg()[0], 2), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for package in ("torch", "transformers"):
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = None
    return info


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.machine())


def _ram_gib() -> Optional[float]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def figure_lines(lines: Iterator[str], bench: str) -> Iterator[dict]:
    """The figures among a bench's output lines, each tagged with the bench; every line is echoed as it comes."""
    for line in lines:
        print(line, end="", flush=True)
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "figure" in record:
                yield {"bench": bench, **record}


def run_bench(path: Path, out: Path, sink, timeout: float, args: tuple[str, ...] = ()) -> dict:
    """Run one bench, writing its figures to `sink` as they come; returns its `run` record. A bench still running
    after `timeout` seconds is killed, and fails."""
    name, stderr_path = path.stem, out / f"{path.stem}.stderr"
    print(f"== {path.relative_to(path.parents[1])}", flush=True)
    started = time.monotonic()
    with stderr_path.open("w") as stderr:
        # Its own process group: a kill takes the servers it started along
        proc = subprocess.Popen([sys.executable, str(path), *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr,
                                text=True, start_new_session=True)
        watchdog = threading.Timer(timeout, _kill_group, (proc,))
        watchdog.start()
        try:
            for record in figure_lines(proc.stdout, name):
                sink.write(json.dumps(record) + "\n")
                sink.flush()
            returncode = proc.wait()
        except BaseException:  # Ctrl-C: the group is out of the terminal's reach
            _kill_group(proc)
            raise
        finally:
            watchdog.cancel()
    seconds = round(time.monotonic() - started, 1)
    if returncode == 0:
        return {"run": name, "status": "ok", "seconds": seconds}
    if seconds >= timeout:
        returncode = f"killed after {timeout:.0f} s"
    with stderr_path.open() as stderr:
        tail = "".join(deque(stderr, STDERR_TAIL_LINES))
    print(f"== {name} FAILED ({returncode}); the tail of its stderr:\n{tail}", file=sys.stderr, flush=True)
    return {"run": name, "status": "failed", "seconds": seconds, "returncode": returncode, "stderr_tail": tail}


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_all(paths: list[Path], out: Path, timeout: float, args: tuple[str, ...] = ()) -> Path:
    """Run the benches one after another into OUT/figures.jsonl; returns its path. The records of benches that
    did not run this time (`--only`) are kept from the file's last run, after the new ones."""
    out.mkdir(parents=True, exist_ok=True)
    figures = out / "figures.jsonl"
    names = {path.stem for path in paths}
    kept = [r for r in read_records(figures) if r.get("bench", r.get("run")) not in names | {None}] \
        if figures.exists() else []
    with figures.open("w") as sink:
        sink.write(json.dumps({"machine": machine()}) + "\n")
        for path in paths:
            sink.write(json.dumps(run_bench(path, out, sink, timeout, args)) + "\n")
            sink.flush()
        sink.writelines(json.dumps(r) + "\n" for r in kept)
    return figures


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these benches only (serving, concurrency ...)")
    parser.add_argument("--from", dest="sources", type=Path, nargs="+", metavar="FIGURES",
                        help="rebuild the report from these figures.jsonl files (bench/gpu.sh's too); run nothing")
    parser.add_argument("--out", type=Path, default=BENCH / "out", help="figures.jsonl and the benches' stderr")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where benchmarks.md and benchmarks/ go")
    parser.add_argument("--bench-dir", type=Path, default=BENCH, help=argparse.SUPPRESS)  # the tests' fake benches
    parser.add_argument("--bench-args", default="", help="arguments for each bench run, as one string (with --only: "
                        "--only concurrency --bench-args=--quick)")
    parser.add_argument("--timeout", type=float, default=3 * 3600, help="seconds one bench may run (3 h)")
    args = parser.parse_args(argv)
    ran = [] if args.sources else benches(args.bench_dir, args.only)
    sources = args.sources or [run_all(ran, args.out, args.timeout, tuple(shlex.split(args.bench_args)))]
    records = [record for path in sources for record in read_records(path)]
    report = write_report(records, args.docs)
    print(f"report: {report} (from {', '.join(map(str, sources))})", flush=True)
    failed = {r["run"] for r in records if r.get("status") == "failed"} & {path.stem for path in ran}
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
