"""The replay suite: every autoscaling policy on traces that look like production, each judged
against the cheapest fixed fleet that meets every target (exporter/replay/hindsight.py).

For every trace: ours (the daemon's own loop), throughput (the decode-throughput analyzer),
reactive (KEDA on requests waiting, 5 per replica) and the hindsight-best fixed N; replicas
1-12, new ones serving 90 s after they are asked for, 30-s windows, judged from the first
startup delay on. Every fleet starts as if already running when the trace begins: each fixed
fleet of the search at its own N, and every policy at the N found (12 when none is). Started
at 1, a heavy trace builds per-replica queues that outlast the first startup delay and every
policy would be judged on that backlog. The serving truth is paper Table I, Llama-3.1-8B on
H100 (alpha 6.68 ms, beta 0.0201 ms, gamma 5.52e-5 ms), B = 256, M = 8192, KV capacity the
replay's default, lengths as the trace has them (no length scaling), prefix reuse ignored
(every prompt is computed in full; the shared trace's hash_ids are not read).

Targets, unless a trace says otherwise, come from the trace's own shape: mean TTFT 2x the
zero-load mean TTFT of its requests, trailing p95 TTFT 2x their zero-load p95 (4x the mean
request's, the other choice, misses by construction on the conversation trace's heavy-tailed
prompts), mean ITL 2x the zero-load ITL of its mean request; zero-load figures are measured
on one idle simulated replica (400 of the trace's requests, each alone). The constant-rate
family uses the targets of issue 36 (mean TTFT 200 ms, mean ITL 50 ms, p95 TTFT 500 ms), so
its rows read against that issue's table.

Traces: the real conversation trace (../shared/data/traces/mooncake-conversation.jsonl, or
$VLLM_SIZER_SHARED/data/...: its `timestamp` ms, `input_length` and `output_length`; the
quantized times spread over their 3 s) at its own rate, and x1.5 both as more independent
users (time-shifted copies of the whole trace) and as copies of each request; a bursty
synthetic trace (a 1 req/s Poisson background plus 1-s bursts of 20-60 requests every 5 s on
average: inter-arrival CV about 3); a diurnal day in 30 minutes; a step from 5 to 15 req/s;
constant Poisson loads of 6, 8, 10, 11, 12, 16 and 20 req/s for 20 minutes. Synthetic lengths
are lognormal, prompts mean 1024 tokens CV 1.5, outputs mean 256 CV 1.2.

Writes bench/results/replay_suite.json (per trace and policy: met_share, replica_hours,
handover_share, cost_ratio_vs_fixed_best, reversals, ...; an envelope with the commit, date,
machine, load average at start and end, and the command) and prints the table that
docs/validation/replay-suite.md holds (`--doc` rewrites that page from the JSON alone).

Run from the repository root: .venv/bin/python bench/replay_suite.py [--quick] [--jobs 2]
[--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.lib.envelope import start_run, with_run  # noqa: E402
from bench.lib.replay_suite_page import markdown  # noqa: E402
from bench.replay_trace import lognormal  # noqa: E402
from exporter.config.loader import parse_config  # noqa: E402
from exporter.replay.arrivals import DrawnArrivals  # noqa: E402
from exporter.replay.hindsight import fixed_best, scored  # noqa: E402
from exporter.replay.policies import PolicyName  # noqa: E402
from exporter.replay.report import json_safe  # noqa: E402
from exporter.replay.scaling import burstiness, independent_users  # noqa: E402
from exporter.replay.session import replay, result_json  # noqa: E402
from exporter.replay.settings import ReplaySettings, parse_replay  # noqa: E402
from exporter.replay.trace import TraceReader, Transform  # noqa: E402
from model.queueing.params import ServerConfig, ServiceParams  # noqa: E402
from model.simulation.simulator import Simulator  # noqa: E402
from model.simulation.workloads import (  # noqa: E402
    LengthDist,
    LengthKind,
    RateProfile,
    RateSegment,
    RequestTrace,
    draw_trace,
)

RESULTS = REPO_ROOT / "bench" / "results" / "replay_suite.json"
BASELINE = REPO_ROOT / "bench" / "results" / "replay_suite_baseline.json"
PAGE = REPO_ROOT / "docs" / "validation" / "replay-suite.md"
# The shared data folder beside the repository, as for the tests; VLLM_SIZER_SHARED overrides.
SHARED_DIR = Path(os.environ.get("VLLM_SIZER_SHARED", REPO_ROOT.parent / "shared"))
SHARED_TRACE = SHARED_DIR / "data" / "traces" / "mooncake-conversation.jsonl"
TRUTH = ServiceParams(6.68, 0.0201, 5.52e-5)  # paper Table I, Llama-3.1-8B on H100
SERVER = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
MAX_REPLICAS = 12
WINDOW_S = 30
STARTUP_S = 90
SEED = 37
POLICIES = (PolicyName.OURS, PolicyName.THROUGHPUT, PolicyName.REACTIVE)
ISSUE36_SLO = {"ttft_ms": 200.0, "itl_ms": 50.0, "ttft": {"p95_ms": 500.0}}
SCALED = 1.5  # the conversation trace x1.5 needs 4-8 replicas (its fixed best: see the JSON)
QUICK_S = 600.0  # --quick: the first ten minutes of every trace
ZERO_LOAD_SAMPLE = 400  # requests whose zero-load TTFT sets a trace's targets
ALONE_S = 1000.0  # apart: each request served alone
DERIVED = "the trace's shape (2x zero-load mean and p95 TTFT, 2x zero-load ITL)"


@dataclass(frozen=True, slots=True)
class Spec:
    """One trace of the suite: how it is made and how it is judged."""

    name: str
    about: str
    make: Callable[[np.random.Generator, float | None], RequestTrace]
    slo: dict[str, Any] | None = None  # None: derived from the trace's shape
    notes: dict[str, Any] = field(default_factory=dict)


def _with_lengths(times: np.ndarray, rng: np.random.Generator) -> RequestTrace:
    return RequestTrace(times, lognormal(rng, 1024, 1.5, times.size),
                        lognormal(rng, 256, 1.2, times.size))


def _profile(points: list[tuple[float, float]]) -> RateProfile:
    return RateProfile(tuple(RateSegment(t1 - t0, r0, r1)
                             for (t0, r0), (t1, r1) in zip(points, points[1:], strict=False)))


def _on_profile(points: list[tuple[float, float]]) -> Callable[..., RequestTrace]:
    def make(rng: np.random.Generator, limit_s: float | None) -> RequestTrace:
        profile = _profile(points)
        span = profile.duration_s if limit_s is None else min(limit_s, profile.duration_s)
        fixed = LengthDist(LengthKind.FIXED, 1)
        times = draw_trace(profile, fixed, fixed, rng, duration_s=span).arrival_s
        return _with_lengths(times, rng)
    return make


def _bursty(rng: np.random.Generator, limit_s: float | None) -> RequestTrace:
    span = 1800.0 if limit_s is None else min(limit_s, 1800.0)
    parts = [rng.uniform(0.0, span, rng.poisson(1.0 * span))]
    start = 0.0
    while (start := start + float(rng.exponential(5.0))) < span - 1.0:
        parts.append(start + rng.uniform(0.0, 1.0, int(rng.integers(20, 61))))
    return _with_lengths(np.sort(np.concatenate(parts)), rng)


def _diurnal_points(mean_rps: float, span_s: float, steps: int = 12) -> list[tuple[float, float]]:
    t = np.linspace(0.0, span_s, steps + 1)
    shape = 1.0 - 0.6 * np.cos(2 * math.pi * t / span_s)
    return [(float(a), float(b)) for a, b in zip(t, shape * mean_rps, strict=True)]


def _conversation(scale: float, mode: str) -> Callable[..., RequestTrace]:
    def make(rng: np.random.Generator, limit_s: float | None) -> RequestTrace:
        window_end = math.inf if limit_s is None else limit_s
        transform = Transform(rate_scale=scale if mode == "copies" else 1.0, spread_s=3.0,
                              window_end_s=window_end)
        with TraceReader(SHARED_TRACE, rng=rng, transform=transform) as reader:
            whole = reader.until(math.inf)
        if mode == "users":
            span = float(whole.arrival_s[-1]) + 1e-6
            return independent_users(whole, scale, span, rng)
        return whole
    return make


SPECS: tuple[Spec, ...] = (
    Spec("conversation-1x", "the shared conversation trace at its own rate (3.4 req/s, "
         "prompts 12k tokens)", _conversation(1.0, "copies")),
    Spec(f"conversation-x{SCALED:g}-users", f"the conversation trace x{SCALED:g} as more "
         "independent users (time-shifted copies of the whole trace)",
         _conversation(SCALED, "users")),
    Spec(f"conversation-x{SCALED:g}-copies", f"the conversation trace x{SCALED:g} as copies of "
         "each request (as bursty as the original)", _conversation(SCALED, "copies")),
    Spec("bursty", "1 req/s Poisson plus 1-s bursts of 20-60 requests every 5 s on average, "
         "30 min", _bursty),
    Spec("diurnal", "a day in 30 min: 10 req/s mean, 0.4x to 1.6x, piecewise linear",
         _on_profile(_diurnal_points(10.0, 1800.0))),
    Spec("step", "5 req/s for 10 min, then 15 req/s for 10 min",
         _on_profile([(0.0, 5.0), (600.0, 5.0), (600.001, 15.0), (1200.0, 15.0)])),
    *(Spec(f"constant-{rate:g}", f"Poisson at {rate:g} req/s for 20 min",
           _on_profile([(0.0, rate), (1200.0, rate)]), slo=ISSUE36_SLO,
           notes={"targets": "issue 36's"})
      for rate in (6.0, 8.0, 10.0, 11.0, 12.0, 16.0, 20.0)),
)


def zero_load_ms(input_tokens: np.ndarray, output_tokens: np.ndarray) -> tuple[np.ndarray,
                                                                                np.ndarray]:
    """TTFT and mean ITL (ms) of each request alone on one replica of the truth (the requests
    arrive far enough apart that none meets another)."""
    server = ServerConfig(max_batch_size=SERVER["max_num_seqs"],
                          max_num_batched_tokens=SERVER["max_num_batched_tokens"])
    sim = Simulator(TRUTH, server, replicas=1)
    n_out = np.maximum(output_tokens, 2)
    sim.add_requests(RequestTrace(np.arange(input_tokens.size) * ALONE_S, input_tokens, n_out))
    sim.run()
    req = sim.requests
    size = input_tokens.size
    ttft_s = req.first_token_s[:size] - req.arrival_s[:size]
    itl_s = (req.finish_s[:size] - req.first_token_s[:size]) / (n_out - 1)
    return ttft_s * 1000.0, itl_s * 1000.0


def derived_slo(trace: RequestTrace, rng: np.random.Generator) -> dict[str, Any]:
    """Mean TTFT 2x the zero-load mean over the trace's requests, p95 TTFT 2x their zero-load
    p95 (4x the mean request's would miss by construction on heavy-tailed prompts), mean ITL
    2x the zero-load ITL of its mean request."""
    pick = rng.choice(len(trace), size=min(len(trace), ZERO_LOAD_SAMPLE), replace=False)
    ttft, _ = zero_load_ms(trace.input_tokens[pick], trace.output_tokens[pick])
    _, itl = zero_load_ms(np.array([round(float(trace.input_tokens.mean()))]),
                          np.array([round(float(trace.output_tokens.mean()))]))
    return {"ttft_ms": round(2 * float(ttft.mean()), 1), "itl_ms": round(2 * float(itl[0]), 2),
            "ttft": {"p95_ms": round(2 * float(np.quantile(ttft, 0.95)), 1)}}


def settings_for(slo: dict[str, Any]) -> ReplaySettings:
    config = parse_config({
        "cycle_period_s": WINDOW_S,
        "deployments": [{
            "name": "llama-8b-vllm", "model_name": "meta-llama/Llama-3.1-8B-Instruct",
            "source": {"scrape_urls": ["http://vllm:8000/metrics"]}, "server": SERVER,
            "slo": slo, "replicas": {"min": 1, "max": MAX_REPLICAS}, "look_ahead_s": STARTUP_S,
        }],
    })  # fmt: skip
    section = {"truth": TRUTH.to_dict(), "startup_delay_s": STARTUP_S, "initial_replicas": 1,
               "reactive": {"metric": "waiting", "threshold": 5}}
    return parse_replay(section, config.deployments[0], config.cycle_period_s)


def shape(trace: RequestTrace) -> dict[str, Any]:
    gaps = np.diff(trace.arrival_s)
    span = float(trace.arrival_s[-1]) if len(trace) else 0.0
    return {
        "requests": len(trace), "span_s": span,
        "mean_rate_rps": len(trace) / span if span > 0 else None,
        "mean_input_tokens": float(trace.input_tokens.mean()),
        "mean_output_tokens": float(trace.output_tokens.mean()),
        "interarrival_cv": float(gaps.std() / gaps.mean()) if gaps.size > 1 else None,
        "count_cv_1s": burstiness(trace.arrival_s, 1.0),
        "count_cv_30s": burstiness(trace.arrival_s, 30.0),
    }  # fmt: skip


POLICY_FIELDS = ("met_share", "replica_hours", "handover_share", "cost_ratio_vs_fixed_best",
                 "reversals", "unready_replica_hours", "mean_replicas", "peak_replicas")


def run_trace(name: str, quick: bool) -> dict[str, Any]:
    """Every policy and the fixed-fleet search on one trace of the suite."""
    spec = next(s for s in SPECS if s.name == name)
    began, cpu_began = time.perf_counter(), time.process_time()
    trace = spec.make(np.random.default_rng(SEED), QUICK_S if quick else None)
    slo = spec.slo or derived_slo(trace, np.random.default_rng(SEED))
    settings = settings_for(slo)
    # Every fleet as if already running when the trace begins: the fixed ones at their own N,
    # the others from the N found (a fleet started at 1 under a heavy trace builds per-replica
    # queues that outlast the first startup delay, and every policy would be judged on them).
    best = fixed_best(settings, TRUTH, lambda: DrawnArrivals(trace), start_at_n=True)
    start = best.n if best.n is not None else MAX_REPLICAS
    settings = replace(settings, initial_replicas=start)
    result = replay(settings, TRUTH, POLICIES, DrawnArrivals(trace))
    report = scored(result_json(result, None), best, None)
    policies = {
        policy: {k: entry.get(k) for k in POLICY_FIELDS}
        | {"targets": {k: v["met_share"] for k, v in entry["targets"].items()},
           "reason_share": entry["reason_share"]}
        for policy, entry in report["policies"].items()
    }
    return json_safe({
        "name": name, "about": spec.about, "shape": shape(trace), "slo": slo,
        "targets_from": "issue 36" if spec.slo else DERIVED,
        "prefix_reuse": "ignored", "length_scaling": "none",
        "windows": report["windows"], "judged_windows": report["judged_windows"],
        "initial_replicas": start,
        "fixed_best_n": report["fixed_best_n"], "feasible": report["feasible"],
        "fixed_tried": report["tried"], "policies": policies,
        "wall_s": time.perf_counter() - began, "cpu_s": time.process_time() - cpu_began,
        **spec.notes,
    })  # fmt: skip


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _baseline() -> dict[str, Any] | None:
    """The recorded baseline run, if there is one."""
    return json.loads(BASELINE.read_text()) if BASELINE.exists() else None


def main(argv: list[str] | None = None) -> None:
    run_start = start_run()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"the first {QUICK_S:g} s of every trace (a smoke run)")
    parser.add_argument("--jobs", type=int, default=2, help="traces replayed at once")
    parser.add_argument("--only", help="comma list of trace names")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--doc", action="store_true",
                        help=f"only rewrite {PAGE.relative_to(REPO_ROOT)} from the JSON")
    args = parser.parse_args(argv)
    if args.doc:
        PAGE.write_text(markdown(json.loads(args.out.read_text()), _baseline()))
        print(f"wrote {PAGE}")
        return
    names = [s.name for s in SPECS]
    if args.only:
        names = [n.strip() for n in args.only.split(",")]
        unknown = sorted(set(names) - {s.name for s in SPECS})
        if unknown:
            raise SystemExit(f"unknown traces {unknown}; known: {[s.name for s in SPECS]}")
    load_start = os.getloadavg()
    began = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {n: pool.submit(run_trace, n, args.quick) for n in names}
        traces = []
        for n in names:
            traces.append(futures[n].result())
            print(f"{n}: done in {traces[-1]['wall_s']:.0f} s ({traces[-1]['cpu_s']:.0f} s "
                  "CPU)", flush=True)
    out = {
        "commit": _commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "load_average_start": list(load_start),
                    "load_average_end": list(os.getloadavg())},
        "command": " ".join(["python", "bench/replay_suite.py", *(argv or sys.argv[1:])]),
        "quick": args.quick, "jobs": args.jobs, "wall_s": time.perf_counter() - began,
        # What the run would take alone with `jobs` cores: the traces' CPU time shared out.
        "cpu_s": sum(t["cpu_s"] for t in traces),
        "truth_ms": TRUTH.to_dict(), "server": SERVER, "max_replicas": MAX_REPLICAS,
        "window_s": WINDOW_S, "startup_delay_s": STARTUP_S, "seed": SEED,
        "policies": [p.value for p in POLICIES] + ["fixed_best"],
        "traces": traces,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(with_run(run_start, out), indent=1) + "\n")
    print(markdown(out, _baseline()))
    print(f"wrote {args.out} in {out['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
