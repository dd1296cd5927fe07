"""The fit's prior: where (alpha, beta, gamma) sit before the data says otherwise.

A window of one request shape cannot separate beta from gamma (both grow with the tokens a
request carries), so an unregularized fit runs the unidentified direction to a bound. The fit
instead minimizes the relative latency errors plus a weak Gaussian penalty on log(theta) around
a centre (a MAP estimate): directions the data pins follow the data, the others stay at the
centre. The centre, in order of preference, is the last estimate the data identified, a
configured seed, or the physical prior derived here from the served model and the accelerator:

- alpha = weight bytes / (eta_mem x memory bandwidth): every iteration streams the weights once;
- beta = 2 x parameter count / (eta_flops x peak dense BF16 FLOP/s): a forward pass costs about
  two FLOPs per parameter per token;
- gamma = KV bytes per token / (eta_mem x memory bandwidth), KV bytes per token =
  2 (K and V) x layers x KV heads x head dim x bytes per element.

eta_flops = 0.8 and eta_mem = 0.7 are the efficiencies the paper's H100 fit implies (Table I:
beta at about 80 % of peak compute, gamma at about 71 % of peak bandwidth); with them
Llama-3.1-8B on an H100 comes out at (6.85, 2.03e-2, 5.59e-5) ms against Table I's
(6.68, 2.01e-2, 5.52e-5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from model.queueing.params import ServiceParams
from model.queueing.validation import require_positive
from model.queueing.variant import ArchitectureSpec

COMPUTE_EFFICIENCY = 0.8  # achieved / peak dense BF16 FLOP/s (paper §VI: beta at ~80 %)
BANDWIDTH_EFFICIENCY = 0.7  # achieved / peak HBM bandwidth (paper §VI: gamma at ~71 %)
WEIGHT_BYTES_PER_PARAMETER = 2.0  # BF16 weights
# The reference tuner's initState (tuner spec §13): the centre when nothing better is known.
GENERIC_CENTRE = ServiceParams(5.0, 0.05, 5e-5)
# Widths of the prior, one standard deviation of log(theta): a factor of e for a centre the data
# once identified or an operator configured, a factor of 3 for a physical derivation (the
# efficiencies vary across kernels and engines), a factor of 10 for the generic centre.
ESTIMATE_LOG_SIGMA = 1.0
PHYSICAL_LOG_SIGMA = math.log(3.0)
GENERIC_LOG_SIGMA = math.log(10.0)


class Accelerator(StrEnum):
    """Accelerator presets; values are configuration values."""

    H100 = "H100"
    H200 = "H200"
    A100 = "A100"
    L40S = "L40S"
    MI300X = "MI300X"


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """Published peak figures of one accelerator: dense BF16 FLOP/s and memory bytes/s."""

    peak_bf16_flops: float
    memory_bandwidth_bytes_s: float

    def __post_init__(self) -> None:
        require_positive("peak_bf16_flops", self.peak_bf16_flops)
        require_positive("memory_bandwidth_bytes_s", self.memory_bandwidth_bytes_s)


# Vendor datasheets, dense (no sparsity) BF16 tensor throughput and HBM/GDDR bandwidth:
# H100 SXM5 80 GB, H200 SXM 141 GB, A100 SXM 80 GB, L40S 48 GB, MI300X 192 GB.
ACCELERATORS = MappingProxyType(
    {
        Accelerator.H100: AcceleratorSpec(989e12, 3.35e12),
        Accelerator.H200: AcceleratorSpec(989e12, 4.8e12),
        Accelerator.A100: AcceleratorSpec(312e12, 2.039e12),
        Accelerator.L40S: AcceleratorSpec(362e12, 0.864e12),
        Accelerator.MI300X: AcceleratorSpec(1307e12, 5.3e12),
    }
)


class CentreSource(StrEnum):
    """Where a prior's centre came from, most trusted first."""

    ESTIMATE = "estimate"  # the last estimate the data identified
    SEED = "seed"  # configured initial parameters, or an estimate restored under new settings
    PHYSICAL = "physical"  # the served model's architecture and the accelerator
    GENERIC = "generic"  # the reference tuner's initState


