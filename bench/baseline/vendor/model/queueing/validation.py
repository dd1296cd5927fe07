"""Input checks behind every ValueError of the model: one wording for each mistake."""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np


def _describe(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def require_number(name: str, value: object) -> float:
    """A finite real number (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"`{name}` must be a finite number, got {_describe(value)}")
    return float(value)


def require_positive(name: str, value: object) -> float:
    """A finite number > 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, Real)
        or not (math.isfinite(float(value)) and float(value) > 0)
    ):
        raise ValueError(f"`{name}` must be a finite number > 0, got {_describe(value)}")
    return float(value)


def require_non_negative(name: str, value: object) -> float:
    """A finite number >= 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, Real)
        or not (math.isfinite(float(value)) and float(value) >= 0)
    ):
        raise ValueError(f"`{name}` must be a finite number >= 0, got {_describe(value)}")
    return float(value)


def require_at_least(name: str, value: object, minimum: float) -> float:
    """A finite number >= minimum."""
    if (
        isinstance(value, bool)
        or not isinstance(value, Real)
        or not (math.isfinite(float(value)) and float(value) >= minimum)
    ):
        raise ValueError(f"`{name}` must be a finite number >= {minimum:g}, got {_describe(value)}")
    return float(value)


def require_int_at_least(name: str, value: object, minimum: int) -> int:
    """An integer >= minimum (numpy integers accepted, floats and bools refused)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {_describe(value)}")
    return int(value)


def require_optional_target(name: str, value: object) -> float | None:
    """An SLO target in ms: None (absent) or a finite number > 0."""
    if value is None:
        return None
    return require_positive(name, value)


def require_rates(name: str, value: object) -> np.ndarray:
    """Scalar or 1-D array of finite rates >= 0, returned as a float64 array."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"`{name}` must be a number or a 1-D array of numbers, got {value!r}"
        ) from exc
    if arr.ndim > 1:
        raise ValueError(f"`{name}` must be a scalar or a 1-D array, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr < 0)
    if np.any(bad):
        first = arr.reshape(-1)[np.argmax(bad.reshape(-1))]
        raise ValueError(f"`{name}` must be finite and >= 0, got {first}")
    return arr
