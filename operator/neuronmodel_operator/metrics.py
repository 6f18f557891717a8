"""The operator's own Prometheus metrics, served on /metrics at --metrics-port (the chart's ServiceMonitor scrapes it).

- `neuronmodel_operator_reconciles_total{result}`: reconcile runs by how they ended: ok, held (a rollout waits for
  its compile Job), spec_error (a spec that cannot be served), gone (the NeuronModel was deleted), api_error (the
  API server failed; retried) or error (a bug; logged, retried);
- `neuronmodel_operator_reconcile_seconds`: how long the runs took;
- `neuronmodel_operator_models{phase}`: the NeuronModels the operator watches, by status.phase (read from its watch's
  copies when scraped, so it is never stale and costs no request).

One registry per operator (not prometheus-client's global one), so tests can make several.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from neuronmodel_operator.reconcile import Outcome

PHASES = ("Pending", "Compiling", "Loading", "Ready", "Degraded", "Failed")


def result_of(outcome: Outcome) -> str:
    if outcome.gone:
        return "gone"
    if outcome.spec_error is not None:
        return "spec_error"
    return "held" if outcome.held else "ok"


class _ModelsByPhase:
    """A collector: the watched NeuronModels counted by phase at scrape time (every phase present, zeros included)."""

    def __init__(self, models: Callable[[], Iterable[Mapping]]) -> None:
        self.models = models

    def collect(self) -> Iterator[Metric]:
        counts = dict.fromkeys(PHASES, 0)
        for body in list(self.models()):
            phase = (body.get("status") or {}).get("phase") or "Pending"
            counts[phase] = counts.get(phase, 0) + 1
        family = GaugeMetricFamily("neuronmodel_operator_models", "NeuronModels watched, by status.phase",
                                   labels=["phase"])
        for phase, count in counts.items():
            family.add_metric([phase], count)
        yield family


class OperatorMetrics:
    def __init__(self, models: Callable[[], Iterable[Mapping]]) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("neuronmodel_operator_reconciles", "Reconcile runs by result", ["result"],
                                  registry=self.registry)
        self.duration = Histogram("neuronmodel_operator_reconcile_seconds", "Seconds a reconcile run took",
                                  buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=self.registry)
        self.registry.register(_ModelsByPhase(models))

    def observe(self, result: str, seconds: float) -> None:
        self.reconciles.labels(result).inc()
        self.duration.observe(seconds)

    def serve(self, port: int) -> None:
        """Serve /metrics on 0.0.0.0:`port` from a daemon thread."""
        start_http_server(port, addr="0.0.0.0", registry=self.registry)
