"""`vllm-sizer replay`: what would each autoscaling policy have done on this traffic?

The trace (or rate profile) is replayed on a simulated fleet whose parameters are the serving
truth, once per policy on the same arrivals; the report gives each policy's replica-hours and
how many windows met each target (exporter/replay/). Ctrl-C stops after the current window and
reports what was replayed (exit status 130), as does SIGTERM; a second one stops at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TextIO

import numpy as np

from exporter.base.errors import ConfigError
from exporter.cli.fit import read_observations
from exporter.cli.fleet_options import (
    MAX_CV,
    MAX_TOKENS,
    input_file,
    int_flag,
    number_flag,
    output_file,
)
from exporter.cli.replay_fleet import run_fleet_replay
from exporter.config.checks import UnusableConfigError
from exporter.daemon.statefile import StateFile
from exporter.replay.arrivals import DrawnArrivals, ProfileArrivals, load_rate_profile
from exporter.replay.engine import ArrivalSource, Step
from exporter.replay.fleet_setup import is_fleet_config
from exporter.replay.hindsight import fixed_best, scored
from exporter.replay.parallel import replay_parallel
from exporter.replay.policies import PolicyName
from exporter.replay.report import json_safe, plot, table
from exporter.replay.scaling import ScaleMode, independent_users
from exporter.replay.session import ReplayResult, replay, result_json
from exporter.replay.settings import ReplaySettings, load_settings
from exporter.replay.trace import TraceColumns, TraceError, TraceReader, Transform
from model import ServiceParams, Tuner, fit
from model.simulation.workloads import LengthDist, LengthKind

INTERRUPTED = 130  # the shell's status for a process stopped by SIGINT
PROGRESS_WIDTH = 30
PROGRESS_EVERY_S = 30.0  # wall time between two progress lines when stderr is not a terminal
MAX_SPEED = 1e6


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `replay` subcommand."""
    p = sub.add_parser("replay", help="replay a trace under several autoscaling policies",
                       description=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=input_file, metavar="FILE",
                        help="requests: arrival time, prompt tokens, output tokens per row; CSV "
                             "(Azure's TIMESTAMP,ContextTokens,GeneratedTokens, or see --columns) "
                             "or JSON Lines (timestamp ms, input_length, output_length), "
                             "plain or gzip")
    source.add_argument("--rate-profile", type=input_file, metavar="CSV",
                        help="time,rate rows (req/s), arrivals drawn on it with the length laws")
    p.add_argument("--config", type=input_file, required=True,
                   help="the sizer's config (the deployment as it would run), with an optional "
                        "`replay:` section (docs/getting-started/replay.md); or a mixed "
                        "fleet's, with a `fleet:` section (docs/validation/fleet.md)")
    p.add_argument("--deployment", help="the deployment to replay when the config has several")
    p.add_argument("--policy", type=_policies, default=",".join(n.value for n in PolicyName),
                   help="comma list of " + ", ".join(n.value for n in PolicyName))
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write replay.json and replay.png in this directory")
    p.add_argument("--columns", help="the trace's column names TIME,PROMPT,OUTPUT (a rate "
                                     "profile's: TIME,RATE)")
    p.add_argument("--speed", type=number_flag(0.0, MAX_SPEED, low_inclusive=False), default=1.0,
                   help="divide the trace's times by this (2: twice the rate in half the time)")
    p.add_argument("--window", type=_window, metavar="START:END",
                   help="replay only [START, END) seconds after the trace's first row")
    p.add_argument("--rate-scale", type=number_flag(0.0, 1000.0, low_inclusive=False),
                   default=1.0, help="scale the request rate (2: if traffic doubled)")
    p.add_argument("--scale-mode", choices=[m.value for m in ScaleMode],
                   default=ScaleMode.COPIES.value,
                   help="copies: each request k times, as bursty as the trace; users: k "
                        "time-shifted copies of the whole trace, smoother, as more independent "
                        "users make it (reads the trace whole)")
    p.add_argument("--no-fixed-best", action="store_true",
                   help="skip the search for the cheapest fixed fleet meeting every target in "
                        "97 %% of judged windows (it replays the arrivals once per N tried)")
    p.add_argument("--spread", type=number_flag(0.0, 3600.0), default=0.0, metavar="S",
                   help="spread each group of rows with one time over S seconds (a trace whose "
                        "times are quantized, e.g. 3 for the shared conversation trace)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip and count malformed rows instead of stopping at the first")
    p.add_argument("--seed", type=int_flag(0), default=0, help="random seed of the replay")
    p.add_argument("--price-per-replica-hour", type=number_flag(0.0, 1e6), metavar="PRICE",
                   help="report a cost per policy")
    truth = p.add_mutually_exclusive_group()
    truth.add_argument("--truth-state", type=input_file, metavar="FILE",
                       help="the serving truth: the calibration in a sizer's state file")
    truth.add_argument("--truth-fit", type=input_file, metavar="CSV",
                       help="the serving truth: fit the measured points of a `fit --csv` file")
    truth.add_argument("--truth-params", type=_params, metavar="ALPHA,BETA,GAMMA",
                       help="the serving truth in ms (default: the config's replay.truth)")
    p.add_argument("--input-tokens", type=number_flag(1.0, MAX_TOKENS),
                   default=_DEFAULTS["input_tokens"], help="rate profile: mean prompt length")
    p.add_argument("--output-tokens", type=number_flag(1.0, MAX_TOKENS),
                   default=_DEFAULTS["output_tokens"], help="rate profile: mean output length")
    p.add_argument("--lengths", choices=[k.value for k in LengthKind if k != LengthKind.EMPIRICAL],
                   default=_DEFAULTS["lengths"], help="rate profile: law of the lengths")
    p.add_argument("--length-cv", type=number_flag(0.0, MAX_CV), default=_DEFAULTS["length_cv"],
                   help="rate profile: CV of the lognormal lengths")
    p.add_argument("--interarrival-cv", type=number_flag(0.0, MAX_CV),
                   default=_DEFAULTS["interarrival_cv"],
                   help="rate profile: CV of the gaps between arrivals (1: Poisson)")
    p.add_argument("--jobs", type=int_flag(0, 256), default=0, metavar="N",
                   help="replay the policies in N processes (0: one per policy, at most one "
                        "per CPU; 1: in this process); the report is the same")
    p.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                   help="progress on stderr (auto: a bar on a terminal, else a line every "
                        f"{PROGRESS_EVERY_S:g} s; always: the bar)")
    p.set_defaults(func=run_replay, check=_check)


