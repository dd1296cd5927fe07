"""State-dependent times and the birth-death chain over occupancy, in log space. Spec §2, §4, §5.

Every request is the mean one (n, m): c(i) prefill chunks then m decode steps, with work
W_pref(c) = beta n + gamma n (c+1)/2 and W_dec = beta m + gamma m (n + (m+1)/2) (the refined
variant adds the terms of kernel/table.py, and with a prefix-cache hit ratio h computes only
(1 - h) n prompt tokens, each chunk reading the cached h n as well; the decode context keeps n).
With i in the batch the service time is tau(i) = (c(i) + m) alpha + i (W_pref + W_dec). The
chain counts requests in the system: up-rate lambda, down-rate mu_i = min(i, B) / tau(min(i, B));
so p_i = p_0 prod_{j<=i} lambda / mu_j, summed as logs and normalised after subtracting the
max. The waiting room beyond B is infinite
(stable iff lambda < B / tau(B)) or holds Q requests.

Tables have one row per request shape: one row for `analyze` on one workload, shared by every
rate evaluated on it (sizing, percentiles). Points that each have their own shape or parameters
(`analyze_points`, the tuner's fits) are evaluated one row at a time instead, each built and
evaluated in place (kernel_mean.point_outputs). The table and the chain are computed by
compiled loops (kernel/table.py, kernel/chain.py, kernel/mean.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel import mean as kernel_mean
from model.queueing.kernel import table as kernel_table
from model.queueing.kernel.table import (
    CHUNKS,
    CUM_LOG_MU,
    LOG_MU,
    OUTPUT,
    PREFILL_TOKENS,
    TAU,
    W_DEC,
    W_PREF,
)
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.variant import DEFAULT_MODEL, ModelOptions

FloatArray = NDArray[np.float64]

# Rates solved together in the percentile assembly's numpy blocks: at most RATE_BLOCK, and at
# most BLOCK_ELEMENTS work elements (rates x states); larger temporaries fall out of cache.
RATE_BLOCK = 32
BLOCK_ELEMENTS = 1 << 16


@dataclass(frozen=True, slots=True, kw_only=True)
class StateTable:
    """Per-occupancy quantities of each request shape (row), packed for the compiled kernel
    (model/queueing/kernel/table.py); the properties give them shape (rows, B) with column i-1
    for occupancy i, in ms. Spec §2, §4.

    Built once per (params, server, request shapes) and shared by every rate evaluated with them.
    """

    states: FloatArray  # (rows, STATE_FIELDS, B + 1)
    row_values: FloatArray  # (rows, ROW_FIELDS): alpha, W_dec, m, computed prompt tokens
    alpha_ms: float
    max_batch_size: int
    budget_tokens: int  # M: tokens one iteration may schedule
    max_queue_size: int | None
    options: ModelOptions = DEFAULT_MODEL  # the variant whose work terms built this table
    kernel_options: FloatArray  # the kernel's options vector (kernel_mean.OPT_*)

    @property
    def rows(self) -> int:
        return int(self.states.shape[0])

    def _field(self, field: int) -> FloatArray:
        out: FloatArray = self.states[:, field, : self.max_batch_size]
        out.flags.writeable = False
        return out

    def _row(self, field: int) -> FloatArray:
        out: FloatArray = self.row_values[:, field : field + 1]
        out.flags.writeable = False
        return out

    @property
    def chunks(self) -> NDArray[np.int64]:
        """c(i)."""
        return self._field(CHUNKS).astype(np.int64)

    @property
    def w_pref_ms(self) -> FloatArray:
        """Prefill work of one request with c(i) chunks, W_pref(c(i))."""
        return self._field(W_PREF)

    @property
    def w_dec_ms(self) -> FloatArray:
        """Decode work of one request, W_dec, shape (rows, 1)."""
        return self._row(W_DEC)

    @property
    def delta_ms(self) -> FloatArray:
        """delta(c) = (W_pref + W_dec) / (c + m): mean work per iteration of one request."""
        out: FloatArray = (self.w_pref_ms + self.w_dec_ms) / (
            self._field(CHUNKS) + self.avg_output_tokens
        )
        return out

    @property
    def tau_ms(self) -> FloatArray:
        """tau(i): service time of a request in a batch of i."""
        return self._field(TAU)

    @property
    def log_mu(self) -> FloatArray:
        """Log of the total departure rate i / tau(i), 1/ms."""
        return self._field(LOG_MU)

    @property
    def cum_log_mu(self) -> FloatArray:
        """sum_{j<=i} log mu_j for i = 0..B, shape (rows, B+1)."""
        out: FloatArray = self.states[:, CUM_LOG_MU, :]
        out.flags.writeable = False
        return out

    @property
    def avg_output_tokens(self) -> FloatArray:
        """m, shape (rows, 1)."""
        return self._row(OUTPUT)

    @property
    def prefill_tokens(self) -> FloatArray:
        """Prompt tokens computed (uncached), shape (rows, 1)."""
        return self._row(PREFILL_TOKENS)

    @property
    def saturation_rate_per_ms(self) -> FloatArray:
        """B / tau(B) per row: the infinite chain is stable below this rate (req/ms). Spec §7."""
        out: FloatArray = self.max_batch_size / self.states[:, TAU, self.max_batch_size - 1]
        return out

    def _background(self) -> FloatArray:
        occ = np.arange(1, self.max_batch_size + 1, dtype=np.float64)
        out: FloatArray = np.maximum(0.0, self.alpha_ms + (occ - 1.0) * self.delta_ms)
        return out

    @property
    def prefill_ms(self) -> FloatArray:
        """T_p(i) = c background(i) + W_pref(c): prefill latency in a batch of i."""
        out: FloatArray = self._field(CHUNKS) * self._background() + self.w_pref_ms
        return out

    @property
    def itl_ms(self) -> FloatArray:
        """ITL(i) = background(i) + W_dec / m: one decode iteration in a batch of i."""
        out: FloatArray = self._background() + self.w_dec_ms / self.avg_output_tokens
        return out

    @property
    def iteration_ms(self) -> FloatArray:
        """T(i) = alpha + i delta(c(i)): mean iteration time with i requests in the batch."""
        occ = np.arange(1, self.max_batch_size + 1, dtype=np.float64)
        out: FloatArray = self.alpha_ms + occ * self.delta_ms
        return out


def work_options(options: ModelOptions) -> FloatArray:
    """The kernel's work vector (kernel_table.build_states) of a variant."""
    if not options.refined:
        return np.zeros(6)
    hit = options.prefix_hit_ratio
    return np.array([
        1.0, hit, hit**2, options.attention_ratio,
        options.input_length_cv**2, options.output_length_cv**2,
    ])  # fmt: skip


