"""A deployment's startup delay as its own pods show it: from the cycle that asked for more
replicas than were ready to the first cycle whose ready pods reach that count. The look-ahead
forecasts the rate that far ahead (exporter.sizing.forecast_choice): the configured
`look_ahead_s` until a step has been measured, then the median of the last STARTUP_SAMPLES.

What is measured is what the forecast has to cover: the scaler's reaction, scheduling, the
image pull and the model load, rounded up to the cycle the pods are first seen ready in. A pod
that failed and came back counts as well (the count asked for was not ready for as long)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

# Steps whose delay is kept: the median of a few resists one slow node or a fast restart.
STARTUP_SAMPLES = 5
# An ask not served within this long is dropped (a scaler that does not follow, a quota): its
# delay says nothing about starting a pod.
MAX_STARTUP_S = 3600.0


class StartupClock:
    """The pending asks (cycle time s, count; counts rising) and the delays measured."""

    def __init__(self) -> None:
        self._asks: list[tuple[float, int]] = []
        self.samples: deque[float] = deque(maxlen=STARTUP_SAMPLES)

    @property
    def measured_s(self) -> float | None:
        """The median of the measured delays (s); None before any."""
        return float(np.median(np.fromiter(self.samples, float))) if self.samples else None

    def ready(self, now_s: float, ready_pods: int) -> None:
        """A window read at `now_s` (s) with `ready_pods` ready: each pending ask they reach
        is measured; one older than MAX_STARTUP_S is dropped."""
        while self._asks and ready_pods >= self._asks[0][1]:
            asked_s, _ = self._asks.pop(0)
            self.samples.append(max(now_s - asked_s, 0.0))
        self._asks = [(t, n) for t, n in self._asks if now_s - t <= MAX_STARTUP_S]

    def asked(self, now_s: float, ready_pods: int, desired: int | None) -> None:
        """The count recommended at `now_s` with `ready_pods` ready: a count above the ready
        pods and every count pending starts a clock of its own (the pods of a smaller ask are
        already on their way: timed from now, they would read short); no more than ready
        withdraws them all, a smaller count the asks above it."""
        if desired is None:
            return
        if desired <= ready_pods:
            self._asks = []
            return
        self._asks = [(t, n) for t, n in self._asks if n <= desired]
        if not self._asks or desired > self._asks[-1][1]:
            self._asks.append((now_s, desired))

    def to_dict(self) -> dict[str, Any]:
        return {"samples": list(self.samples)}

    def restore(self, data: Any) -> None:
        """The delays `to_dict` saved; entries that are not finite delays are dropped."""
        samples = data.get("samples") if isinstance(data, dict) else None
        for value in samples if isinstance(samples, list) else []:
            if (
                isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value) and 0 <= value <= MAX_STARTUP_S
            ):  # fmt: skip
                self.samples.append(float(value))
