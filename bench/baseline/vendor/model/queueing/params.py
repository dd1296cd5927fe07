"""Inputs of the queueing model: service parameters, server settings, workload. Spec §1-2."""

from __future__ import annotations

from dataclasses import dataclass

from bench.baseline.vendor.model.queueing.validation import (
    require_at_least,
    require_int_at_least,
    require_non_negative,
    require_positive,
)

DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class ServiceParams:
    """Per-iteration cost model (ms): an engine iteration takes alpha + beta (tokens computed) +
    gamma (KV-cache tokens read). Spec §2."""

    alpha_ms: float
    beta_ms: float
    gamma_ms: float

    def __post_init__(self) -> None:
        for name in ("alpha_ms", "beta_ms", "gamma_ms"):
            object.__setattr__(self, name, require_positive(name, getattr(self, name)))

    def as_tuple(self) -> tuple[float, float, float]:
        """(alpha_ms, beta_ms, gamma_ms)."""
        return (self.alpha_ms, self.beta_ms, self.gamma_ms)

    def to_dict(self) -> dict[str, float]:
        return {"alpha_ms": self.alpha_ms, "beta_ms": self.beta_ms, "gamma_ms": self.gamma_ms}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> ServiceParams:
        return cls(data["alpha_ms"], data["beta_ms"], data["gamma_ms"])


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """vLLM scheduler limits: max_num_seqs (B), max_num_batched_tokens (M) and the waiting room
    (None = unbounded, as vLLM and the paper; an int Q: at most B + Q requests in the system,
    later arrivals are lost; Q = 0 is no waiting room). Spec §1, §5."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_queue_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "max_batch_size", require_int_at_least("max_batch_size", self.max_batch_size, 1)
        )
        object.__setattr__(
            self,
            "max_num_batched_tokens",
            require_int_at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1),
        )
        if self.max_queue_size is not None:
            object.__setattr__(
                self,
                "max_queue_size",
                require_int_at_least("max_queue_size", self.max_queue_size, 0),
            )

    def to_dict(self) -> dict[str, int | None]:
        return {
            "max_batch_size": self.max_batch_size,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_queue_size": self.max_queue_size,
        }


@dataclass(frozen=True, slots=True)
class Workload:
    """Mean request shape: input (prompt) tokens n >= 0 and output tokens m >= 1. Spec §1."""

    avg_input_tokens: float
    avg_output_tokens: float

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "avg_input_tokens",
            require_non_negative("avg_input_tokens", self.avg_input_tokens),
        )
        object.__setattr__(
            self,
            "avg_output_tokens",
            require_at_least("avg_output_tokens", self.avg_output_tokens, 1),
        )
