"""The troubleshooting page explains every value of every exported state and reason label: a value
the code gains (another reason, a new state) fails here until the page has its row."""

from __future__ import annotations

import re
from enum import StrEnum

import yaml

from tests.conftest import REPO_ROOT
from tests.test_readme_metrics import table_rows
from tools.docs_gen.metrics import LABEL_ENUMS

PAGE = REPO_ROOT / "docs" / "operate" / "troubleshooting.md"
READS_PAGE = REPO_ROOT / "docs" / "operate" / "troubleshooting-reads.md"
ALERTS = REPO_ROOT / "config" / "prometheus" / "vllm-sizer-alerts.yaml"
# The labels an operator meets as a state or a reason: each has a section on the page.
EXPLAINED = (
    "vllm_sizer_tuner_state{state}",
    "vllm_sizer_tuner_reason{reason}",
    "vllm_sizer_recommendation_reason{reason}",
    "vllm_sizer_fleet_plan_reason{reason}",
    "vllm_sizer_scrape_errors_total{reason}",
    "vllm_sizer_observation_problems_total{problem}",
    "vllm_sizer_forecaster{forecaster}",
)


def explained(text: str) -> dict[str, dict[str, list[str]]]:
    """metric{label} of each `## ... (`metric{label}`)` section -> value -> [meaning, action]."""
    out: dict[str, dict[str, list[str]]] = {}
    for part in re.split(r"\n(?=## )", text):
        heading = re.match(r"## .*\(`([a-z_]+\{[a-z_]+\})`\)", part)
        if heading:
            rows = table_rows(part)
            out[heading.group(1)] = {row[0].strip("`"): row[1:] for row in rows}
    return out


def test_every_state_and_reason_value_has_a_meaning_and_an_action() -> None:
    sections = explained(PAGE.read_text() + "\n" + READS_PAGE.read_text())
    for key in EXPLAINED:
        enum: type[StrEnum] = LABEL_ENUMS[key]
        assert key in sections, f"troubleshooting.md: no section for {key}"
        rows = sections[key]
        values = {member.value for member in enum}
        assert values - set(rows) == set(), f"{key}: values without a troubleshooting row"
        assert set(rows) - values == set(), f"{key}: rows for values the code lacks"
        for value, cells in rows.items():
            assert len(cells) == 2 and all(c.strip() for c in cells), f"{key} {value}: {cells}"


def test_every_shipped_alert_has_a_row() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    alerts = {r["alert"] for group in rules["groups"] for r in group["rules"] if "alert" in r}
    assert len(alerts) >= 7
    text = PAGE.read_text()
    section = text[text.index("## Alerts") : text.index("## Tuner state")]
    rows = {row[0].strip("`") for row in table_rows(section)}
    assert rows == alerts


def test_the_check_notices_a_missing_row() -> None:
    page = "## Tuner state (`vllm_sizer_tuner_state{state}`)\n\n| value | meaning | what to do |\n"
    page += "|---|---|---|\n| `warming` | no estimate yet, wait | wait for windows |\n"
    rows = explained(page)["vllm_sizer_tuner_state{state}"]
    states = {m.value for m in LABEL_ENUMS["vllm_sizer_tuner_state{state}"]}
    assert set(rows) == {"warming"} != states
