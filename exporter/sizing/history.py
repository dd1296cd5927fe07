"""A deployment's recent arrival rates: per pod for tuner points, in total for the look-ahead.
One record per window, read both ways."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from exporter.collector.observations import DeploymentObservation, ObservationStatus

RATE_WINDOWS = 20  # windows kept: a tuner point's rate may span this many

# Windows whose total rate was read (pods answered, the model's series found, two samples):
# what the look-ahead's trend is fitted to.
_RATES_READ = frozenset({ObservationStatus.OK, ObservationStatus.NO_LATENCY})


@dataclass(frozen=True, slots=True)
class _Window:
    time_s: float  # the cycle's time
    rate_rps: float  # the deployment's arrival rate
    per_pod_rps: float | None  # per pod that served through the window (None: none observed)
    window_s: float
    read: bool  # the total rate was read (_RATES_READ)


class RateHistory:
    """The arrival rates of a deployment's last RATE_WINDOWS windows, oldest first."""

    def __init__(self, size: int = RATE_WINDOWS) -> None:
        self._windows: deque[_Window] = deque(maxlen=size)

    def add(self, obs: DeploymentObservation, now_s: float) -> None:
        """Add a window observed at cycle time `now_s` (s)."""
        self._windows.append(
            _Window(
                time_s=now_s,
                rate_rps=obs.arrival_rate_rps,
                per_pod_rps=obs.arrival_rate_per_pod_rps,
                window_s=obs.window_s,
                read=obs.status in _RATES_READ,
            )
        )

    def per_pod(self) -> tuple[tuple[float, float], ...]:
        """(per-pod arrival rate req/s, window s) of the windows with an observed pod: the load
        a tuner point's latencies were made at spans them (model/calibration/batch_rate.py)."""
        return tuple(
            (w.per_pod_rps, w.window_s)
            for w in self._windows
            if w.per_pod_rps is not None and w.window_s > 0
        )

    def trend(self) -> tuple[tuple[float, float], ...]:
        """(cycle time s, arrival rate req/s) of the windows whose rate was read: what the
        look-ahead extends (exporter.sizing.recommender)."""
        return tuple((w.time_s, w.rate_rps) for w in self._windows if w.read)
