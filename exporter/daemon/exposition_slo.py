"""Prometheus families of the targets, from the collector's snapshot (exporter.daemon.exposition):
predicted and configured percentiles by `percentile` (and `kind` for ITL), predicted and observed
attainment by `target`, the SLO window's request count, and each target's feasibility at
replicas.max."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.config.values import ItlKind
from exporter.daemon.metric_names import LABELS, PREFIX, S_PER_MS
from exporter.sizing.attainment import ObservedAttainment
from exporter.sizing.feasibility import target_names
from exporter.sizing.recommender import Decision
from exporter.sizing.slo_targets import percentile_label
from model import LatencyMetric, PercentileTarget


class DeploymentStatus(Protocol):
    """What these families read of exporter.daemon.exposition.DeploymentStatus."""

    @property
    def deployment(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def decision(self) -> Decision: ...
    @property
    def slo_percentiles(self) -> tuple[PercentileTarget, ...]: ...
    @property
    def observed_attainment(self) -> tuple[ObservedAttainment, ...]: ...
    @property
    def slo_window_requests(self) -> float | None: ...
    @property
    def slo_ttft_ms(self) -> float | None: ...
    @property
    def slo_itl_ms(self) -> float | None: ...


def attainment_families(statuses: Sequence[DeploymentStatus]) -> Iterator[Metric]:
    """Observed attainment of each percentile target over slo_window_s, and the window's
    request count."""
    ratio = GaugeMetricFamily(
        PREFIX + "observed_slo_attainment_ratio",
        "Share of requests (gaps, for per-token ITL) within each percentile target over "
        "slo_window_s, from vLLM's histograms: bound=exact where the target is a bucket bound, "
        "else the bracket's lower and upper ends.",
        labels=(*LABELS, "target", "bound"),
    )
    requests = GaugeMetricFamily(
        PREFIX + "observed_slo_window_requests",
        "Requests whose first token fell within slo_window_s (below about 1000, a p99 "
        "attainment is noise).",
        labels=LABELS,
    )
    for s in statuses:
        for seen in s.observed_attainment:
            for bound, share in seen.values():
                ratio.add_metric([s.deployment, s.model_name, seen.target.name, bound], share)
        if s.slo_window_requests is not None:
            requests.add_metric([s.deployment, s.model_name], s.slo_window_requests)
    yield ratio
    yield requests


_ITL_KINDS = {kind.metric: kind for kind in ItlKind}
# Percentile gauges (without prefix): TTFT by `percentile`, ITL by `percentile` and `kind`.
PERCENTILE_GAUGES = tuple(
    f"{source}_{metric}_quantile_seconds"
    for source in ("predicted", "slo")
    for metric in ("ttft", "itl")
)


def percentile_families(statuses: Sequence[DeploymentStatus]) -> Iterator[Metric]:
    """Predicted and target percentiles: TTFT by `percentile`, ITL by `percentile` and `kind`."""
    families = {
        (name, ttft): GaugeMetricFamily(
            f"{PREFIX}{name}_{'ttft' if ttft else 'itl'}_quantile_seconds",
            help_text + ("" if ttft else " `kind`: per_token (every gap) or per_request (each "
                         "request's mean gap)."),
            labels=(*LABELS, "percentile") if ttft else (*LABELS, "percentile", "kind"),
        )
        for name, help_text in (
            ("predicted", "Model percentile of each configured percentile target at the current "
             "load on the current replicas, without the mean bias correction (+Inf when "
             "saturated; never scale on it), as of the last cycle."),
            ("slo", "Configured percentile target."),
        )
        for ttft in (True, False)
    }  # fmt: skip

    def add(name: str, s: DeploymentStatus, target: PercentileTarget, value_ms: float) -> None:
        ttft = target.metric is LatencyMetric.TTFT
        key = [s.deployment, s.model_name, percentile_label(target.quantile)]
        if not ttft:
            key.append(_ITL_KINDS[target.metric].value)
        families[name, ttft].add_metric(key, value_ms * S_PER_MS)

    attainment = GaugeMetricFamily(
        PREFIX + "predicted_slo_attainment_ratio",
        "Share of requests (of gaps, for per-token ITL) the model predicts within each "
        "percentile target at the current load on the current replicas, as of the last cycle.",
        labels=(*LABELS, "target"),
    )
    for s in statuses:
        for predicted in s.decision.predicted_percentiles:
            add("predicted", s, predicted.target, predicted.value_ms)
            key = [s.deployment, s.model_name, predicted.target.name]
            attainment.add_metric(key, predicted.attainment)
        for target in s.slo_percentiles:
            add("slo", s, target, target.target_ms)
    yield from families.values()
    yield attainment


def feasibility_family(statuses: Sequence[DeploymentStatus]) -> Metric:
    """Each configured target: 1 when the model meets it at replicas.max at the rate sized
    for, 0 when it cannot (exporter.sizing.feasibility); no series before a sizing."""
    family = GaugeMetricFamily(
        PREFIX + "slo_target_feasible",
        "1 when the model meets the target at replicas.max at the rate sized for, 0 when it "
        "cannot (the target is infeasible there), as of the last sizing.",
        labels=(*LABELS, "target"),
    )
    for s in statuses:
        if s.decision.binding_target is None:
            continue
        infeasible = s.decision.infeasible_targets
        for name in target_names(s.slo_ttft_ms, s.slo_itl_ms, s.slo_percentiles):
            family.add_metric([s.deployment, s.model_name, name], float(name not in infeasible))
    return family
