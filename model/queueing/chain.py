"""State-dependent times and the birth-death chain over occupancy, in log space. Spec §2, §4, §5.

Every request is the mean one (n, m): c(i) prefill chunks then m decode steps, with work
W_pref(c) = beta n + gamma n (c+1)/2 and W_dec = beta m + gamma m (n + (m+1)/2) (the refined
variant adds the terms of work.py, and with a prefix-cache hit ratio h computes only (1 - h) n
prompt tokens, each chunk reading the cached h n as well; the decode context keeps all n).
With i in the batch the service time is tau(i) = (c(i) + m) alpha + i (W_pref + W_dec). The
chain counts requests in the system: up-rate lambda, down-rate mu_i = min(i, B) / tau(min(i, B));
so p_i = p_0 prod_{j<=i} lambda / mu_j, summed as logs and normalised after subtracting the
max. The waiting room beyond B is infinite
(stable iff lambda < B / tau(B)) or holds Q requests.

Tables have one row per request shape: one row for `analyze` on one workload, K rows when K
observations with different shapes are evaluated together (the tuner's fits). Rates are given
per row, or many rates share a single row.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from model.queueing.chunks import chunk_counts
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.variant import DEFAULT_MODEL, ModelOptions
from model.queueing.work import work_extras

FloatArray = NDArray[np.float64]
_Scalar = TypeVar("_Scalar", bound=np.generic)

RATE_BLOCK = 32  # rates solved together at most; see solve_chain
# Work arrays of at most this many elements (rates x states): larger temporaries fall out of
# cache and page-fault on reuse (2-4x slower at B = 4096).
BLOCK_ELEMENTS = 1 << 16
# exp of an argument below about -708 takes libm's slow subnormal path (10-120 ns instead of
# 0.6 ns an element). Raising log-weights below -700 to -700 adds at most (B+1) B e^-700 < 1e-296
# to the sums: nothing next to the head sum (it holds a 1), nor next to the occupancy sum
# when p_1 / p_max >= e^-600 (it is then >= 1e-261). Rows with a smaller p_1 (a rate of about 0)
# are left exact.
LOG_WEIGHT_FLOOR = -700.0
CLIP_SAFE_LOG_P1 = -600.0
TINY_RATE = 1e-300  # req/ms; stands in for 0 in log space


@dataclass(frozen=True, slots=True, kw_only=True)
class StateTable:
    """Per-occupancy quantities, shape (rows, B) with column i-1 for occupancy i; ms. Spec §2, §4.

    Built once per (params, server, request shapes) and shared by every rate evaluated with them.
    """

    chunks: NDArray[np.int64]  # c(i)
    w_pref_ms: FloatArray  # prefill work of one request with c(i) chunks, W_pref(c(i))
    w_dec_ms: FloatArray  # decode work of one request, W_dec, shape (rows, 1)
    # delta(c) = (W_pref + W_dec) / (c + m): mean work per iteration of one active request
    delta_ms: FloatArray
    tau_ms: FloatArray  # tau(i): service time of a request in a batch of i
    log_mu: FloatArray  # log of the total departure rate i / tau(i), 1/ms
    cum_log_mu: FloatArray  # sum_{j<=i} log mu_j for i = 0..B, shape (rows, B+1)
    alpha_ms: float
    avg_output_tokens: FloatArray  # m, shape (rows, 1)
    prefill_tokens: FloatArray  # prompt tokens computed (uncached), shape (rows, 1)
    max_batch_size: int
    budget_tokens: int  # M: tokens one iteration may schedule
    max_queue_size: int | None
    options: ModelOptions = DEFAULT_MODEL  # the variant whose work terms built this table

    @property
    def rows(self) -> int:
        return int(self.tau_ms.shape[0])

    @property
    def saturation_rate_per_ms(self) -> FloatArray:
        """B / tau(B) per row: the infinite chain is stable below this rate (req/ms). Spec §7."""
        return self.max_batch_size / self.tau_ms[:, -1]

    def background_ms(self, occupancy: FloatArray, col: NDArray[np.intp]) -> FloatArray:
        """max(0, alpha + (x - 1) delta(c)) at occupancy x (per rate), c at column col."""
        return np.maximum(0.0, self.alpha_ms + (occupancy - 1.0) * self.take(self.delta_ms, col))

    def take(self, values: NDArray[_Scalar], col: NDArray[np.intp]) -> NDArray[_Scalar]:
        """values[row, col] for each rate: its own row, or row 0 when all rates share it."""
        picked: NDArray[_Scalar]  # numpy types fancy indexing as Any
        if values.shape[0] == 1:
            picked = values[0, col]
        else:
            picked = values[np.arange(col.shape[0]), col]
        return picked

    @property
    def prefill_ms(self) -> FloatArray:
        """T_p(i) = c background(i) + W_pref(c): prefill latency in a batch of i."""
        occ = np.arange(1, self.max_batch_size + 1, dtype=np.float64)
        return self.chunks * np.maximum(0.0, self.alpha_ms + (occ - 1.0) * self.delta_ms) + (
            self.w_pref_ms
        )

    @property
    def itl_ms(self) -> FloatArray:
        """ITL(i) = background(i) + W_dec / m: one decode iteration in a batch of i."""
        occ = np.arange(1, self.max_batch_size + 1, dtype=np.float64)
        background = np.maximum(0.0, self.alpha_ms + (occ - 1.0) * self.delta_ms)
        return background + self.w_dec_ms / self.avg_output_tokens

    @property
    def iteration_ms(self) -> FloatArray:
        """T(i) = alpha + i delta(c(i)): mean iteration time with i requests in the batch."""
        occ = np.arange(1, self.max_batch_size + 1, dtype=np.float64)
        return self.alpha_ms + occ * self.delta_ms


def state_table(
    params: ServiceParams,
    server: ServerConfig,
    n_tokens: FloatArray,
    m_tokens: FloatArray,
    *,
    options: ModelOptions = DEFAULT_MODEL,
) -> StateTable:
    """Precompute c(i), work terms, tau(i) and log departure rates for i = 1..B, one row per
    request shape (n_tokens, m_tokens: 1-D arrays of equal length). Spec §2, §4; the refined
    variant adds the work terms of `work.py` to W_pref and W_dec."""
    alpha, beta, gamma = params.alpha_ms, params.beta_ms, params.gamma_ms
    n = np.asarray(n_tokens, dtype=np.float64).reshape(-1, 1)
    m = np.asarray(m_tokens, dtype=np.float64).reshape(-1, 1)
    # Prefix caching (refined): only the uncached n_c = (1 - h) n prompt tokens are computed,
    # in c chunks, each of which also reads the cached prefix h n.
    hit = options.prefix_hit_ratio if options.refined else 0.0
    n_comp = n * (1.0 - hit)
    chunks = chunk_counts(n_comp, m, server)
    c = chunks.astype(np.float64)
    w_pref = beta * n_comp + gamma * n_comp * (c + 1.0) / 2.0 + gamma * c * (n - n_comp)
    w_dec = beta * m + gamma * m * (n + (m + 1.0) / 2.0)
    if options.refined:
        extra_pref, extra_dec = work_extras(params, n, m, options)
        w_pref, w_dec = w_pref + extra_pref, w_dec + extra_dec
    w_total = w_pref + w_dec
    occ = np.arange(1, server.max_batch_size + 1, dtype=np.float64)
    tau = (c + m) * alpha + occ * w_total
    log_mu = np.log(occ) - np.log(tau)
    cum_log_mu = np.concatenate([np.zeros((n.shape[0], 1)), np.cumsum(log_mu, axis=1)], axis=1)
    delta = w_total / (c + m)
    for arr in (chunks, w_pref, w_dec, delta, tau, log_mu, cum_log_mu, m, n_comp):
        arr.flags.writeable = False
    return StateTable(
        chunks=chunks,
        w_pref_ms=w_pref,
        w_dec_ms=w_dec,
        delta_ms=delta,
        tau_ms=tau,
        log_mu=log_mu,
        cum_log_mu=cum_log_mu,
        alpha_ms=alpha,
        avg_output_tokens=m,
        prefill_tokens=n_comp,
        max_batch_size=server.max_batch_size,
        budget_tokens=server.max_num_batched_tokens,
        max_queue_size=server.max_queue_size,
        options=options,
    )


def workload_table(
    params: ServiceParams,
    server: ServerConfig,
    workload: Workload,
    *,
    options: ModelOptions = DEFAULT_MODEL,
) -> StateTable:
    """The one-row state table of a single request shape."""
    n = np.array([workload.avg_input_tokens])
    m = np.array([workload.avg_output_tokens])
    return state_table(params, server, n, m, options=options)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainSolution:
    """Stationary measures of the chain for each rate (1-D arrays). Spec §5.

    A finite chain has states 0..B+Q; an arrival that finds B+Q requests is lost (p_block).
    Unstable rates (infinite waiting room, rate >= B / tau(B)) carry nan in every measure
    that diverges; `stable` marks them.
    """

    stable: NDArray[np.bool_]
    num_in_system: FloatArray  # N
    batch_occupancy: FloatArray  # X-bar = E[min(i, B)]
    queue_length: FloatArray  # L_q
    p_empty: FloatArray  # p_0
    p_wait: FloatArray  # P(i > B)
    p_block: FloatArray  # p_K (0 for an infinite waiting room)


def solve_chain(table: StateTable, rate_per_ms: FloatArray) -> ChainSolution:
    """Solve the birth-death chain at every rate (req/ms, 1-D; one per table row unless the
    table has a single row) in log space. Spec §5."""
    lam = np.asarray(rate_per_ms, dtype=np.float64).reshape(-1)
    block = rate_block(table.max_batch_size)
    if lam.size <= block:
        return _solve_block(table, lam, slice(None))
    # Row blocks keep the (rates x states) work arrays in cache: several times faster for
    # long curves than one large array.
    parts = [
        _solve_block(table, lam[k : k + block], slice(k, k + block))
        for k in range(0, lam.size, block)
    ]
    names = [f.name for f in fields(ChainSolution)]
    return ChainSolution(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in names})


def rate_block(max_batch_size: int) -> int:
    """Rates solved together: at most RATE_BLOCK, and at most BLOCK_ELEMENTS work elements."""
    return max(1, min(RATE_BLOCK, BLOCK_ELEMENTS // (max_batch_size + 1)))


def log_state_weights(
    table: StateTable, rate_per_ms: FloatArray, rows: slice = slice(None)
) -> tuple[FloatArray, FloatArray]:
    """log p_i - log p_0 for i = 0..B, shape (rates, B+1), and log(lambda / mu_B), the log
    ratio of successive states beyond B, per rate (req/ms, 1-D; `rows` of a per-row table)."""
    lam = rate_per_ms.reshape(-1, 1)
    cum_log_mu = table.cum_log_mu if table.rows == 1 else table.cum_log_mu[rows]
    log_mu_b = table.log_mu[:, -1:] if table.rows == 1 else table.log_mu[rows, -1:]
    states = np.arange(table.max_batch_size + 1, dtype=np.float64)
    # A zero rate becomes a tiny positive one: every p_i (i > 0) underflows to exactly 0.
    log_lam = np.log(np.maximum(lam, TINY_RATE))
    # log p_i - log p_0 = i log(lambda) - sum_{j<=i} log mu_j for i = 0..B.
    log_p = np.multiply(states, log_lam)
    np.subtract(log_p, cum_log_mu, out=log_p)
    log_r = (log_lam - log_mu_b)[:, 0]  # log(lambda / mu_B): the ratio beyond B
    return log_p, log_r


def _solve_block(table: StateTable, rate_per_ms: FloatArray, rows: slice) -> ChainSolution:
    lam = rate_per_ms.reshape(-1, 1)
    big_b = table.max_batch_size
    states = np.arange(big_b + 1, dtype=np.float64)
    log_p, log_r = log_state_weights(table, rate_per_ms, rows)
    if table.max_queue_size is None:
        return _solve_infinite(lam[:, 0], log_p, log_r, states, big_b)
    return _solve_finite(log_p, log_r, states, big_b, table.max_queue_size)


def _solve_infinite(
    lam: FloatArray, log_p: FloatArray, log_r: FloatArray, states: FloatArray, big_b: int
) -> ChainSolution:
    stable = log_r < 0.0
    r = np.where(stable, np.exp(log_r), 0.0)
    head = _unit_weights(log_p)  # log_p is this call's own work array
    # Tail i > B is geometric: mass p_B r/(1-r), queue length p_B r/(1-r)^2.
    tail_per_p_b = r / (1.0 - r)
    head /= (head.sum(axis=1) + head[:, -1] * tail_per_p_b)[:, np.newaxis]
    tail_mass = head[:, -1] * tail_per_p_b
    queue = tail_mass / (1.0 - r)
    p_empty = head[:, 0].copy()
    occupancy = np.multiply(head, states, out=head).sum(axis=1) + big_b * tail_mass
    return ChainSolution(
        stable=stable,
        num_in_system=np.where(stable, occupancy + queue, np.nan),
        batch_occupancy=np.where(stable, occupancy, float(big_b)),
        queue_length=np.where(stable, queue, np.nan),
        p_empty=np.where(stable, p_empty, 0.0),
        p_wait=np.where(stable, tail_mass, 1.0),
        p_block=np.zeros_like(r),
    )


def _unit_weights(log_p: FloatArray) -> FloatArray:
    """exp(log_p - row max), in place, with the interior log-weights floored at
    LOG_WEIGHT_FLOOR where that is exact; the end columns (p_0 and p_B, reported on their own)
    stay exact."""
    np.subtract(log_p, log_p.max(axis=1, keepdims=True), out=log_p)
    ends = np.exp(log_p[:, [0, -1]])
    floor = np.where(log_p[:, 1:2] >= CLIP_SAFE_LOG_P1, LOG_WEIGHT_FLOOR, -np.inf)
    np.maximum(log_p, floor, out=log_p)
    np.exp(log_p, out=log_p)
    log_p[:, [0, -1]] = ends
    return log_p


def _solve_finite(
    log_p: FloatArray, log_r: FloatArray, states: FloatArray, big_b: int, max_queue: int
) -> ChainSolution:
    # States B+1..B+Q continue geometrically with ratio lambda / mu_B.
    k = np.arange(1, max_queue + 1, dtype=np.float64)
    log_tail = log_p[:, -1:] + k[np.newaxis, :] * log_r[:, np.newaxis]
    log_all = np.concatenate([log_p, log_tail], axis=1)
    p = np.exp(log_all - log_all.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    tail = p[:, big_b + 1 :]
    p_wait = tail.sum(axis=1)
    queue = (tail * k).sum(axis=1)
    occupancy = (p[:, : big_b + 1] * states).sum(axis=1) + big_b * p_wait
    return ChainSolution(
        stable=np.ones(p.shape[0], dtype=bool),
        num_in_system=occupancy + queue,
        batch_occupancy=occupancy,
        queue_length=queue,
        p_empty=p[:, 0],
        p_wait=p_wait,
        p_block=p[:, -1],
    )


def state_probabilities(table: StateTable, rate_per_ms: float, extra_states: int = 0) -> FloatArray:
    """p_i for i = 0..K (finite) or 0..B+extra_states (infinite, tail truncated); for checks."""
    lam = float(rate_per_ms)
    big_b = table.max_batch_size
    states = np.arange(big_b + 1, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = np.where(states == 0.0, 0.0, states * np.log(lam)) - table.cum_log_mu[0]
    log_r = np.log(lam) - table.log_mu[0, -1]
    q = table.max_queue_size if table.max_queue_size is not None else extra_states
    log_all = np.concatenate([log_p, log_p[-1] + np.arange(1, q + 1) * log_r])
    p = np.exp(log_all - log_all.max())
    if table.max_queue_size is None:
        r = np.exp(log_r)
        total = p.sum() + p[-1] * r / (1.0 - r)  # the truncated geometric remainder
        probs: FloatArray = p / total
    else:
        probs = p / p.sum()
    return probs
