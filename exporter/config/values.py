"""The daemon's configuration as frozen values: `Config`, its deployments and their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from model import LatencyMetric, ModelOptions, PercentileTarget, ServerConfig, ServiceParams
from model.calibration.prior import Accelerator

DEFAULT_CYCLE_PERIOD_S = 30.0
DEFAULT_LISTEN_HOST = "0.0.0.0"  # every interface: Prometheus scrapes the pod IP
DEFAULT_LISTEN_PORT = 9464
DEFAULT_STABILIZATION_S = 300.0
DEFAULT_SCRAPE_TIMEOUT_S = 5.0
DEFAULT_PROMETHEUS_TIMEOUT_S = 10.0
DEFAULT_MIN_OBSERVATIONS = 5
DEFAULT_WINDOW = 10
# Observed attainment needs minutes: a p99 means something from about 1000 requests on.
DEFAULT_SLO_WINDOW_S = 300.0
MIN_SLO_WINDOW_S = 300.0
MAX_SLO_WINDOW_S = 3600.0  # the daemon keeps one histogram set per cycle of it
# Cap on the body of one HTTP answer (a pod's /metrics, a Prometheus API answer): a larger one is
# a failed read (`body_too_large`) and is never held whole in memory. vLLM's /metrics is tens of
# kB; a 400 MB body once took the daemon to 2.8 GB.
MIB = 1 << 20
DEFAULT_MAX_RESPONSE_MIB = 32
DEFAULT_MAX_RESPONSE_BYTES = DEFAULT_MAX_RESPONSE_MIB * MIB

# Upper bounds of the sizes that set the daemon's memory and time per cycle (config_loader
# refuses anything beyond them, naming the key and the bound).
MAX_DEPLOYMENTS = 256  # each one is read, fitted and sized every cycle
MIN_CYCLE_PERIOD_S = 1.0
MAX_CYCLE_PERIOD_S = 3600.0  # longer is no autoscaling; the scheduler's grace time is the period
MAX_NUM_SEQS = 16_384  # vLLM's max_num_seqs is a few hundred to a few thousand in practice
MAX_NUM_BATCHED_TOKENS = 16_777_216  # 2**24 tokens: above any context length served today
MAX_QUEUE_SIZE = 100_000
MAX_TUNER_WINDOW = 1_000  # also bounds tuner.min_observations
MAX_REPLICAS = 10_000
MAX_RESPONSE_MIB = 1024  # the cap itself is held in memory while it is read
# A read's deadline (scrape_timeout_s, prometheus.timeout_s): beyond this no wait is meaningful,
# and a far larger one overflows the platform's timers, failing every read.
MAX_TIMEOUT_S = 3600.0
# The HPA's own limit for a stabilization window; the history holds one entry per cycle of it.
MAX_STABILIZATION_S = 3600.0
MAX_IDLE_S = 86_400.0  # scale_from_zero.idle_s: a day without demand
MAX_RATE_MARGIN_SIGMAS = 10.0  # beyond this the margin is no statistics, only over-provisioning
MAX_QUERY_CHARS = 4096  # scale_from_zero.demand_query: a real one is a line
# A fit evaluates the model on a table of tuner.window x (max_num_seqs + max_queue_size) floats,
# several times over: 2**20 cells is ~70 MiB and ~0.1 s per evaluation (100 million max_num_seqs
# alone took 763 MiB per evaluation). Each factor has its bound above; so does their product.
MAX_MODEL_CELLS = 1_048_576


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """Connection to a Prometheus (or Thanos) HTTP API."""

    url: str
    bearer_token_file: Path | None = None
    ca_file: Path | None = None
    timeout_s: float = DEFAULT_PROMETHEUS_TIMEOUT_S


class SourceKind(StrEnum):
    """What a read was of: how a deployment's vLLM metrics are read, or its demand query;
    exported label values."""

    SCRAPE = "scrape"  # the pods' /metrics, directly
    PROMETHEUS = "prometheus"  # vLLM's series in a Prometheus server
    DEMAND = "demand"  # the scale_from_zero demand query (errors only: never a deployment's source)


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceConfig:
    """Where a deployment's vLLM metrics come from: exactly one of the three."""

    scrape_urls: tuple[str, ...] = ()
    scrape_service: str | None = None  # http://headless-service:port/metrics, resolved each cycle
    prometheus_selector: str | None = None
    scrape_timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S

    @property
    def kind(self) -> SourceKind:
        """How the metrics are read: the `source` label of scrape errors."""
        return SourceKind.PROMETHEUS if self.prometheus_selector is not None else SourceKind.SCRAPE


class ItlKind(StrEnum):
    """Which inter-token latency an ITL percentile target describes; exported label values."""

    PER_TOKEN = "per_token"  # every gap between two tokens (vLLM's inter_token_latency_seconds)
    PER_REQUEST = "per_request"  # each request's mean gap (request_time_per_output_token_seconds)

    @property
    def metric(self) -> LatencyMetric:
        """The model's latency of this kind."""
        if self is ItlKind.PER_TOKEN:
            return LatencyMetric.ITL_PER_TOKEN
        return LatencyMetric.ITL_PER_REQUEST


