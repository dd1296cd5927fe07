"""`vllm-sizer replay` end to end on the shipped sample (tests/data/replay-sample.csv: ten
minutes, about 1800 requests): determinism, exact fixed-N cost, bad rows, progress, Ctrl-C."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli.fit import read_observations
from exporter.cli.main import main
from exporter.replay.trace import parse_time
from model import ServerConfig, fit
from tests.conftest import DATA_DIR, REPO_ROOT

TRACE = DATA_DIR / "replay-sample.csv"
CONFIG = DATA_DIR / "replay-sample.yaml"
WINDOW_S = 30.0


def _replay(out: Path, *extra: str, trace: Path = TRACE, config: Path = CONFIG,
            search: bool = False) -> int:
    """The command on the sample; the fixed-fleet search (a replay per N tried) only when
    `search`."""
    return main(["replay", "--trace", str(trace), "--config", str(config), "--out", str(out),
                 "--progress", "never", *([] if search else ["--no-fixed-best"]), *extra])


def _report(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "replay.json").read_text())
    return data


def _span_s(path: Path) -> float:
    with path.open() as fh:
        times = [parse_time(r["TIMESTAMP"]) for r in csv.DictReader(fh)]
    return times[-1] - times[0]


def test_same_trace_and_seed_give_the_same_report(tmp_path: Path) -> None:
    assert _replay(tmp_path / "a", "--seed", "3") == 0
    assert _replay(tmp_path / "b", "--seed", "3") == 0
    first, second = _report(tmp_path / "a"), _report(tmp_path / "b")
    first.pop("wall_s"), second.pop("wall_s")
    assert first["options"].pop("out") != second["options"].pop("out")
    assert first == second
    assert list(first["policies"]) == ["ours", "throughput", "reactive", "fixed"]
    assert first["arrivals"] > 1000 and not first["partial"]
    assert (tmp_path / "a" / "replay.png").stat().st_size > 10_000
    # A scaled rate is another draw: the seed matters where randomness is used.
    assert _replay(tmp_path / "c", "--seed", "3", "--rate-scale", "1.5", "--policy", "fixed") == 0
    assert _replay(tmp_path / "d", "--seed", "4", "--rate-scale", "1.5", "--policy", "fixed") == 0
    assert _report(tmp_path / "c")["arrivals"] != _report(tmp_path / "d")["arrivals"]


def test_fixed_replicas_cost_exactly_n_times_the_replayed_time(tmp_path: Path) -> None:
    assert _replay(tmp_path, "--policy", "fixed", "--price-per-replica-hour", "2") == 0
    report = _report(tmp_path)
    windows = math.floor(_span_s(TRACE) / WINDOW_S) + 1  # through the window of the last row
    assert report["windows"] == windows
    fixed = report["policies"]["fixed"]
    # From the initial count every policy starts at (1), then 3 from the first decision on.
    assert fixed["replica_hours"] == (1 + 3 * (windows - 1)) * WINDOW_S / 3600.0
    assert fixed["cost"] == 2 * fixed["replica_hours"]
    assert fixed["peak_replicas"] == 3
    assert report["series"]["fixed"]["provisioned"] == [1] + [3] * (windows - 1)


def _with_bad_row(tmp_path: Path) -> Path:
    lines = TRACE.read_text().splitlines()
    stamp = lines[100].split(",")[0]
    lines.insert(101, f"{stamp},12x,40")  # data row 101, line 102
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_malformed_row_stops_the_replay_naming_row_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _replay(tmp_path / "out", "--policy", "fixed", trace=_with_bad_row(tmp_path))
    assert status == 2
    err = capsys.readouterr().err
    assert "row 101 (line 102), column 'ContextTokens'" in err and "'12x'" in err
    assert not (tmp_path / "out" / "replay.json").exists()


def test_skip_bad_rows_counts_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _with_bad_row(tmp_path)
    assert _replay(tmp_path / "out", "--policy", "fixed", "--skip-bad-rows", trace=bad) == 0
    assert _report(tmp_path / "out")["bad_rows_skipped"] == 1
    assert "1 malformed rows skipped" in capsys.readouterr().out


def test_policies_in_two_processes_report_what_one_process_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--jobs 2 reads the trace in the processes: the rows read and the bad rows skipped are
    theirs, and a malformed row still stops the command with its row and column."""
    bad = _with_bad_row(tmp_path)
    for jobs in ("1", "2"):
        assert _replay(tmp_path / jobs, "--policy", "fixed,reactive", "--skip-bad-rows",
                       "--jobs", jobs, trace=bad) == 0
    one, two = _report(tmp_path / "1"), _report(tmp_path / "2")
    for report in (one, two):
        report.pop("wall_s"), report["options"].pop("out"), report["options"].pop("jobs")
    assert one == two
    assert two["bad_rows_skipped"] == 1 and two["input"]["rows_read"] > 1000
    capsys.readouterr()
    assert _replay(tmp_path / "stop", "--policy", "fixed,reactive", "--jobs", "2",
                   trace=bad) == 2
    assert "row 101 (line 102), column 'ContextTokens'" in capsys.readouterr().err


