"""The signs that one pod's window ran saturated, and their thresholds. collector-spec §8."""

from __future__ import annotations

import math
from enum import StrEnum

# Saturation thresholds of collector-spec §8 (the WVA's KV threshold is 0.80; vLLM preempts
# near full, so 0.95 marks real exhaustion).
SATURATED_WAITING = 0.5
SATURATED_KV_RATIO = 0.95
# The backlog (running + waiting) grows when more than this share of the window's requests is
# still in it at the end (spec §7.4: arrivals over 1.1 x completions) ...
BACKLOG_GROWTH_SHARE = 0.1
# ... and more than this many: at light load the backlog moves by a request or two between any two
# instants, which is no sign of saturation.
MIN_BACKLOG_GROWTH = 2.0


def backlog_growing(backlog_change: float | None, requests: float) -> bool:
    """Whether a window's backlog grew by more than its share of the window's `requests`
    (arrivals) and by more than MIN_BACKLOG_GROWTH; False when the change is unknown."""
    if backlog_change is None:
        return False
    return backlog_change > max(MIN_BACKLOG_GROWTH, BACKLOG_GROWTH_SHARE * requests)


class Saturation(StrEnum):
    """Signs that a window ran saturated (collector-spec §8); exported label values."""

    WAITING = "waiting"  # mean waiting requests > 0.5
    BACKLOG_GROWING = "backlog_growing"  # backlog_growing(): the queue grows
    QUEUE_OVER_INFERENCE = "queue_over_inference"  # mean queue time > mean inference time
    KV_FULL = "kv_full"  # KV-cache usage > 0.95 at the window end
    PREEMPTIONS = "preemptions"  # any preemption in the window


def saturation_signs(
    queue: float | None,
    inference: float | None,
    avg_waiting: float | None,
    queue_growing: bool,
    kv: float | None,
    preempted: float | None,
) -> tuple[Saturation, ...]:
    """The collector-spec §8 signs present in one pod's window, from its mean queue and
    inference times (None when no request finished the phase)."""
    signs = {
        Saturation.WAITING: avg_waiting is not None and avg_waiting > SATURATED_WAITING,
        Saturation.BACKLOG_GROWING: queue_growing,
        # An absent mean is no sign: the comparison is then False.
        Saturation.QUEUE_OVER_INFERENCE: (queue or 0.0) > (inference or math.inf),
        Saturation.KV_FULL: kv is not None and kv > SATURATED_KV_RATIO,
        Saturation.PREEMPTIONS: preempted is not None and preempted > 0,
    }
    return tuple(sign for sign, present in signs.items() if present)
