"""Which latency assembly the model uses, and the known inputs the refined one needs.

The refined variant is the default (it wins every held-out check on the paper's H100 grid and on
a real vLLM); the paper-exact variant (mean-field latencies at X-bar, spec §6) is what the golden
cases pin. The refined ("B5", refinements §6; model/queueing/refined.py) keeps alpha, beta,
gamma and the chain, and adds workload and architecture inputs that are known, never fitted:
the arrival process's coefficient of variation, the dispersion of the request lengths, the share
of prompt tokens the prefix cache serves, and the model's shape (attention FLOPs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from bench.baseline.vendor.model.queueing.validation import require_int_at_least, require_non_negative, require_positive

POISSON_ARRIVAL_CV = 1.0  # the default: independent users
CONSTANT_ARRIVAL_CV = 0.0  # a constant-rate load generator (GuideLLM `constant`)
# Lengths drawn uniformly from [x/2, 3x/2]: CV = 1/sqrt(12).
UNIFORM_HALF_WIDTH_CV = 12.0**-0.5


class ModelVariant(StrEnum):
    """Latency assembly: the paper's mean-field evaluation, or the iteration-level refinement."""

    PAPER = "paper"
    REFINED = "refined"


@dataclass(frozen=True, slots=True)
class ArchitectureSpec:
    """Transformer shape behind the prefill attention term: layers, hidden (query) width,
    parameter count (refinements §6); and the KV-cache shape behind the physical prior of
    gamma: KV heads, head dimension, bytes per cached element (2 for BF16, 1 for FP8). A GQA
    model caches far fewer bytes per token than hidden_size implies."""

    num_layers: int
    hidden_size: int
    num_parameters: float
    num_kv_heads: int | None = None
    head_dim: int | None = None
    kv_cache_bytes: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "num_layers", require_int_at_least("num_layers", self.num_layers, 1)
        )
        object.__setattr__(
            self, "hidden_size", require_int_at_least("hidden_size", self.hidden_size, 1)
        )
        object.__setattr__(
            self, "num_parameters", require_positive("num_parameters", self.num_parameters)
        )
        for name in ("num_kv_heads", "head_dim"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, require_int_at_least(name, getattr(self, name), 1))
        object.__setattr__(
            self, "kv_cache_bytes", require_positive("kv_cache_bytes", self.kv_cache_bytes)
        )

    @property
    def kv_bytes_per_token(self) -> float | None:
        """Bytes one cached token occupies: 2 (K, V) x layers x KV heads x head dim x bytes per
        element; None without the KV shape."""
        if self.num_kv_heads is None or self.head_dim is None:
            return None
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_cache_bytes

    @property
    def attention_ratio(self) -> float:
        """kappa = 4 d L / (2 P): attention FLOPs per (query, key) pair over linear FLOPs per
        token (dimensionless)."""
        return 4.0 * self.hidden_size * self.num_layers / (2.0 * self.num_parameters)

    def to_dict(self) -> dict[str, float | None]:
        return {
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_parameters": self.num_parameters,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "kv_cache_bytes": self.kv_cache_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArchitectureSpec:
        """Inverse of to_dict; a dict saved before the KV shape existed reads without it."""
        kv_heads, head_dim = data.get("num_kv_heads"), data.get("head_dim")
        return cls(
            int(data["num_layers"]),
            int(data["hidden_size"]),
            float(data["num_parameters"]),
            None if kv_heads is None else int(kv_heads),
            None if head_dim is None else int(head_dim),
            float(data.get("kv_cache_bytes", 2.0)),
        )


# Two architectures of the paper's validation grid (Hugging Face configs).
LLAMA_3_1_8B = ArchitectureSpec(
    num_layers=32, hidden_size=4096, num_parameters=8.03e9, num_kv_heads=8, head_dim=128
)
QWEN_2_5_14B = ArchitectureSpec(
    num_layers=48, hidden_size=5120, num_parameters=14.77e9, num_kv_heads=8, head_dim=128
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelOptions:
    """Model variant and its known workload/architecture inputs (CVs are dimensionless).

    The paper variant ignores every field but `variant`. Without an architecture the refined
    variant charges no prefill attention (kappa = 0).
    """

    variant: ModelVariant = ModelVariant.REFINED
    arrival_cv: float = POISSON_ARRIVAL_CV  # CV of inter-arrival times
    input_length_cv: float = 0.0  # CV of prompt lengths
    output_length_cv: float = 0.0  # CV of output lengths
    # Share of prompt tokens served by the prefix cache: not computed, but held in the KV cache.
    prefix_hit_ratio: float = 0.0
    architecture: ArchitectureSpec | None = None

    def __post_init__(self) -> None:
        try:
            variant = ModelVariant(self.variant)
        except ValueError as exc:
            allowed = ", ".join(repr(v.value) for v in ModelVariant)
            raise ValueError(f"`variant` must be one of {allowed}, got {self.variant!r}") from exc
        object.__setattr__(self, "variant", variant)
        for name in ("arrival_cv", "input_length_cv", "output_length_cv"):
            object.__setattr__(self, name, require_non_negative(name, getattr(self, name)))
        hit = require_non_negative("prefix_hit_ratio", self.prefix_hit_ratio)
        if hit >= 1.0:
            raise ValueError(f"`prefix_hit_ratio` must be a number in [0, 1), got {hit}")
        object.__setattr__(self, "prefix_hit_ratio", hit)
        if self.architecture is not None and not isinstance(self.architecture, ArchitectureSpec):
            raise ValueError(
                f"`architecture` must be an ArchitectureSpec or None, got {self.architecture!r}"
            )

    @property
    def refined(self) -> bool:
        """True for the iteration-level (B5) assembly."""
        return self.variant is ModelVariant.REFINED

    @property
    def attention_ratio(self) -> float:
        """kappa of the architecture, 0 when none is given."""
        return 0.0 if self.architecture is None else self.architecture.attention_ratio

    def to_dict(self) -> dict[str, object]:
        return {
            "variant": self.variant.value,
            "arrival_cv": self.arrival_cv,
            "input_length_cv": self.input_length_cv,
            "output_length_cv": self.output_length_cv,
            "prefix_hit_ratio": self.prefix_hit_ratio,
            "architecture": None if self.architecture is None else self.architecture.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelOptions:
        arch = data.get("architecture")
        return cls(
            variant=ModelVariant(str(data.get("variant", ModelVariant.REFINED))),
            arrival_cv=float(data.get("arrival_cv", POISSON_ARRIVAL_CV)),
            input_length_cv=float(data.get("input_length_cv", 0.0)),
            output_length_cv=float(data.get("output_length_cv", 0.0)),
            prefix_hit_ratio=float(data.get("prefix_hit_ratio", 0.0)),
            architecture=None if arch is None else ArchitectureSpec.from_dict(arch),
        )


DEFAULT_MODEL = ModelOptions()  # the refined variant, Poisson arrivals: wins the held-out checks
PAPER_MODEL = ModelOptions(variant=ModelVariant.PAPER)  # paper-exact, spec §6 (golden cases)
