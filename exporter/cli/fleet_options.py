"""Flag value types of every subcommand, and the options `simulate` and `emulate` share: the
replicas' parameters, server and workload.

A bad value is refused while parsing, so argparse reports it the usual way, naming the flag
(`vllm-sizer emulate: error: argument --rate-rps: must be ...`, exit code 2); the bounds keep
every run finite in memory and time.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exporter.config.values import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, MAX_QUEUE_SIZE
from model.queueing.params import ServerConfig, ServiceParams
from model.simulation.modulation import modulated_profile
from model.simulation.simulator import Router
from model.simulation.workloads import LengthDist, LengthKind, LengthPairs, RateProfile

# Paper Table I, Llama-3.1-8B on H100 (ms).
DEFAULT_PARAMS = ServiceParams(alpha_ms=6.68, beta_ms=2.01e-2, gamma_ms=5.52e-5)

MAX_PARAM_MS = 1e6  # alpha, beta, gamma: far above any GPU's, still finite through the model
MAX_TARGET_MS = 1e7  # an SLO target of hours
MAX_TOKENS = 1 << 20  # a mean prompt or output of a million tokens
MAX_CV = 10.0
MAX_RATE_RPS = 10_000.0  # per load of one run (simulate, emulate)
MAX_TOTAL_RPS = 1e6  # a whole fleet's load (plan --load)
MAX_REPLICAS = 1_000  # simulated or emulated; each emulated one serves its own port
MAX_DURATION_S = 1e6  # simulated or wall seconds of one run
MAX_TIME_SCALE = 1_000.0  # simulated seconds per wall second an emulator keeps up with
MAX_KV_TOKENS = 10**9
MAX_BURST_RATIO = 1_000.0
MAX_PREFIX_HIT_SHARE = 0.99  # at least one prompt token is always computed
MAX_LENGTH_PAIRS = 10_000_000  # rows of a --lengths-csv file


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def number_flag(low: float, high: float, *, low_inclusive: bool = True) -> Callable[[str], float]:
    """An argparse `type`: a finite number in [low, high] (low excluded unless `low_inclusive`)."""
    rule = f"{'>=' if low_inclusive else '>'} {low:g} and <= {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan  # not a number: refused below, in the same words
        inside = value >= low if low_inclusive else value > low
        if not (math.isfinite(value) and inside and value <= high):
            raise argparse.ArgumentTypeError(f"must be a number {rule}, got {_shown(text)}")
        return value

    return parse


def int_flag(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse `type`: an integer in [low, high] (no upper bound when `high` is None)."""
    rule = f">= {low}" + ("" if high is None else f" and <= {high}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1  # not an integer: refused below, in the same words
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {rule}, got {_shown(text)}")
        return value

    return parse


def output_file(text: str) -> Path:
    """An argparse `type`: a file to write, in an existing writable directory (checked before
    a run that may take minutes, not after it)."""
    path = Path(text)
    parent = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{_shown(text)} is a directory")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in directory {_shown(str(parent))}")
    return path


def input_file(text: str) -> Path:
    """An argparse `type`: an existing, readable file."""
    path = Path(text)
    if not path.is_file() or not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a readable file")
    return path


