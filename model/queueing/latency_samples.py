"""Latencies at fixed sample points, from the chain's occupancy distribution. Percentiles §3.

One assembly for both variants: the state table (paper or refined work terms) supplies alpha,
the decode work d = W_dec / m of one request per iteration and the chain; `ModelOptions`
supplies the arrival CV and the length CVs (used with either variant: percentiles cannot ignore
how requests spread). Every metric is evaluated at each point of a fixed quasi-random set
(model/queueing/sample_points.py), so a latency is a deterministic, smooth function of the rate.

With x requests decoding, a decode iteration takes D(x) = alpha + x d, and a prompt of n tokens
in c = ceil(n / (M - x)) chunks costs its own prefill work
W_pref(n, c) = beta n + gamma n (c + 1) / 2 + beta kappa n^2 / 2 (kappa = 0 for the paper variant).

TTFT of an arrival that finds i others (Poisson: the chain's pi_i; constant rate: see
model/queueing/occupancy.py), x = min(i, B - 1) of them decoding:
  * slot wait when i >= B: exponential with mean (1 + ca2) / 2 / (B / tau(B) - lambda) (exact for
    Poisson arrivals and the chain's geometric tail);
  * the iteration in progress: prompts arriving during an iteration are admitted at the next,
    so it lasts D(x) plus the prefill work of K prompts, K ~ Poisson(lambda E[T]) with
    E[T] = D(x) / (1 - rho), length-biased; the arrival waits U of it. A constant-rate arrival
    at light load instead waits out the previous arrival's prefill iteration, if still running;
  * the prompts that arrived during its elapsed part go ahead of it; the wait for work ahead is
    the larger of that and the prefill-work queue's (model/queueing/prefill_queue.py, GI/G/1),
    which takes over when prompts back up beyond one iteration's budget;
  * its own prefill: c D(x) + W_pref(n, c), c at least the budget's ceil(n / (M - x)) and the
    chain's c(x + 1) for a mean-size prompt;
  * arrivals during the rest of the iteration in progress join its iteration while the budget
    M - x holds them;
  * FirstToken.AFTER_DECODE_ITERATION adds one decode iteration D(x) + d.
Per-request ITL (a request's mean gap over its m - 1 gaps): D(X_L + 1) / (1 - s), with X_L the
others' occupancy averaged over its lifetime (gamma, variance Var(X) h(L / S), h(y) = 1 - y/3 for
y <= 1 and 1/y - 1/(3 y^2) beyond: the M/G/inf autocorrelation with service S-bar) and s the
share of its lifetime taken by others' prefill work (mean rho = lambda E[W_pref], spread of the
compound arrival count, the lifetime stretching with it; capped at an iteration filled to the
budget); a mixture over the request's own output length. Per-token ITL: decode-only gaps D(x)
as exact atoms weighted by the tokens they carry, and prefill-carrying gaps drawn at the sample
points (see itl_token_samples).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

from model.queueing.chain import StateTable, evaluate
from model.queueing.kernel import latency as kernel_latency
from model.queueing.kernel import mean as kernel_mean
from model.queueing.occupancy import arrival_pmf, inverse_cdf, time_average_pmf
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.prefill_queue import PrefillWait, prefill_work_queue, prompt_service_ms
from model.queueing.sample_points import (
    gamma_quantile,
    length_quantile,
    normal_points,
    unit_points,
)

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """Everything per rate the metrics share (1-D arrays over rates; ms and req/ms)."""

    table: StateTable
    params: ServiceParams
    workload: Workload
    budget: int  # M, tokens per iteration
    kappa: float  # prefill attention ratio (0 for the paper variant)
    arrival_scv: float  # ca2
    lam: FloatArray
    stable: NDArray[np.bool_]
    service_ms: FloatArray  # S-bar
    occupancy: FloatArray  # X-bar
    seen_pmf: FloatArray  # (rates, B+1)
    time_pmf: FloatArray
    prefill_mean_ms: float  # E[W_pref(n, 1)] over the prompt-length law
    prefill_var_ms2: float
    queue: PrefillWait

    @property
    def decode_ms(self) -> float:
        """d = W_dec / m: one request's decode work per iteration."""
        return float(self.table.w_dec_ms[0, 0] / self.table.avg_output_tokens[0, 0])

    def decode_iteration_ms(self, decoding: FloatArray) -> FloatArray:
        """D(x) = alpha + x d."""
        out: FloatArray = self.table.alpha_ms + decoding * self.decode_ms
        return out

    def head(self, count: int) -> Setting:
        """The setting at the first `count` rates: each rate's values are its own (every metric
        is computed rate by rate), so a search can stop evaluating past a missed target."""
        q = self.queue
        return replace(
            self, lam=self.lam[:count], stable=self.stable[:count],
            service_ms=self.service_ms[:count], occupancy=self.occupancy[:count],
            seen_pmf=self.seen_pmf[:count], time_pmf=self.time_pmf[:count],
            queue=PrefillWait(utilization=q.utilization[:count], delay_prob=q.delay_prob[:count],
                              tail_ms=q.tail_ms[:count]),
        )  # fmt: skip