@dataclass(frozen=True, slots=True)
class Prior:
    """Gaussian prior on log(alpha, beta, gamma): a centre (ms) and one standard deviation of
    each log-parameter."""

    centre: ServiceParams
    log_sigma: tuple[float, float, float]

    def __post_init__(self) -> None:
        if not isinstance(self.centre, ServiceParams):
            raise ValueError(f"`centre` must be a ServiceParams, got {self.centre!r}")
        if not isinstance(self.log_sigma, tuple) or len(self.log_sigma) != 3:
            raise ValueError(f"`log_sigma` must be 3 numbers > 0, got {self.log_sigma!r}")
        for k, sigma in enumerate(self.log_sigma):
            require_positive(f"log_sigma[{k}]", sigma)

    def to_dict(self) -> dict[str, object]:
        return {"centre": self.centre.to_dict(), "log_sigma": list(self.log_sigma)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Prior:
        sigma = tuple(float(v) for v in data["log_sigma"])
        if len(sigma) != 3:
            raise ValueError(f"`log_sigma` must be 3 numbers > 0, got {data['log_sigma']!r}")
        return cls(ServiceParams.from_dict(dict(data["centre"])), (sigma[0], sigma[1], sigma[2]))


LOG_SIGMAS = MappingProxyType(
    {
        CentreSource.ESTIMATE: ESTIMATE_LOG_SIGMA,
        CentreSource.SEED: ESTIMATE_LOG_SIGMA,
        CentreSource.PHYSICAL: PHYSICAL_LOG_SIGMA,
        CentreSource.GENERIC: GENERIC_LOG_SIGMA,
    }
)


def prior_around(centre: ServiceParams, source: CentreSource) -> Prior:
    """A prior of the standard width for its source."""
    sigma = LOG_SIGMAS[source]
    return Prior(centre, (sigma, sigma, sigma))


GENERIC_PRIOR = prior_around(GENERIC_CENTRE, CentreSource.GENERIC)


def physical_params(architecture: ArchitectureSpec, accelerator: AcceleratorSpec) -> ServiceParams:
    """(alpha, beta, gamma) in ms from the model's shape and the accelerator's peak figures
    (module docstring); needs the architecture's KV-cache shape."""
    kv_bytes = architecture.kv_bytes_per_token
    if kv_bytes is None:
        raise ValueError(
            "`architecture` needs num_kv_heads and head_dim for a physical prior, got "
            f"{architecture!r}"
        )
    bandwidth = BANDWIDTH_EFFICIENCY * accelerator.memory_bandwidth_bytes_s
    flops = COMPUTE_EFFICIENCY * accelerator.peak_bf16_flops
    weights = WEIGHT_BYTES_PER_PARAMETER * architecture.num_parameters
    return ServiceParams(
        alpha_ms=1e3 * weights / bandwidth,
        beta_ms=1e3 * 2.0 * architecture.num_parameters / flops,
        gamma_ms=1e3 * kv_bytes / bandwidth,
    )


def gpus_of(accelerator: Accelerator, gpus: int = 1) -> AcceleratorSpec:
    """`gpus` accelerators of one type as one: tensor parallelism splits the FLOPs and the bytes
    each iteration moves across them (its all-reduces are not counted: the prior is a centre,
    the data moves it)."""
    if gpus < 1:
        raise ValueError(f"`gpus` must be an integer >= 1, got {gpus!r}")
    peak = ACCELERATORS[Accelerator(accelerator)]
    return AcceleratorSpec(gpus * peak.peak_bf16_flops, gpus * peak.memory_bandwidth_bytes_s)


def transferred(params: ServiceParams, source: AcceleratorSpec, target: AcceleratorSpec
                ) -> ServiceParams:
    """Parameters calibrated on `source` moved to `target` (each with its GPU count folded in,
    `gpus_of`): beta (compute per token) scales with peak FLOP/s, alpha (the weights streamed
    per iteration) and gamma (KV bytes read per token) with memory bandwidth."""
    bandwidth = source.memory_bandwidth_bytes_s / target.memory_bandwidth_bytes_s
    beta = params.beta_ms * source.peak_bf16_flops / target.peak_bf16_flops
    return ServiceParams(params.alpha_ms * bandwidth, beta, params.gamma_ms * bandwidth)


def default_prior(
    architecture: ArchitectureSpec | None, accelerator: Accelerator | None, gpus: int = 1
) -> Prior:
    """The physical prior when the model's KV shape and the accelerator are known (on `gpus`
    of them per replica), else the generic one."""
    if accelerator is None or architecture is None or architecture.kv_bytes_per_token is None:
        return GENERIC_PRIOR
    params = physical_params(architecture, gpus_of(Accelerator(accelerator), gpus))
    return prior_around(params, CentreSource.PHYSICAL)