_PROFILE_ONLY = ("input_tokens", "output_tokens", "lengths", "length_cv", "interarrival_cv")


def _check(args: argparse.Namespace) -> str | None:
    """The length laws and arrival CV draw a rate profile's requests: a trace has its own."""
    if args.trace is None:
        if args.scale_mode != ScaleMode.COPIES.value:
            return "argument --scale-mode: only with --trace (a rate profile's arrivals are drawn)"
        return None
    given = [name for name in _PROFILE_ONLY if getattr(args, name) != _DEFAULTS[name]]
    if given:
        flag = "--" + given[0].replace("_", "-")
        return f"argument {flag}: only with --rate-profile (a trace has its own lengths)"
    return None


_DEFAULTS = {"input_tokens": 1024.0, "output_tokens": 512.0, "lengths": LengthKind.LOGNORMAL.value,
             "length_cv": 1.0, "interarrival_cv": 1.0}


def _policies(text: str) -> tuple[PolicyName, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = [n.value for n in PolicyName]
    bad = [n for n in names if n not in known]
    if not names or bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"must be distinct names among {', '.join(known)}, got {text!r}"
        )
    return tuple(PolicyName(n) for n in names)


def _window(text: str) -> tuple[float, float]:
    start, _, end = text.partition(":")
    try:
        low, high = float(start or 0), float(end) if end else math.inf
    except ValueError:
        low, high = math.nan, math.nan
    if not (0 <= low < high):
        raise argparse.ArgumentTypeError(f"must be START:END seconds with 0 <= START < END, "
                                         f"got {text!r}")
    return low, high


def _params(text: str) -> ServiceParams:
    try:
        values = [float(x) for x in text.split(",")]
        if len(values) != 3:
            raise ValueError(text)
        return ServiceParams(*values)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be three numbers > 0, ALPHA,BETA,GAMMA in ms, got {text!r}") from None


def _truth(args: argparse.Namespace, settings: ReplaySettings) -> ServiceParams:
    """The parameters the simulated fleet runs with (ValueError when none is given)."""
    if args.truth_params is not None:
        return args.truth_params  # type: ignore[no-any-return]
    if args.truth_fit is not None:
        result = fit(read_observations(args.truth_fit), settings.deployment.server)
        if not result.success:
            raise ValueError(f"--truth-fit {args.truth_fit}: the fit failed ({result.message})")
        return result.params
    if args.truth_state is not None:
        name = settings.deployment.name
        entry = StateFile(args.truth_state).load().get("deployments", {}).get(name)
        params = None if entry is None else Tuner.from_dict(entry["tuner"]).params
        if params is None:
            raise ValueError(f"--truth-state {args.truth_state}: no calibration of "
                             f"deployment {name!r} in it")
        return params
    if settings.truth is None:
        raise ValueError("the serving truth is missing: give --truth-params, --truth-fit, "
                         "--truth-state or the config's replay.truth")
    return settings.truth


