"""Prometheus metrics under vLLM's names, so KEDA, llm-d's endpoint picker and vLLM dashboards work unchanged.

Gauges and totals are read from `EngineStats` at scrape time by a custom collector (the engine counts, the
server only reports); latency histograms are observed here when a request finishes. Each app owns its
registry, so a process (or a test session) can build many apps.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from neuronmodel_runtime.engine.outputs import RequestOutput

# Buckets of vLLM's histograms of the same names.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)


class _EngineCollector(Collector):
    """Reads the engine's snapshot at each scrape: queue depths, KV usage, token and speculation totals."""

    def __init__(self, engine: Any, model_name: str):
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Any]:
        stats = self.engine.stats()
        labels, model = ["model_name"], [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(model, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(model, value)
            return family

        yield gauge("vllm:num_requests_running", "Requests holding a batch slot.", stats.num_running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting for a batch slot.", stats.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache slots in use (1 = full).", stats.kv_cache_usage)
        yield counter("vllm:prompt_tokens", "Prompt tokens prefilled.", stats.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Output tokens generated.", stats.generation_tokens_total)
        yield counter("vllm:num_preemptions", "Preemptions (slots are never preempted).", stats.num_preemptions_total)
        yield counter("vllm:spec_decode_num_drafts", "Speculative drafts verified.", stats.spec_drafts_total)
        yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", stats.spec_draft_tokens_total)
        yield counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", stats.spec_accepted_tokens_total
        )
        yield counter("neuronmodel:engine_steps", "Engine steps that had work.", stats.steps_total)
        yield counter("neuronmodel:engine_step_seconds", "Seconds inside engine steps (runner calls included).",
                      stats.step_seconds_total)
        yield counter("neuronmodel:runner_seconds", "Seconds in runner calls: engine step seconds minus these are the "
                      "host's share of a step.", stats.runner_seconds_total)
        yield counter("neuronmodel:prefill_calls", "Runner prefill calls.", stats.prefill_calls_total)
        yield counter("neuronmodel:prefill_rows", "Prompts those calls carried.", stats.prefill_rows_total)
        yield counter("neuronmodel:decode_calls", "Runner decode calls (speculative ones included).",
                      stats.decode_calls_total)
        yield counter("neuronmodel:decode_rows", "Rows those calls carried (/ decode calls: the mean decode batch).",
                      stats.decode_rows_total)
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft.",
            labels=["model_name", "position"],
        )
        for position, accepted in enumerate(stats.spec_accepted_per_position):
            per_pos.add_metric([self.model_name, str(position)], accepted)
        yield per_pos


class _Static(Collector):
    """A metric family whose value never changes (the info gauge)."""

    def __init__(self, family: GaugeMetricFamily):
        self.family = family

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield self.family


def _framework_labels(info: dict[str, Any]) -> tuple[str, str]:
    """(framework, version) from `AsyncEngine.info()`: the framework selection, else the runner's own claim."""
    selected = (info.get("framework") or {}).get("selected") or {}
    framework = selected.get("framework") or (info.get("runner") or {}).get("framework") or "unknown"
    return str(framework), str(selected.get("version") or "")


def _startup_gauges(info: dict[str, Any], model_name: str) -> list[GaugeMetricFamily]:
    """How this process got ready (from `AsyncEngine.info()`): load seconds, and where the compiled artifacts came
    from and what compiling or fetching them cost (runners that compile only), for the operator's status."""
    startup = info.get("startup") or {}
    artifacts = (info.get("runner") or {}).get("artifacts") or {}
    values = [
        ("neuronmodel:startup_load_seconds", "Seconds the runner took to load, compile or fetch included.",
         startup.get("load_s")),
        ("neuronmodel:artifacts_compile_seconds", "Seconds this start spent compiling (0 on a cache hit).",
         artifacts.get("compile_s")),
        ("neuronmodel:artifacts_fetch_seconds", "Seconds this start spent fetching compiled artifacts from the store.",
         artifacts.get("fetch_s")),
        ("neuronmodel:artifacts_cache_hit", "1: the compiled artifacts were found (locally or in the store); 0: "
         "compiled at this start.", None if not artifacts else float(bool(artifacts.get("hit")))),
    ]
    out = []
    for name, doc, value in values:
        if value is not None:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([model_name], float(value))
            out.append(family)
    return out


class Metrics:
    """One app's registry: the engine collector, the info gauge and the per-request histograms."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: Any, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.registry.register(_EngineCollector(engine, model_name))
        framework, version = _framework_labels(engine.info())
        info = GaugeMetricFamily(
            "neuronmodel_info",
            "The serving framework and model (value 1).",
            labels=["framework", "framework_version", "model_name"],
        )
        info.add_metric([framework, version, model_name], 1)
        self.registry.register(_Static(info))
        for family in _startup_gauges(engine.info(), model_name):
            self.registry.register(_Static(family))
        labels = ["model_name"]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", labels, registry=self.registry,
            buckets=_TTFT_BUCKETS,
        ).labels(model_name)
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds", "Mean time per output token after the first, per request.", labels,
            registry=self.registry, buckets=_TPOT_BUCKETS,
        ).labels(model_name)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Request latency from arrival to finish.", labels,
            registry=self.registry, buckets=_E2E_BUCKETS,
        ).labels(model_name)
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds", "Time waiting for a batch slot.", labels, registry=self.registry,
            buckets=_TTFT_BUCKETS,
        ).labels(model_name)
        self._success = Counter(
            "vllm:request_success", "Finished requests, by finish reason.", ["model_name", "finished_reason"],
            registry=self.registry,
        )

    def observe_finished(self, out: RequestOutput) -> None:
        """Record one finished engine request (one choice)."""
        self._success.labels(self.model_name, out.finish_reason or "abort").inc()
        m = out.metrics
        if m is None:
            return
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
            if m.e2e is not None and out.num_output_tokens > 1:
                self.tpot.observe((m.e2e - m.ttft) / (out.num_output_tokens - 1))
        if m.e2e is not None:
            self.e2e.observe(m.e2e)
        if m.queue_time is not None:
            self.queue_time.observe(m.queue_time)

    def render(self) -> bytes:
        return generate_latest(self.registry)
