"""docs/benchmarks.md and its plots, from the records of bench/out/figures.jsonl (bench/report.py writes them).

Records: {"machine": {...}} once per file (bench/gpu.sh's has its own); {"run": NAME, "status": "ok" | "failed",
...} per bench; and the figures, each {"bench", "figure", "value", "goal", ...extras} or, for one that could not be
measured, "value": null with "skipped": the reason.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Optional

#: A Neuron decode step: NxDI's published Llama-3.3-70B on trn2 with fused speculation, about 5 ms.
NEURON_STEP_MS = 5.0
SWEEP = "concurrency_tok_s"
PLOTS = {"throughput": "concurrency_throughput.png", "latency": "concurrency_latency.png"}
_GOAL = re.compile(r"^\s*(>=|<=|>|<|==)\s*(-?[\d.]+)\s*$")
_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
        "==": lambda a, b: a == b}
_HIDDEN = {"bench", "figure", "value", "goal", "skipped"}
_SAME_MACHINE = ("cores", "cpu", "ram_gib", "gpu", "python", "torch", "transformers", "small")


def write_report(records: list[dict], docs: Path) -> Path:
    """Write docs/benchmarks.md and docs/benchmarks/*.png; returns the markdown's path."""
    figures = [r for r in records if "figure" in r]
    plots = docs / "benchmarks"
    plots.mkdir(parents=True, exist_ok=True)
    sweep = sweep_table(figures)
    drawn = draw_sweep(sweep, plots) if sweep else []
    machines = distinct_machines([r["machine"] for r in records if "machine" in r])
    runs = [r for r in records if "run" in r]
    text = "\n".join(["# Benchmarks", "", _intro(machines[0] if machines else {}), "", *machine_section(machines), "",
                      *host_section(figures), "", *sweep_section(sweep, skipped_servers(figures), drawn), "",
                      *figures_section(figures), "", *runs_section(runs), ""])
    path = docs / "benchmarks.md"
    path.write_text(text)
    return path


def _intro(machine: dict) -> str:
    return _prose(f"Written by `make bench` (`bench/report.py`) on {machine.get('date', 'an unknown date')}: every "
            "`bench/*.py` ran as its own process, and each figure below is one JSON line it printed, collected in "
            "`bench/out/figures.jsonl`. `python bench/report.py --from bench/out/figures.jsonl` rebuilds this page "
            "from that file; `--only NAME` runs some benches only. Ratios are measured side by side in one run, so "
            "that the machine's load hits both sides alike; absolute numbers depend on that load.")


def distinct_machines(machines: list[dict]) -> list[dict]:
    """The first record of each machine (the same hardware and software: files of several runs on one machine)."""
    out: dict[tuple, dict] = {}
    for m in machines:
        out.setdefault(tuple(m.get(key) for key in _SAME_MACHINE), m)
    return list(out.values())


def machine_section(machines: list[dict]) -> list[str]:
    """One column per machine the figures come from (the benches' own, and bench/gpu.sh's where its figures were
    added)."""
    if not machines:
        return ["## Machine", "", "Not recorded."]
    rows = [("cores", "cores"), ("CPU", "cpu"), ("RAM (GiB)", "ram_gib"), ("GPU", "gpu"), ("Python", "python"),
            ("torch", "torch"), ("transformers", "transformers"), ("load average (1 min) at the start",
                                                                   "load_average_1m"), ("date", "date")]
    rows = [(title, key) for title, key in rows if any(m.get(key) is not None for m in machines)]
    return ["## Machine", "", "| |" + " |" * len(machines), "|---" * (len(machines) + 1) + "|",
            *(f"| {title} | " + " | ".join(cell(m.get(key)) for m in machines) + " |" for title, key in rows)]


def goal_met(value: Optional[float], goal: str) -> str:
    """'yes' / 'no' for a goal of the form `>= 1.5` (and <=, >, <, ==), '' for any other or no value."""
    match = _GOAL.match(goal or "")
    if value is None or not match:
        return ""
    return "yes" if _OPS[match.group(1)](value, float(match.group(2))) else "no"


def host_section(figures: list[dict]) -> list[str]:
    """The host's cost per engine step at Neuron speed, set against a Neuron decode step."""
    head = ["## The host's cost per step, against a Neuron step", ""]
    host = next((f for f in figures if f["figure"] == "host_ms_per_step_b64" and f.get("value") is not None), None)
    if host is None:
        return head + ["Not measured in this run (`host_ms_per_step_b64`, `bench/serving.py`)."]
    ms = host["value"]
    return head + [_prose(
        f"On Neuron a 70B decode step with fused speculation takes about {NEURON_STEP_MS:g} ms (NxDI's published "
        "Llama-3.3-70B figures on trn2), so the host's work per step must be small beside it. "
        f"`host_ms_per_step_b64` (`bench/serving.py`: the server's CPU per engine step with 64 streaming clients, "
        "around a runner that computes nothing and takes 5 ms a step) measured "
        f"**{ms:.2f} ms** per step: {ms / NEURON_STEP_MS:.0%} of a Neuron step (goal {host.get('goal', '')} ms). "
        f"Where the host's work does not overlap the device's, a step takes {NEURON_STEP_MS + ms:.2f} ms instead of "
        f"{NEURON_STEP_MS:g}: {ms / (NEURON_STEP_MS + ms):.0%} of the device's throughput lost to the host.")]


def sweep_table(figures: list[dict]) -> dict[str, dict[int, dict]]:
    """server -> concurrency -> its `concurrency_tok_s` figure (the last one, where a run measured one twice)."""
    out: dict[str, dict[int, dict]] = {}
    for f in figures:
        if f["figure"] == SWEEP and f.get("value") is not None:
            out.setdefault(f["server"], {})[int(f["concurrency"])] = f
    return out


def skipped_servers(figures: list[dict]) -> dict[str, str]:
    return {f.get("server", "?"): f["skipped"] for f in figures if f["figure"] == SWEEP and f.get("skipped")}


def sweep_section(sweep: dict[str, dict[int, dict]], skipped: dict[str, str], plots: list[Path]) -> list[str]:
    head = ["## Throughput and latency against concurrency", "", _prose(
            "`bench/concurrency.py`: C clients each send streaming greedy chat requests back to back, the same "
            "client, model and requests for every server (ours: the torch reference runner, eager as `make run` "
            "serves it; the compiled runner is `server_over_runner_compiled` and `ours_over_vllm_compiled` below; "
            "`transformers serve --continuous-batching`; vLLM's CPU build). Tokens are those each server reports "
            "in its usage chunk; TTFT runs to the first chunk with content; the per-token latency is a request's "
            "time after its first token over its remaining tokens. On a machine busy with other work (the load average "
            "above), torch's threads (ours, transformers) wait on each other and lose far more than vLLM, whose model "
            "runs on one core it binds: compare on a quiet machine."), ""]
    lines = head + [f"- **{server}: skipped**: {reason}" for server, reason in skipped.items()]
    if not sweep:
        return lines + ["", "Not measured in this run."]
    servers = list(sweep)
    levels = sorted({c for by in sweep.values() for c in by})
    columns = [("tokens/s", lambda f: f["value"]), ("TTFT p50 (ms)", lambda f: f.get("ttft_p50_ms")),
               ("TTFT p99 (ms)", lambda f: f.get("ttft_p99_ms")),
               ("per-token p50 (ms)", lambda f: f.get("per_token_p50_ms"))]
    for title, get in columns:
        lines += ["", f"{title}:", "", "| concurrency | " + " | ".join(servers) + " |",
                  "|---" * (len(servers) + 1) + "|"]
        lines += [f"| {c} | " + " | ".join(cell(get(sweep[s][c])) if c in sweep[s] else "-" for s in servers) + " |"
                  for c in levels]
    peers = [s for s in servers if s != "ours"]
    if "ours" in sweep and peers:
        lines += ["", "Ours over each peer (tokens/s):", "", "| concurrency | " +
                  " | ".join(f"ours / {p}" for p in peers) + " |", "|---" * (len(peers) + 1) + "|"]
        lines += [f"| {c} | " + " | ".join(_ratio(sweep, p, c) for p in peers) + " |" for c in levels]
    lines += [""] + [f"![{path.stem}](benchmarks/{path.name})" for path in plots]
    return lines


def _ratio(sweep: dict[str, dict[int, dict]], peer: str, clients: int) -> str:
    ours, theirs = sweep["ours"].get(clients), sweep[peer].get(clients)
    return f"{ours['value'] / theirs['value']:.2f}" if ours and theirs and theirs["value"] else "-"


def draw_sweep(sweep: dict[str, dict[int, dict]], folder: Path) -> list[Path]:
    """Two small PNGs, one line per server: tokens/s against concurrency; TTFT p50 and per-token p50 against it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    throughput, latency = folder / PLOTS["throughput"], folder / PLOTS["latency"]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=80)
    for server, by in sweep.items():
        levels = sorted(by)
        ax.plot(levels, [by[c]["value"] for c in levels], marker="o", label=server)
    levels = sorted({c for by in sweep.values() for c in by})
    _axes(ax, levels, "tokens/s", "Throughput")
    fig.tight_layout()
    fig.savefig(throughput)
    plt.close(fig)
    fig, (ttft, per_token) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=80)
    for server, by in sweep.items():
        levels = sorted(by)
        ttft.plot(levels, [by[c].get("ttft_p50_ms") for c in levels], marker="o", label=server)
        per_token.plot(levels, [by[c].get("per_token_p50_ms") for c in levels], marker="o", label=server)
    levels = sorted({c for by in sweep.values() for c in by})
    _axes(ttft, levels, "ms", "TTFT p50")
    _axes(per_token, levels, "ms", "Per-token latency p50")
    fig.tight_layout()
    fig.savefig(latency)
    plt.close(fig)
    return [throughput, latency]


def _axes(ax, levels: list[int], ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()


def figures_section(figures: list[dict]) -> list[str]:
    lines = ["## Every figure", "", "| bench | figure | value | goal | met | details |", "|---|---|---|---|---|---|"]
    for f in figures:
        value = "skipped" if f.get("value") is None else cell(f["value"])
        details = f.get("skipped") or ", ".join(f"{k}={_text(v)}" for k, v in f.items()
                                                if k not in _HIDDEN and not isinstance(v, (dict, list)))
        lines.append(f"| {f.get('bench', '')} | `{f['figure']}` | {value} | {cell(f.get('goal', ''))} | "
                     f"{goal_met(f.get('value'), f.get('goal', ''))} | {cell(details, 300)} |")
    return lines if figures else lines + ["| | (none) | | | | |"]


def runs_section(runs: list[dict]) -> list[str]:
    lines = ["## The benches", "", "| bench | status | seconds |", "|---|---|---|"]
    lines += [f"| {r['run']} | {'**failed**' if r['status'] == 'failed' else r['status']} | {r.get('seconds', '')} |"
              for r in runs]
    for r in (r for r in runs if r["status"] == "failed"):
        lines += ["", f"`{r['run']}` failed ({r.get('returncode')}); the tail of its stderr:", "", "```",
                  r.get("stderr_tail", "").rstrip(), "```"]
    return lines


def _prose(text: str) -> str:
    return textwrap.fill(text, 120, break_long_words=False, break_on_hyphens=False)


def cell(value, limit: int = 120) -> str:
    """A value as a markdown table cell: short, one line, no `|`."""
    text = _text(value)
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return text.replace("|", "\\|")


def _text(value) -> str:
    text = "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
    return " ".join(text.split())
