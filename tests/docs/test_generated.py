"""The generated pages (`python -m tools.docs_gen`) match the code and the bench JSON they are
built from: a change to either without rerunning the generator fails here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from exporter.cli import main as cli_main
from tools import docs_gen
from tools.docs_gen import config_keys, figures, metrics, results_rows

RERUN = "out of date; rerun `python -m tools.docs_gen` and commit the pages: "


def test_every_generated_page_is_current() -> None:
    stale = docs_gen.stale(docs_gen.generate())
    assert not stale, RERUN + ", ".join(stale)


def test_a_changed_help_text_makes_its_page_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_main, "DESCRIPTION", cli_main.DESCRIPTION + " Changed.")
    assert docs_gen.stale(docs_gen.generate()) == ["docs/reference/cli-help/index.md"]


def test_a_changed_result_makes_the_tables_stale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    shutil.copytree(figures.RESULTS, results)
    soak = json.loads((results / "soak.json").read_text())
    soak["rss_growth_mb_after_warmup"] += 10.0
    (results / "soak.json").write_text(json.dumps(soak))
    monkeypatch.setattr(figures, "RESULTS", results)
    assert docs_gen.stale(docs_gen.generate()) == [
        "README.md", "docs/validation/figures.md", "docs/validation/index.md",
        "docs/validation/soak.md",  # its inline "RSS +6.0 MB"
    ]  # fmt: skip


def test_every_allowed_config_key_has_a_rule_or_is_a_section() -> None:
    assert config_keys.unexplained() == []


def test_every_exported_label_has_its_values_listed() -> None:
    assert metrics.unlisted_labels() == []


def test_every_figure_reads_a_number() -> None:
    for row in results_rows.ROWS:
        for name, figure in row.figures.items():
            value = figure.value()
            assert isinstance(value, int | float) and value == value, (row.what, name, value)