def prefill_work_ms(
    params: ServiceParams, kappa: float, n: FloatArray, chunks: FloatArray
) -> FloatArray:
    """W_pref(n, c) = beta n + gamma n (c + 1) / 2 + beta kappa n^2 / 2 (ms), per element of
    1-D arrays (kernel_latency.prefill_work)."""
    out: FloatArray = kernel_latency.prefill_works(
        params.beta_ms, params.gamma_ms, kappa, np.ascontiguousarray(n, dtype=np.float64),
        np.ascontiguousarray(chunks, dtype=np.float64),
    )  # fmt: skip
    return out


@lru_cache(maxsize=16)
def _decoding_states(big_b: int) -> FloatArray:
    """min(i, B - 1) for i = 0..B: others decoding beside a request that holds a slot (built
    once per B: a sizing search asks for it at every pass)."""
    out: FloatArray = np.minimum(np.arange(big_b + 1, dtype=np.float64), max(big_b - 1, 0))
    out.flags.writeable = False
    return out


_LARGEST = float(np.finfo(np.float64).max)


def _finite_scv(scv: FloatArray) -> FloatArray:
    """np.nan_to_num(scv) without its per-call look-up of the float limits: nan -> 0,
    +-inf -> +-the largest float."""
    out: FloatArray = np.clip(np.where(np.isnan(scv), 0.0, scv), -_LARGEST, _LARGEST)
    return out


@lru_cache(maxsize=64)
def _prompt_work(
    params: ServiceParams, kappa: float, avg_input_tokens: float, input_length_cv: float
) -> tuple[FloatArray, FloatArray, float, float]:
    """Prompt lengths n over the length law, their prefill work W_pref(n, 1) (ms) and its mean
    and variance: the same at every rate, built once per workload (sizing evaluates many rates,
    a few at a time)."""
    n = length_quantile(unit_points(1)[0], avg_input_tokens, input_length_cv)
    work = prefill_work_ms(params, kappa, n, np.ones_like(n))
    for v in (n, work):
        v.flags.writeable = False
    return n, work, float(work.mean()), float(work.var())


def setting(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    table: StateTable,
    rates_rps: FloatArray,
) -> Setting:
    """Solve the chain and the prefill-work queue at each rate (req/s, 1-D)."""
    opts = table.options
    at, pmf = evaluate(table, rates_rps, want_pmf=True)
    lam = rates_rps / 1000.0
    service = at[kernel_mean.SERVICE]
    occupancy = at[kernel_mean.BATCH]
    seen = arrival_pmf(table, pmf, service, lam, opts.arrival_cv)
    kappa = opts.attention_ratio if opts.refined else 0.0
    budget = server.max_num_batched_tokens
    # A prompt's work over the length law, and the prefill-work queue it feeds.
    n, work, work_mean, work_var = _prompt_work(
        params, kappa, workload.avg_input_tokens, opts.input_length_cv
    )
    decoding = seen @ _decoding_states(table.max_batch_size)
    d_iter = table.alpha_ms + decoding * float(table.w_dec_ms[0, 0] / table.avg_output_tokens[0, 0])
    service_s = prompt_service_ms(work, n, d_iter[:, np.newaxis], decoding[:, np.newaxis], budget)
    s_mean = service_s.mean(axis=1)
    with np.errstate(invalid="ignore"):  # inf / inf at unstable rates: the queue is unstable too
        s_scv = _finite_scv(service_s.var(axis=1) / np.maximum(s_mean, 1e-300) ** 2)
    return Setting(
        table=table,
        params=params,
        workload=workload,
        budget=budget,
        kappa=kappa,
        arrival_scv=opts.arrival_cv**2,
        lam=lam,
        stable=at[kernel_mean.STABLE] > 0.0,
        service_ms=service,
        occupancy=occupancy,
        seen_pmf=seen,
        time_pmf=time_average_pmf(table, pmf, service, lam, occupancy, opts.arrival_cv),
        prefill_mean_ms=work_mean,
        prefill_var_ms2=work_var,
        queue=prefill_work_queue(lam, s_mean, s_scv, opts.arrival_cv**2),
    )