def kernel_options(server: ServerConfig, options: ModelOptions) -> FloatArray:
    """The kernel's options vector (kernel_mean.OPT_*)."""
    queue = -1.0 if server.max_queue_size is None else float(server.max_queue_size)
    return np.array([
        1.0 if options.refined else 0.0, options.arrival_cv**2, options.input_length_cv**2,
        float(server.max_num_batched_tokens), queue,
    ])  # fmt: skip


@lru_cache(maxsize=16)
def occupancy_logs(max_batch_size: int) -> FloatArray:
    """log(i) for i = 1..B (kernel_table.occupancy_logs), computed once per B."""
    out: FloatArray = kernel_table.occupancy_logs(max_batch_size)
    return out


# The kernel's input arrays are cached (one-shot `analyze` spent a third of its time building
# them) and shared: never written, by the kernels or anyone else. Writeable all the same, as
# numba compiles read-only arrays as another type.
@lru_cache(maxsize=256)
def kernel_inputs(
    server: ServerConfig, options: ModelOptions
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The work vector, the options vector and log(i) that every kernel call on this server
    and variant takes, in one cache look-up."""
    return (
        work_options(options),
        kernel_options(server, options),
        occupancy_logs(server.max_batch_size),
    )


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
    variant adds the work terms of kernel/table.py to W_pref and W_dec."""
    n = np.array(n_tokens, dtype=np.float64).reshape(-1)
    m = np.array(m_tokens, dtype=np.float64).reshape(-1)
    work, opts, log_occ = kernel_inputs(server, options)
    states, row_values = kernel_table.build_states(
        n, m, params.alpha_ms, params.beta_ms, params.gamma_ms,
        float(server.max_num_batched_tokens), work, log_occ,
    )  # fmt: skip
    # Left writeable, as the kernel's input arrays (kernel_inputs): the kernels are compiled
    # for writeable arrays, which the lazy rows of one-shot calls are (kernel/table.py); a
    # read-only table would compile each of them again. Never written: a table is filled
    # whole, and the properties give read-only views.
    return StateTable(
        states=states,
        row_values=row_values,
        alpha_ms=params.alpha_ms,
        max_batch_size=server.max_batch_size,
        budget_tokens=server.max_num_batched_tokens,
        max_queue_size=server.max_queue_size,
        options=options,
        kernel_options=opts,
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


def rate_block(max_batch_size: int) -> int:
    """Rates solved together: at most RATE_BLOCK, and at most BLOCK_ELEMENTS work elements."""
    return max(1, min(RATE_BLOCK, BLOCK_ELEMENTS // (max_batch_size + 1)))


def evaluate(
    table: StateTable,
    rates_rps: FloatArray,
    synchronous: NDArray[np.bool_] | None = None,
    *,
    want_pmf: bool = False,
) -> tuple[FloatArray, FloatArray]:
    """Every mean output (kernel_mean's rows, FIELDS x rates) at each rate (req/s, 1-D; one per
    table row unless the table has a single row), and the chain's occupancy pmf per rate
    (rates x (B + 1); pi_i for i < B, P(i >= B) last) when asked."""
    rates = np.ascontiguousarray(rates_rps, dtype=np.float64)
    closed = np.zeros(rates.shape[0], dtype=np.bool_) if synchronous is None else synchronous
    out: tuple[FloatArray, FloatArray] = kernel_mean.evaluate(
        table.states, table.row_values, table.kernel_options, rates, closed, want_pmf
    )
    return out


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