def _arrivals(args: argparse.Namespace, transform: Transform,
              rng: np.random.Generator) -> tuple[ArrivalSource, int]:
    """The arrival source and the bad rows skipped so far (a profile is read whole)."""
    if args.trace is not None:
        columns = None if args.columns is None else TraceColumns.parse(args.columns)
        users = args.scale_mode == ScaleMode.USERS.value
        reader = TraceReader(args.trace, rng=rng, columns=columns,
                             transform=replace(transform, rate_scale=1.0) if users else transform,
                             skip_bad_rows=args.skip_bad_rows)
        if not users:
            return reader, 0
        with reader:
            whole = reader.until(math.inf)
        span_s = float(whole.arrival_s[-1]) + 1e-6
        scaled = independent_users(whole, transform.rate_scale, span_s, rng)
        return DrawnArrivals(scaled, rows=reader.rows), reader.bad_rows
    names = None
    if args.columns is not None:
        parts = [x.strip() for x in args.columns.split(",")]
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"--columns: a rate profile has two columns TIME,RATE, "
                             f"got {args.columns!r}")
        names = (parts[0], parts[1])
    profile, skipped = load_rate_profile(args.rate_profile, transform=transform, columns=names,
                                         skip_bad_rows=args.skip_bad_rows)
    kind = LengthKind(args.lengths)
    return ProfileArrivals(
        profile, rng, input_lengths=LengthDist(kind, args.input_tokens, cv=args.length_cv),
        output_lengths=LengthDist(kind, args.output_tokens, cv=args.length_cv),
        interarrival_cv=args.interarrival_cv,
    ), skipped  # fmt: skip


