"""Every subcommand refuses a bad flag value the argparse way: exit code 2 and an error line
naming the flag (not an internal parameter), never a traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.cli.main import main

POINTS = "rate_rps,avg_input_tokens,avg_output_tokens,ttft_ms,itl_ms\n1,1000,500,40,8\n"

# Arguments that keep a run short in case a value were wrongly accepted.
QUICK = {
    "plan": [],
    "fit": ["--csv", "{csv}"],
    "simulate": ["--rates", "1", "--duration-s", "20", "--warmup-s", "1"],
    "emulate": ["--stop-after-s", "0.5"],
    "demo": ["--minutes", "0.5", "--time-scale", "100", "--out", "{tmp}"],
}
FLEET = [
    ("--alpha-ms", ["-1", "0", "nan", "inf", "1e7"]),
    ("--beta-ms", ["-1", "0", "nan", "1e7"]),
    ("--gamma-ms", ["-1", "0", "inf", "1e7"]),
    ("--max-num-seqs", ["0", "-1", "16385", "1.5"]),
    ("--max-batch-size", ["0", "16385"]),  # the former name, still checked
    ("--max-num-batched-tokens", ["0", "16777217"]),
    ("--max-queue-size", ["-1", "100001"]),
    ("--input-tokens", ["0", "-1", "nan", "2e6"]),
    ("--output-tokens", ["0", "nan", "2e6"]),
    ("--length-cv", ["-1", "nan", "11"]),
    ("--interarrival-cv", ["-1", "nan", "11"]),
    ("--paper-profile", ["-1", "0", "nan", "1e5"]),
    ("--replicas", ["0", "-1", "1001"]),
    ("--kv-capacity-tokens", ["0", "-1", "1e3"]),
    ("--seed", ["-1", "x"]),
]
CASES: list[tuple[str, str, list[str]]] = [
    *[("plan", f, v) for f, v in [
        ("--alpha-ms", ["-1", "0", "nan", "inf", "1e308"]),
        ("--beta-ms", ["0", "nan", "1e308"]),
        ("--gamma-ms", ["0", "-inf", "1e308"]),
        ("--input-tokens", ["-1", "nan", "1e308"]),
        ("--output-tokens", ["0", "nan", "1e308"]),
        ("--ttft-ms", ["0", "-1", "nan", "inf", "1e308"]),
        ("--itl-ms", ["0", "nan", "1e308"]),
        ("--slo", ["ttft.p101_ms=5", "ttft.p95_ms=0", "ttft.p95_ms=nan", "itl.kind=x", "ttft",
                   "p95_ms=3", "ttft.mean_ms=5 --ttft-ms 6", "ttft.p95=1"]),
        ("--max-num-seqs", ["0", "-1", "16385", "1e3"]),
        ("--preset", ["gpt"]),
        ("--max-num-batched-tokens", ["0", "16777217"]),
        ("--load", ["-1 2", "nan 2", "0 1e300", "5 1"]),
        ("--png", ["/nonexistent/dir/x.png"]),
    ]],
    *[("fit", f, v) for f, v in [
        ("--max-num-seqs", ["0", "16385"]),
        ("--max-num-batched-tokens", ["0", "-5"]),
        ("--png", ["/nonexistent/dir/x.png"]),
    ]],
    ("fit", "--csv", ["/nonexistent/points.csv"]),
    *[("simulate", f, v) for f, v in FLEET],
    *[("simulate", f, v) for f, v in [
        ("--rates", ["0", "-1", "abc", "nan", "1,,x", "20000"]),
        ("--duration-s", ["0", "-1", "nan", "2e6", "101 --rates 10000"]),  # 1e6 requests
        ("--paper-profile", ["200"]),  # the 44-minute ramp draws 6420 x 200 requests
        ("--warmup-s", ["-1", "nan", "30"]),  # 30: not before the 20 s of arrivals end
        ("--max-num-batched-tokens", ["1 --input-tokens 1048576"]),  # 1M prefill iterations each
        ("--trace", ["/nonexistent/trace.csv"]),
        ("--csv", ["/nonexistent/dir/out.csv"]),
    ]],
    *[("emulate", f, v) for f, v in FLEET],
    *[("emulate", f, v) for f, v in [
        ("--rate-rps", ["-1", "nan", "20000"]),
        ("--time-scale", ["0", "-1", "nan", "1001"]),
        ("--base-port", ["0", "70000", "65535 --replicas 2"]),
        ("--stop-after-s", ["-1", "nan"]),
        ("--duration-s", ["-1"]),  # the former name of --stop-after-s
    ]],
    *[("demo", f, v) for f, v in [
        ("--time-scale", ["0", "-1", "nan", "1e12"]),
        ("--minutes", ["0", "-5", "nan", "45"]),
        ("--seed", ["-1"]),
        ("--port", ["-1", "70000"]),
        ("--out", ["/proc/no/such/dir"]),
    ]],
]  # fmt: skip
PARAMS = [(cmd, flag, value) for cmd, flag, values in CASES for value in values]


@pytest.mark.parametrize(("command", "flag", "value"), PARAMS)
def test_a_bad_flag_value_is_an_argparse_error_naming_the_flag(
    command: str,
    flag: str,
    value: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    csv = tmp_path / "points.csv"
    csv.write_text(POINTS)
    quick = [a.format(csv=csv, tmp=tmp_path / "out") for a in QUICK[command]]
    # The flag's value last, so that it overrides the quick one.
    try:
        code = main([command, *quick, flag, *value.split()])
    except SystemExit as exc:  # argparse's way
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert re.match(rf"vllm-sizer {command}: error: argument {flag}: ", last), err


def test_plan_without_targets_says_it_sizes_to_saturation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "no --ttft-ms or --itl-ms given, so sized to saturation capacity" in out
    assert main(["plan", "--ttft-ms", "100"]) == 0
    assert "saturation capacity" not in capsys.readouterr().out