def test_missing_truth_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = yaml.safe_load(CONFIG.read_text())
    del config["replay"]["truth"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert _replay(tmp_path / "out", config=path) == 2
    assert "the serving truth is missing" in capsys.readouterr().err
    assert _replay(tmp_path / "out", "--policy", "fixed", "--truth-params", "6.68,0.0201,5.52e-5",
                   config=path) == 0


def test_rate_profile_input(tmp_path: Path) -> None:
    profile = tmp_path / "rate.csv"
    profile.write_text("time,rate\n0,2\n120,6\n240,2\n")
    status = main(["replay", "--rate-profile", str(profile), "--config", str(CONFIG),
                   "--policy", "reactive,fixed", "--out", str(tmp_path / "out"),
                   "--progress", "never"])
    assert status == 0
    report = _report(tmp_path / "out")
    assert report["windows"] == 8 and 700 < report["arrivals"] < 1300


def _start(tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "exporter.cli.main", "replay", "--trace", str(TRACE),
         "--config", str(CONFIG), "--out", str(tmp_path), "--progress", "always"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_progress_bar_and_ctrl_c_or_sigterm_gives_a_partial_report(
    tmp_path: Path, stop: signal.Signals
) -> None:
    proc = _start(tmp_path)
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + 120
    while "min replayed" not in seen and time.monotonic() < deadline:
        seen += proc.stderr.read(1)
    assert "[#" in seen or "[." in seen, seen  # a bar with its share done
    proc.send_signal(stop)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert out.startswith("partial replay:")
    assert "stopping after this window" in err
    report = _report(tmp_path)
    assert report["partial"] is True
    assert 1 <= report["windows"] < math.floor(_span_s(TRACE) / WINDOW_S) + 1
    assert report["policies"]["fixed"]["windows"] == report["windows"]


def test_length_laws_are_refused_with_a_trace(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["replay", "--trace", str(TRACE), "--config", str(CONFIG), "--input-tokens", "100"])
    assert caught.value.code == 2
    assert "argument --input-tokens: only with --rate-profile" in capsys.readouterr().err


def test_the_truth_from_a_state_file_or_a_fit(tmp_path: Path) -> None:
    tuner = json.loads((DATA_DIR / "tuner-state-before-prior.json").read_text())
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"version": 1, "state": {"deployments": {
        "llama-8b-vllm": {"tuner": tuner, "recommender": {}, "workload": None}}}}))
    assert _replay(tmp_path / "s", "--policy", "fixed", "--window", "0:60",
                   "--truth-state", str(state)) == 0
    assert _report(tmp_path / "s")["truth_ms"] == tuner["params"]
    with (DATA_DIR / "h100-grid.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh)
                if r["model"].startswith("Llama") and r["in_paper_fit"] == "1"]
    points = tmp_path / "points.csv"
    with points.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert _replay(tmp_path / "f", "--policy", "fixed", "--window", "0:60",
                   "--truth-fit", str(points)) == 0
    fitted = fit(read_observations(points), ServerConfig(256, 8192)).params  # what `fit` says
    assert _report(tmp_path / "f")["truth_ms"] == fitted.to_dict()
    assert fitted.alpha_ms == pytest.approx(6.68, rel=0.05)  # near paper Table I's


def test_report_echoes_its_input_and_prices_every_policy_against_the_fixed_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _replay(tmp_path, "--policy", "reactive,fixed", "--window", "0:300",
                   "--rate-scale", "2", "--scale-mode", "users", search=True) == 0
    report = _report(tmp_path)
    given = report["input"]
    assert given["trace"] == str(TRACE) and given["scale_mode"] == "users"
    assert given["rate_scale"] == 2.0 and given["rows_read"] > 0
    assert report["options"]["scale_mode"] == "users" and report["options"]["seed"] == 0
    assert report["mean_input_tokens"] > 1 and report["mean_output_tokens"] > 1
    best = report["fixed_best_n"]
    assert best is not None and report["feasible"] and str(best) in report["tried"]
    assert report["policies"]["fixed_best"]["replicas"] == best
    assert report["policies"]["fixed_best"]["cost_ratio_vs_fixed_best"] == 1.0
    fixed = report["policies"]["fixed"]
    assert fixed["cost_ratio_vs_fixed_best"] == pytest.approx(
        fixed["replica_hours"] / report["policies"]["fixed_best"]["replica_hours"])
    out = capsys.readouterr().out
    assert "rate x2 (users)" in out and "fixed fleet meeting every target" in out
    assert "windows in hand-over" in out and "reversals of the count" in out


def test_independent_users_need_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "rate.csv"
    profile.write_text("time,rate\n0,1\n60,1\n")
    with pytest.raises(SystemExit):
        main(["replay", "--rate-profile", str(profile), "--config", str(CONFIG),
              "--scale-mode", "users"])
    assert "--scale-mode: only with --trace" in capsys.readouterr().err


def test_progress_off_a_terminal_is_a_line_at_a_low_rate() -> None:
    import io

    from exporter.cli.replay import Progress

    now = [0.0]
    stream = io.StringIO()
    progress = Progress(stream, 600.0, terminal=False, every_s=30.0, clock=lambda: now[0])
    step = type("S", (), {"end_s": 0.0})()
    result = type("R", (), {"arrivals": 0})()
    for k in range(1, 121):  # two minutes of wall time, one window a second
        now[0] = float(k)
        step.end_s = 30.0 * k  # type: ignore[attr-defined]
        progress.update(step, result)  # type: ignore[arg-type]
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in stream.getvalue()
    assert lines[0].startswith("replay: [") and lines[-1].endswith("requests, 120 s")