class Progress:
    """Simulated time done, wall time, and requests so far: a one-line bar redrawn every
    window on a terminal, else a line every `every_s` of wall time (a log stays short)."""

    def __init__(
        self,
        stream: TextIO,
        total_s: float | None,
        *,
        terminal: bool = True,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._total_s = total_s
        self._terminal = terminal
        self._every_s = every_s
        self._clock = clock
        self._began = clock()
        self._last = self._began

    def update(self, step: Step, result: ReplayResult) -> None:
        done_s = step.end_s
        now = self._clock()
        if not self._terminal and now - self._last < self._every_s:
            return
        self._last = now
        if self._total_s:
            share = min(done_s / self._total_s, 1.0)
            filled = int(share * PROGRESS_WIDTH)
            bar = f"[{'#' * filled}{'.' * (PROGRESS_WIDTH - filled)}] {100 * share:5.1f}% "
        else:
            bar = ""
        line = (f"{bar}{done_s / 60:.1f} min replayed, {result.arrivals} requests, "
                f"{now - self._began:.0f} s")
        self._stream.write(f"\r{line}" if self._terminal else f"replay: {line}\n")
        self._stream.flush()

    def close(self) -> None:
        if self._terminal:
            self._stream.write("\n")
            self._stream.flush()


def _total_s(args: argparse.Namespace, source: ArrivalSource) -> float | None:
    """The replay's length when it is known up front (a profile, or a trace's --window)."""
    if isinstance(source, ProfileArrivals):
        return source.profile.duration_s
    if isinstance(source, TraceReader):
        return source.span_s()
    return None


def run_replay(args: argparse.Namespace) -> int:
    """Replay, print the table, write the JSON and PNG; 2 on bad input, 130 when stopped."""
    quiet = logging.getLogger("exporter")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # INFO lines stay out of the printed report
    try:
        return _replay(args)
    finally:
        quiet.setLevel(level)


def _replay(args: argparse.Namespace) -> int:
    try:
        fleet = is_fleet_config(args.config)
    except (ConfigError, UnusableConfigError) as exc:
        print(f"vllm-sizer replay: {exc}", file=sys.stderr)
        return 2
    if fleet:
        window = args.window or (0.0, math.inf)
        transform = Transform(args.speed, args.rate_scale, window[0], window[1], args.spread)
        return run_fleet_replay(args, lambda rng: _arrivals(args, transform, rng)[0])
    try:
        settings = load_settings(args.config, args.deployment)
        truth = _truth(args, settings)
        window = args.window or (0.0, math.inf)
        transform = Transform(args.speed, args.rate_scale, window[0], window[1], args.spread)
        source, skipped = _arrivals(args, transform, np.random.default_rng(args.seed))
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            output_file(str(args.out / "replay.json"))
    except (ConfigError, UnusableConfigError) as exc:
        print(f"vllm-sizer replay: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError, argparse.ArgumentTypeError) as exc:
        print(f"vllm-sizer replay: {exc}", file=sys.stderr)
        return 2
    terminal = sys.stderr.isatty()
    show = args.progress == "always" or args.progress == "auto"
    progress = Progress(sys.stderr, _total_s(args, source),
                        terminal=terminal or args.progress == "always") if show else None
    stopping = _StopOnSignal()
    try:
        jobs = args.jobs or min(os.cpu_count() or 1, len(args.policy))
        if jobs > 1 and len(args.policy) > 1:
            result = replay_parallel(
                settings, truth, args.policy,
                lambda: _arrivals(args, transform, np.random.default_rng(args.seed))[0],
                jobs=jobs, on_step=None if progress is None else progress.update,
                stop=stopping.requested)
        else:
            result = replay(settings, truth, args.policy, source,
                            on_step=None if progress is None else progress.update,
                            stop=stopping.requested)
        if progress is not None:
            progress.close()
        report = result_json(result, args.price_per_replica_hour)
        if not (args.no_fixed_best or result.partial):
            if progress is not None:
                print("searching for the cheapest fixed fleet (one replay per N tried; "
                      "--no-fixed-best skips it)", file=sys.stderr)
            best = fixed_best(
                settings, truth,
                lambda: _arrivals(args, transform, np.random.default_rng(args.seed))[0],
                stop=stopping.requested)
            if stopping.requested():
                print("fixed-fleet search stopped: reported without it", file=sys.stderr)
            else:
                report = scored(report, best, args.price_per_replica_hour)
    except TraceError as exc:
        if progress is not None:
            progress.close()
        print(f"vllm-sizer replay: {exc}", file=sys.stderr)
        return 2
    finally:
        stopping.restore()
        if isinstance(source, TraceReader):
            source.close()
    # Read in another process (--jobs) or here.
    read = source if result.rows_read is None else result
    report["bad_rows_skipped"] = skipped + getattr(read, "bad_rows", 0)
    report["seed"] = args.seed
    report["input"] = _input(args, getattr(read, "rows_read" if read is result else "rows",
                                           None))
    report["options"] = _options(args)
    print(table(report))
    if report["bad_rows_skipped"]:
        print(f"{report['bad_rows_skipped']} malformed rows skipped")
    if args.out is not None:
        (args.out / "replay.json").write_text(json.dumps(json_safe(report), indent=1))
        plot(report, args.out / "replay.png")
        print(f"wrote {args.out / 'replay.json'} and {args.out / 'replay.png'}")
    return INTERRUPTED if result.partial or stopping.requested() else 0


def _input(args: argparse.Namespace, rows: int | None) -> dict[str, object]:
    """What was replayed, for the report's header."""
    return {
        "trace": None if args.trace is None else str(args.trace),
        "rate_profile": None if args.rate_profile is None else str(args.rate_profile),
        "rows_read": rows,
        "rate_scale": args.rate_scale,
        "scale_mode": args.scale_mode if args.trace is not None else "profile rates",
        "speed": args.speed,
        "window_s": list(args.window) if args.window is not None else None,
        "spread_s": args.spread,
        "prefix_reuse": "ignored (every prompt computed in full)",
    }


def _options(args: argparse.Namespace) -> dict[str, object]:
    """Every option as given or defaulted, JSON-safe."""
    out: dict[str, object] = {}
    for key, value in sorted(vars(args).items()):
        if callable(value):
            continue
        if isinstance(value, tuple | list):
            value = [str(v) for v in value]
        elif isinstance(value, Path | ServiceParams):
            value = str(value)
        out[key] = value
    return out


class _StopOnSignal:
    """The first SIGINT or SIGTERM asks the replay to stop after the current window (the
    report then says it is partial); a second one stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._asked = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._asked = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        print(f"\n{signal.Signals(signum).name}: stopping after this window (Ctrl-C again to "
              "abort)", file=sys.stderr)

    def requested(self) -> bool:
        return self._asked

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
