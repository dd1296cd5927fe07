"""The metrics reference page (docs/reference/metrics.md) says exactly what the code exports:
every metric has a row, and each label's values are the members of its enumeration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.daemon.operation_metrics import CycleOutcome
from tests.conftest import REPO_ROOT
from tools.docs_gen.metrics import LABEL_ENUMS, exported_name, families

METRICS_PAGE = REPO_ROOT / "docs" / "reference" / "metrics.md"
CONFIG_PAGE = REPO_ROOT / "docs" / "reference" / "configuration.md"


def section(title: str, page: Path = METRICS_PAGE) -> str:
    """The part of `page` from the heading `title` to the next heading of level 1 to 3."""
    text = "\n" + page.read_text()
    start = text.index(f"\n{title}\n")
    following = re.search(r"\n#{1,3} ", text[start + len(title) + 2 :])
    end = start + len(title) + 2 + (following.start() if following else len(text))
    return text[start:end]


def table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows[1:] if rows else rows  # the header


def label_table(text: str) -> dict[str, set[str]]:
    return {
        row[0].strip("`"): set(re.findall(r"`([a-z_]+)`", row[1])) for row in table_rows(text)
    }


def exported_names() -> set[str]:
    return {exported_name(family) for family in families()}


def test_label_values_table_lists_exactly_each_enumeration() -> None:
    documented = label_table(section("## Label values"))
    assert set(documented) == set(LABEL_ENUMS)
    for key, enum in LABEL_ENUMS.items():
        assert documented[key] == {member.value for member in enum}, key


def test_every_exported_metric_has_a_readme_row() -> None:
    rows = table_rows(section("# Exported metrics"))
    documented = {name for row in rows for name in re.findall(r"vllm_sizer_\w+", row[0])}
    assert exported_names() - documented == set()
    assert documented - exported_names() == set(), "the page lists a metric the code lacks"


def test_the_comparison_notices_a_missing_value() -> None:
    documented = label_table("| metric and label | values |\n|---|---|\n| `x{y}` | `ok` |\n")
    assert documented == {"x{y}": {"ok"}}
    assert documented["x{y}"] != {m.value for m in CycleOutcome}


@pytest.mark.parametrize("name", ["vllm_sizer_predicted_ttft_seconds"])
def test_readme_warns_against_scaling_on_infinite_predictions(name: str) -> None:
    (row,) = [r for r in table_rows(section("# Exported metrics")) if name in r[0]]
    assert "never scale on these" in row[1]