@dataclass(frozen=True, slots=True)
class SloConfig:
    """Targets in ms; None = no target on that metric (none at all: size to capacity).

    `itl_ms` is the token-weighted mean gap, vLLM's inter_token_latency _sum/_count (what the
    tuner fits); `percentiles` are sized on the model's latency percentiles, TTFT first."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    percentiles: tuple[PercentileTarget, ...] = ()
    window_s: float = DEFAULT_SLO_WINDOW_S  # observed attainment is over this many seconds


@dataclass(frozen=True, slots=True)
class TunerConfig:
    """Knobs of the online tuner."""

    min_observations: int = DEFAULT_MIN_OBSERVATIONS
    window: int = DEFAULT_WINDOW


class ForecastMode(StrEnum):
    """What a deployment's look-ahead sizes with (exporter.sizing.forecast_choice): a
    forecaster by name, or `auto`, chosen by backtest on the deployment's own history."""

    AUTO = "auto"
    LAST_VALUE = "last_value"
    LINEAR_TREND = "linear_trend"
    KALMAN = "kalman"
    HOLT_WINTERS = "holt_winters"
    UPPER_QUANTILE = "upper_quantile"


class DemandKind(StrEnum):
    """What the scale_from_zero demand query measures; exported label values."""

    RATE = "rate"  # requests/s reaching the router: sized for with the kept calibration
    QUEUE = "queue"  # requests held upstream (a queue length): any is worth one replica


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleFromZeroConfig:
    """Scale to zero after `idle_s` without demand or requests, back as soon as the upstream
    demand query (PromQL, one value) reads above 0. Central mode only."""

    demand_query: str
    idle_s: float
    demand: DemandKind = DemandKind.RATE


# One standard error of a window's arrival count: sized at the measured rate, a true rate at a
# replica boundary is under-provisioned half the time; one standard error above it, about one
# window in six.
DEFAULT_RATE_MARGIN_SIGMAS = 1.0


class Routing(StrEnum):
    """How a model's traffic reaches its variants' replicas; configuration values."""

    WEIGHTED = "weighted"  # a load-aware gateway gives each variant the rate the plan gives it
    EVEN = "even"  # one Service round-robins over all pods: every replica gets the same rate


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentConfig:
    """One vLLM deployment to observe, calibrate and size."""

    name: str
    model_name: str
    source: SourceConfig
    server: ServerConfig
    slo: SloConfig
    min_replicas: int = 1  # 0 only with scale_from_zero
    max_replicas: int = 10
    scale_down_stabilization_s: float = DEFAULT_STABILIZATION_S
    look_ahead_s: float = 0.0  # size for the load trend this far ahead (0 = the current load)
    forecaster: ForecastMode = ForecastMode.LINEAR_TREND  # what the look-ahead extends
    # Size for the window's arrival rate plus this many standard errors of its count.
    rate_margin_sigmas: float = DEFAULT_RATE_MARGIN_SIGMAS
    initial_params: ServiceParams | None = None
    accelerator: Accelerator | None = None  # with model.architecture: the physical prior
    tuner: TunerConfig = field(default_factory=TunerConfig)
    model: ModelOptions = field(default_factory=ModelOptions)
    scale_from_zero: ScaleFromZeroConfig | None = None  # min_replicas 0 needs it (lone)
    gpus_per_replica: int = 1  # tensor parallelism: the physical prior's peak figures times it
    # A fleet variant's time from scheduled to ready (s); None: not given (a lone deployment).
    startup_delay_s: float | None = None

    @property
    def serving_min_replicas(self) -> int:
        """The fewest replicas sized for while serving: 0 is decided only by scale_from_zero."""
        return max(self.min_replicas, 1)

    # The workload CVs the config gives (`model.arrival_cv`, ...): the model uses these, not the
    # measured ones (exporter/sizing/traffic.py).
    pinned_inputs: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorConfig:
    """One accelerator type a fleet may use: its price and the GPUs there are, a static count
    or a PromQL query of one value read each cycle (exactly one of the two)."""

    name: Accelerator
    price_per_gpu_hour: float
    inventory: int | None = None
    inventory_query: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetModelConfig:
    """One model's traffic stream and the deployments (variants) that serve it."""

    name: str  # vLLM's --served-model-name, every variant's model_name
    priority: int = 0  # larger is served first when GPUs run short
    routing: Routing = Routing.WEIGHTED
    variants: tuple[str, ...] = ()  # deployment names


# The plan's stability share and untrusted margin (exporter/sizing/fleet/values.py); defaults.
DEFAULT_SWITCH_SAVING = 0.10
DEFAULT_UNTRUSTED_MARGIN = 0.25


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetConfig:
    """The `accelerators` and `models` sections: the deployments that are variants of a model
    are sized together, by the least-cost plan within the GPUs there are."""

    accelerators: tuple[AcceleratorConfig, ...]
    models: tuple[FleetModelConfig, ...]
    switch_saving: float = DEFAULT_SWITCH_SAVING
    untrusted_margin: float = DEFAULT_UNTRUSTED_MARGIN

    def accelerator(self, name: str) -> AcceleratorConfig:
        return next(a for a in self.accelerators if a.name == name)

    def model_of(self, deployment: str) -> FleetModelConfig | None:
        return next((m for m in self.models if deployment in m.variants), None)


@dataclass(frozen=True, slots=True)
class ShardConfig:
    """This sizer's share of the models: `index` in [0, count); None = the replica's ordinal."""

    count: int
    index: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """The whole daemon configuration."""

    cycle_period_s: float = DEFAULT_CYCLE_PERIOD_S
    listen_host: str = DEFAULT_LISTEN_HOST
    listen_port: int = DEFAULT_LISTEN_PORT
    state_file: Path | None = None
    log_level: str = "info"
    prometheus: PrometheusConfig | None = None
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    deployments: tuple[DeploymentConfig, ...] = ()
    shard: ShardConfig | None = None  # None: one sizer for every deployment
    replica: str | None = None  # the `sizer_replica` label; None: $VLLM_SIZER_REPLICA, or none
    fleet: FleetConfig | None = None  # the `models` section's variants are in `deployments`