class _RenamedFlag(argparse.Action):
    """A flag's former name, accepted for one release without appearing in --help: it stores into
    the new flag's destination and says the new name on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new_flag: str,
                 **kwargs: Any) -> None:
        self.new_flag = new_flag
        super().__init__(option_strings, dest, help=argparse.SUPPRESS,
                         default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.new_flag}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed_flag(p: argparse.ArgumentParser, old: str, new: argparse.Action) -> None:
    """Accept `old` as a hidden alias of the flag `new` (same value type and destination)."""
    p.add_argument(old, action=_RenamedFlag, dest=new.dest, metavar=new.metavar,
                   type=new.type or str, choices=new.choices, new_flag=new.option_strings[0])


def add_server_limits(p: argparse.ArgumentParser) -> argparse.Action:
    """Add vLLM's two scheduler limits under vLLM's own flag names (every subcommand that
    models a server); returns the --max-num-seqs action."""
    seqs = p.add_argument("--max-num-seqs", type=int_flag(1, MAX_NUM_SEQS), default=256,
                          help="vLLM's --max-num-seqs: requests in a batch at most")
    p.add_argument("--max-num-batched-tokens", type=int_flag(1, MAX_NUM_BATCHED_TOKENS),
                   default=8192, help="vLLM's --max-num-batched-tokens: tokens per iteration")
    return seqs


def add_fleet_options(p: argparse.ArgumentParser) -> None:
    """Add the options for the replicas' parameters, server, workload and routing."""
    param = number_flag(0.0, MAX_PARAM_MS, low_inclusive=False)
    tokens = number_flag(1.0, MAX_TOKENS)
    cv = number_flag(0.0, MAX_CV)
    p.add_argument("--alpha-ms", type=param, default=DEFAULT_PARAMS.alpha_ms,
                   help="per-iteration overhead, ms (the defaults of the three parameters: "
                        "paper Table I, Llama-3.1-8B on an H100)")
    p.add_argument("--beta-ms", type=param, default=DEFAULT_PARAMS.beta_ms,
                   help="compute time per token in an iteration, ms")
    p.add_argument("--gamma-ms", type=param, default=DEFAULT_PARAMS.gamma_ms,
                   help="KV-cache read time per cached token in an iteration, ms")
    add_renamed_flag(p, "--max-batch-size", add_server_limits(p))
    p.add_argument("--max-queue-size", type=int_flag(0, MAX_QUEUE_SIZE),
                   help="reject arrivals beyond this many waiting requests (default: unbounded)")
    p.add_argument("--input-tokens", type=tokens, default=1024.0, help="mean prompt length")
    p.add_argument("--output-tokens", type=tokens, default=512.0, help="mean output length")
    p.add_argument("--lengths", choices=[k.value for k in LengthKind if k != LengthKind.EMPIRICAL],
                   default=LengthKind.UNIFORM.value,
                   help="law of request lengths around the means (uniform: [x/2, 3x/2])")
    p.add_argument("--length-cv", type=cv, default=0.5,
                   help="coefficient of variation of the lognormal law")
    p.add_argument("--interarrival-cv", type=cv, default=1.0,
                   help="coefficient of variation of inter-arrival times: 0 constant, 1 Poisson")
    p.add_argument("--lengths-csv", type=input_file, metavar="PATH",
                   help="draw (prompt, output) pairs jointly from a CSV with columns "
                   "input_tokens, output_tokens, instead of --lengths")
    p.add_argument("--burst-ratio", type=number_flag(1.0, MAX_BURST_RATIO), default=1.0,
                   help="two-rate modulated arrivals: high over low rate at the same mean "
                   "(1: off)")
    p.add_argument("--burst-period-s", type=number_flag(0.0, MAX_DURATION_S, low_inclusive=False),
                   default=60.0, help="mean time at each rate of the modulated arrivals, s")
    p.add_argument("--prefix-hit-share", type=number_flag(0.0, MAX_PREFIX_HIT_SHARE),
                   default=0.0, help="share of every prompt served from the prefix cache")
    p.add_argument("--paper-profile", type=number_flag(0.0, MAX_RATE_RPS, low_inclusive=False),
                   metavar="BASE_RPS",
                   help="follow the paper's 44-minute ramp (Table IV) from this baseline, req/s, "
                        "instead of a constant rate")
    p.add_argument("--replicas", type=int_flag(1, MAX_REPLICAS), default=1,
                   help="replicas sharing the load")
    p.add_argument("--router", choices=[r.value for r in Router], default=Router.LEAST_LOADED.value,
                   help="how each request picks its replica")
    p.add_argument("--kv-capacity-tokens", type=int_flag(1, MAX_KV_TOKENS),
                   help="KV cache per replica, tokens (default: unlimited in simulate, 449200 in "
                        "emulate: Llama-3.1-8B on one H100)")
    p.add_argument("--seed", type=int_flag(0), default=0, help="random seed of the workload")


def parse_fleet_options(
    args: argparse.Namespace,
) -> tuple[ServiceParams, ServerConfig, LengthDist, LengthDist]:
    """The parameters, server and input and output length laws the fleet options give."""
    params = ServiceParams(args.alpha_ms, args.beta_ms, args.gamma_ms)
    server = ServerConfig(args.max_num_seqs, args.max_num_batched_tokens, args.max_queue_size)
    kind = LengthKind(args.lengths)
    return (
        params,
        server,
        LengthDist(kind, args.input_tokens, cv=args.length_cv),
        LengthDist(kind, args.output_tokens, cv=args.length_cv),
    )


@dataclass(frozen=True, slots=True)
class TrafficOptions:
    """The realistic-traffic options: recorded length pairs, prefix-cache hits, modulated
    arrivals (a burst ratio of 1 is off)."""

    pairs: LengthPairs | None
    prefix_hit_share: float
    burst_ratio: float
    burst_period_s: float

    def profile(self, rate_rps: float, duration_s: float, rng: np.random.Generator) -> RateProfile:
        """The arrival rate over `duration_s`: constant, or modulated between two rates."""
        if self.burst_ratio == 1.0:
            return RateProfile.constant(rate_rps, duration_s)
        return modulated_profile(
            rate_rps, duration_s, rng, ratio=self.burst_ratio, period_s=self.burst_period_s
        )


def parse_traffic_options(args: argparse.Namespace) -> TrafficOptions:
    """The realistic-traffic options (ValueError naming the file if --lengths-csv is bad)."""
    pairs = None if args.lengths_csv is None else load_length_pairs(args.lengths_csv)
    return TrafficOptions(pairs, args.prefix_hit_share, args.burst_ratio, args.burst_period_s)


def check_traffic_options(args: argparse.Namespace) -> str | None:
    """Modulation needs a constant base rate: the paper profile has its own shape."""
    if args.burst_ratio != 1.0 and args.paper_profile is not None:
        return "argument --burst-ratio: cannot modulate --paper-profile (use a constant rate)"
    return None


def load_length_pairs(path: Path) -> LengthPairs:
    """(prompt, output) token counts from a CSV with columns input_tokens, output_tokens."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if len(rows) > MAX_LENGTH_PAIRS:
        raise ValueError(f"{path}: more than {MAX_LENGTH_PAIRS} rows")
    try:
        return LengthPairs(
            np.array([int(r["input_tokens"]) for r in rows], dtype=np.int64),
            np.array([int(r["output_tokens"]) for r in rows], dtype=np.int64),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{path}: length pairs need integer columns input_tokens, output_tokens >= 1 ({exc})"
        ) from exc