@lru_cache(maxsize=64)
def _ttft_points(avg_input_tokens: float, input_length_cv: float) -> FloatArray:
    """Per sample point, what TTFT needs of it beside the rate (kernel_latency.POINT_ROWS rows):
    the unit levels, the Normal quantiles and logs of the count levels, the prompt's length and
    the previous prompt's (constant-rate arrivals), and log(1 - u) of the slot wait. The same at
    every rate, built once per workload."""
    _, u_pos, u_k, u_bias, u_ahead, u_after, u_wait, u_len, u_slot, u_kind = unit_points(10)
    z = normal_points(10)
    rows = {
        kernel_latency.U_POS: u_pos, kernel_latency.U_K: u_k, kernel_latency.U_BIAS: u_bias,
        kernel_latency.U_AHEAD: u_ahead, kernel_latency.U_AFTER: u_after,
        kernel_latency.U_WAIT: u_wait, kernel_latency.U_KIND: u_kind,
        kernel_latency.Z_K: z[2], kernel_latency.Z_AHEAD: z[4], kernel_latency.Z_AFTER: z[5],
        kernel_latency.PROMPT: length_quantile(u_len, avg_input_tokens, input_length_cv),
        kernel_latency.PREVIOUS: length_quantile(u_k, avg_input_tokens, input_length_cv),
        kernel_latency.SLOT_LOG: np.log1p(-u_slot), kernel_latency.LOG_K: np.log(u_k),
        kernel_latency.LOG_AHEAD: np.log(u_ahead), kernel_latency.LOG_AFTER: np.log(u_after),
    }  # fmt: skip
    out = np.empty((kernel_latency.POINT_ROWS, u_pos.size))
    for row, values in rows.items():
        out[row] = values
    out.flags.writeable = False
    return out


def ttft_samples(s: Setting, after_decode_iteration: bool) -> FloatArray:
    """TTFT (ms) at each sample point, shape (rates, points): each point as the module's
    docstring lays out, evaluated by model/queueing/kernel/latency.py."""
    table = s.table
    n_bar = max(s.workload.avg_input_tokens, 1.0)
    work = np.array([s.params.beta_ms, s.params.gamma_ms, s.kappa, s.prefill_mean_ms,
                     s.prefill_mean_ms / n_bar])  # prefill work per prompt token (ms)
    shape = np.array([table.max_batch_size, s.budget, table.alpha_ms, s.decode_ms, n_bar,
                      min(s.arrival_scv, 1.0), 1.0 if after_decode_iteration else 0.0])
    rate_values = np.stack([s.queue.delay_prob, s.queue.tail_ms, _slot_wait_mean(s)])
    out: FloatArray = kernel_latency.ttft_points(
        inverse_cdf(s.seen_pmf, 10, 0), s.lam, rate_values, s.stable, s.queue.stable,
        _ttft_points(s.workload.avg_input_tokens, table.options.input_length_cv),
        table.chunks[0].astype(np.float64), work, shape,
    )  # fmt: skip
    return out


