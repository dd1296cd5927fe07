"""The prefill-work queue: how long an arriving prompt waits for prompt work queued ahead of it.
Percentiles §3.

vLLM admits waiting prompts first come first served into each iteration's token budget, so seen
from the prompts the engine is one server working through prefill work. A prompt of n tokens,
with x requests decoding beside it, costs its own compute beta n + gamma n (plus attention in
the refined variant) and the share n / (M - x) of the decode iteration D(x) it rides on:

    S(n) = W_pref(n) + D(x) n / (M - x)                                      (ms)

`prompt_service_ms` gives S per prompt; `prefill_work_queue` turns the moments of S and the
arrival process into the wait of a GI/G/1 queue (the refined mean TTFT takes the same wait at
the mean prompt, cs2 the prompt length's squared CV: model/queueing/kernel/mean.py). Utilisation
rho = lambda E[S]; the wait is positive with probability rho and has an exponential tail whose
mean is Kingman's,

    E[W] = rho / (1 - rho) (ca2 + cs2) / 2 E[S],   P(W > t) = rho exp(-t rho / E[W]),

with ca2 the squared CV of the inter-arrival times (1 Poisson, where E[W] is
Pollaczek-Khinchine's exactly; 0 constant rate) and cs2 = Var S / E[S]^2. Burstier arrivals
(ca2 > 1) come in clumps that Kingman's heavy-traffic mean misses at the moderate utilisations
of prompt work (at rho = 0.1 and ca2 = 4 it gives a third of the GI/M/1 wait): they are taken
as a gamma renewal process with that CV, whose GI/M/1 wait is exact, P(W > 0) = sigma with
sigma = A*(mu (1 - sigma)) and W | W > 0 exponential of mean E[S] / (1 - sigma), with Kingman's
service factor (1 + cs2) / 2 on the mean. A utilisation of 1 or more has no steady state: every
wait is +inf.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel import arrivals as kernel_arrivals

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillWait:
    """Wait (ms) of an arriving prompt for the prefill work ahead of it, per rate (1-D)."""

    utilization: FloatArray  # rho = lambda E[S]
    delay_prob: FloatArray  # P(W > 0); 1 when unstable
    tail_ms: FloatArray  # mean of W given W > 0; +inf when unstable

    @property
    def stable(self) -> NDArray[np.bool_]:
        stable: NDArray[np.bool_] = self.utilization < 1.0
        return stable

    @property
    def mean_ms(self) -> FloatArray:
        """E[W] (ms), +inf when unstable."""
        mean: FloatArray = self.delay_prob * self.tail_ms
        return mean

    def quantile_ms(self, u: FloatArray) -> FloatArray:
        """W at each probability level u in [0, 1) (columns) per rate (rows): 0 up to
        1 - P(W > 0), the exponential tail beyond (kernel_arrivals.wait_quantile)."""
        levels = np.ascontiguousarray(u, dtype=np.float64)
        out: FloatArray = kernel_arrivals.wait_quantiles(
            self.delay_prob, self.tail_ms, self.stable, levels.reshape(-1)
        ).reshape(self.delay_prob.shape + levels.shape)
        return out


def prompt_service_ms(
    prefill_work_ms: FloatArray,
    prompt_tokens: FloatArray,
    decode_iteration_ms: FloatArray,
    decoding: FloatArray,
    budget_tokens: int,
) -> FloatArray:
    """S = W_pref + D(x) n / (M - x): a prompt's work on the prefill server (ms), from its own
    prefill work W_pref (ms), its n tokens, the decode iteration D(x) (ms) of the x requests
    decoding beside it and the token budget M. Arrays broadcast."""
    room = np.maximum(budget_tokens - decoding, 1.0)
    service: FloatArray = prefill_work_ms + decode_iteration_ms * prompt_tokens / room
    return service


def prefill_work_queue(
    rate_per_ms: FloatArray,
    service_mean_ms: FloatArray,
    service_scv: FloatArray,
    arrival_scv: float,
) -> PrefillWait:
    """GI/G/1 wait for prefill work at each arrival rate (req/ms, 1-D), from the mean (ms) and
    squared CV of the prompt service S (per rate) and the squared CV of inter-arrival times
    (computed by model/queueing/kernel/arrivals.py)."""
    rate, service, scv = (
        np.ascontiguousarray(v, dtype=np.float64).reshape(-1)
        for v in np.broadcast_arrays(rate_per_ms, service_mean_ms, service_scv)
    )
    delay, tail = kernel_arrivals.prefill_waits(rate, service, scv, float(arrival_scv))
    return PrefillWait(utilization=rate * service, delay_prob=delay, tail_ms=tail)


def bursty_delay_prob(utilization: FloatArray, arrival_scv: float) -> FloatArray:
    """sigma in (0, 1) per element (1-D): P(W > 0) under gamma-renewal arrivals of squared CV
    ca2 > 1 (kernel_arrivals.bursty_delay_prob); 0 at rho = 0."""
    rho = np.ascontiguousarray(utilization, dtype=np.float64).reshape(-1)
    root: FloatArray = kernel_arrivals.bursty_delay_probs(rho, float(arrival_scv))
    return root
