"""docs/validation/forecast.md: bench/forecast.py's table, every forecaster as a variant of our
sizer on the same judged windows, read from bench/results/forecast.json."""

from __future__ import annotations

import json

from tools.docs_gen.config_keys import HEADER
from tools.docs_gen.figures import RESULTS

PAGE = "docs/validation/forecast.md"
TRACES = {
    "diurnal": "diurnal, a day in an hour",
    "conversation": "conversation trace x1.5",
    "bursty": "bursty",
    "flat": "flat 16 req/s",
}
ARMS = {
    "last_value": "last value",
    "linear_trend": "linear trend",
    "kalman": "Kalman",
    "holt_winters": "Holt-Winters",
    "upper_quantile": "upper quantile",
    "auto": "auto",
}


def render() -> str:
    data = json.loads((RESULTS / "forecast.json").read_text())
    lines = [
        HEADER,
        "# Forecasters on replay: the table",
        "",
        "What the figures mean and when a forecast pays: "
        "[forecasting](../concepts/forecasting.md). Each cell: replica-hours, then judged "
        "windows missed / judged (`bench/forecast.py`, `bench/results/forecast.json`).",
        "",
        "| case (startup delay) | " + " | ".join(ARMS.values()) + " |",
        "|---|" + "---|" * len(ARMS),
    ]
    for case in data["cases"]:
        arms = case["arms"]
        cells = [
            f"{a['replica_hours']:.2f} h, {a['windows_missed']} / {a['judged_windows']}"
            for a in (arms[f"ours-{key}"] for key in ARMS)
        ]
        label = f"{TRACES[case['trace']]} ({case['startup_delay_s']:.0f} s)"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for case in data["cases"]:
        matched = case.get("matched")
        if matched:
            lines += [
                "",
                f"Cost-matched on {case['name']}: the last value with a rate margin of "
                f"{matched['rate_margin_sigmas']:.2f} standard errors, "
                f"{matched['replica_hours']:.2f} h, {matched['windows_missed']} / "
                f"{matched['judged_windows']} windows missed.",
            ]
            above = matched.get("at_least_target")
            if above and above["rate_margin_sigmas"] != matched["rate_margin_sigmas"]:
                lines[-1] += (
                    f" Given no fewer replica-hours than `auto` (a margin of "
                    f"{above['rate_margin_sigmas']:.2f}, {above['replica_hours']:.2f} h), "
                    f"it missed {above['windows_missed']}."
                )
    return "\n".join(lines) + "\n"