def _slot_wait_mean(s: Setting) -> FloatArray:
    """Mean wait (ms) for a batch slot of an arrival that finds i >= B, per rate: exponential,
    (1 + ca2) / 2 / (mu_B - lambda), mu_B = B / tau(B); at most (Q + 1) / mu_B when finite."""
    table = s.table
    mu_b = table.saturation_rate_per_ms[0]
    gap = np.maximum(mu_b - s.lam, 1e-300)
    mean: FloatArray = (1.0 + s.arrival_scv) / 2.0 / gap
    if table.max_queue_size is not None:
        mean = np.minimum(mean, (table.max_queue_size + 1.0) / mu_b)
    return mean


def _lifetime_variance_share(lifetime_ms: FloatArray, service_ms: FloatArray) -> FloatArray:
    """h(L / S): the variance of occupancy averaged over a window L over its point variance,
    when others stay S (M/G/inf autocorrelation 1 - t / S)."""
    y = lifetime_ms / np.maximum(service_ms, 1e-300)
    safe = np.maximum(y, 1.0)
    out: FloatArray = np.where(y <= 1.0, 1.0 - y / 3.0, 1.0 / safe - 1.0 / (3.0 * safe * safe))
    return out


def itl_request_samples(s: Setting) -> FloatArray:
    """Per-request mean inter-token gap (ms) at each sample point, shape (rates, points)."""
    u_m = unit_points(2)[0]
    # One level for both: a burst of arrivals raises the occupancy and the prefill share together.
    z_x = z_w = normal_points(2)[1]
    table = s.table
    big_b = table.max_batch_size
    opts = table.options
    m = np.maximum(length_quantile(u_m, s.workload.avg_output_tokens, opts.output_length_cv), 1.0)
    gaps = np.maximum(m - 1.0, 1.0)
    states = _decoding_states(big_b)
    mean_x = s.time_pmf @ states
    var_x = np.maximum(s.time_pmf @ (states * states) - mean_x * mean_x, 0.0)
    lam = s.lam[:, np.newaxis]
    share = np.minimum(s.lam * s.prefill_mean_ms, kernel_latency.MAX_PREFILL_SHARE)
    mean_gap = s.decode_iteration_ms(mean_x + 1.0) / (1.0 - share)
    life = gaps[np.newaxis, :] * mean_gap[:, np.newaxis]
    h = _lifetime_variance_share(life, s.service_ms[:, np.newaxis])
    # A gamma law (not Normal): never negative, and skewed like the count it stands for.
    x_life = np.minimum(gamma_quantile(mean_x[:, np.newaxis], var_x[:, np.newaxis] * h, z_x),
                        big_b - 1.0)
    # Share s of the lifetime spent on others' prefill work: the work landing in a window L
    # has mean lambda L E[W] and variance lambda L (ca2 E[W]^2 + Var W), so at Normal level z,
    # s = rho + z sqrt(lambda V / L); the lifetime stretches with it, L = L0 / (1 - s), L0 the
    # decode-only lifetime. With t = sqrt(1 - s): t^2 + a t - (1 - rho) = 0, a = z sqrt(lambda
    # V / L0). Gaps are D / (1 - s), at most an iteration filled to the budget.
    rho = share[:, np.newaxis]
    spread = lam * (s.arrival_scv * s.prefill_mean_ms**2 + s.prefill_var_ms2)
    decode = s.decode_iteration_ms(x_life + 1.0)
    a = z_w * np.sqrt(spread / (gaps[np.newaxis, :] * decode))
    t = np.minimum((np.sqrt(a * a + 4.0 * (1.0 - rho)) - a) / 2.0, 1.0)
    # Below the mean, s = rho exp(a sqrt(1 - rho) / rho) instead (the same to first order):
    # it never falls as the rate rises, where rho - |a| sqrt(1 - rho) would at light load.
    with np.errstate(divide="ignore", over="ignore"):
        low = rho * np.exp(a * np.sqrt(1.0 - rho) / np.maximum(rho, 1e-300))
    busy = np.where(a < 0.0, low, 1.0 - t * t)
    room = np.maximum(s.budget - x_life - 1.0, 1.0)
    full = decode + room * s.prefill_mean_ms / max(s.workload.avg_input_tokens, 1.0)
    itl = np.minimum(decode / (1.0 - busy), np.maximum(full, decode))
    out: FloatArray = np.where(s.stable[:, np.newaxis], itl, np.inf)
    return out


# Rows of `_token_points`: prefill_gaps' levels (K, first prompt's length and arrival kind,
# n1), then the Normal level of the previous iteration's length T_prev.
_Z_PREVIOUS = 3


@lru_cache(maxsize=64)
def _token_points(avg_input_tokens: float, input_length_cv: float) -> FloatArray:
    """Per sample point, what the prefill-carrying gaps need of it beside the rate: the same
    at every rate, built once per workload."""
    _, u_pre, u_len, _ = unit_points(4)
    n1 = length_quantile(u_len, avg_input_tokens, input_length_cv)
    out = np.ascontiguousarray(np.stack([u_pre, u_len, n1, normal_points(4)[3]]))
    out.flags.writeable = False
    return out


def itl_token_samples(s: Setting) -> tuple[FloatArray, FloatArray]:
    """Inter-token gaps (ms) and their token shares, shape (rates, B + 1 + points) each.

    Prompts arriving during an iteration are admitted at the next one, so with x decoding,
    iterations last E[T] = D(x) / (1 - rho), rho = lambda E[W_pref], and each admits
    K ~ Poisson(lambda E[T]) prompts: a share f(x) = 1 - exp(-lambda E[T]) of them carries
    prefill work (K >= 1, capped at the budget M - x); constant-rate arrivals admit floor or
    ceil of lambda E[T]. Tokens come at x per iteration and (1 - rho) / D(x) iterations per ms.
    The decode-only gaps D(x) are exact atoms (one per state), the prefill-carrying ones are
    drawn at the sample points, so a small prefill share is resolved finely."""
    table = s.table
    big_b = table.max_batch_size
    n_bar = max(s.workload.avg_input_tokens, 1.0)
    per_token = s.prefill_mean_ms / n_bar
    poisson = min(s.arrival_scv, 1.0)
    terms = np.array([table.alpha_ms, s.decode_ms, s.prefill_mean_ms, poisson])
    decode_only, carrying, drawn = kernel_latency.token_weights(s.time_pmf, s.lam, terms)
    # Prefill-carrying iterations: state, then K >= 1 by inverse CDF above P(K = 0). The
    # previous iteration, whose arrivals this one admits, varies in length itself:
    # Var T = lambda E[T] E[W^2] / (1 - (lambda E[W])^2) for T = D + the work of
    # Poisson(lambda T_prev) prompts; drawn as a gamma law with that mean and variance
    # (kernel_latency.previous_iteration; K and the iteration: prefill_gaps).
    xs = inverse_cdf(drawn, 4, 0)
    levels = _token_points(s.workload.avg_input_tokens, table.options.input_length_cv)
    terms = np.array([table.alpha_ms, s.decode_ms, s.prefill_mean_ms,
                      s.prefill_var_ms2 + s.prefill_mean_ms**2])  # fmt: skip
    mean_t, var_t = kernel_latency.previous_iteration(xs, s.lam, terms)
    mu_s = s.lam[:, np.newaxis] * gamma_quantile(mean_t, var_t, levels[_Z_PREVIOUS])
    none = np.exp(-mu_s)
    level = none + levels[0] * (1.0 - none)
    # Counts of large means come from the Normal approximation, at the level's Normal quantile.
    z = ndtri(level) if (mu_s > kernel_latency.NORMAL_ABOVE).any() else level
    terms = np.array([table.alpha_ms, s.decode_ms, n_bar, per_token, s.budget, poisson])
    gaps = kernel_latency.prefill_gaps(xs, mu_s, level, z, s.stable, levels[:_Z_PREVIOUS], terms)
    states = np.arange(big_b + 1, dtype=np.float64)
    decode_gaps = np.where(s.stable[:, np.newaxis], s.decode_iteration_ms(states), np.inf)
    values = np.concatenate([decode_gaps, gaps], axis=1)
    share = carrying.sum(axis=1, keepdims=True) / xs.shape[1]
    weights = np.concatenate([decode_only, np.broadcast_to(share, xs.shape)], axis=1)
    return values, weights
