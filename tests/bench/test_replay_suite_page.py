"""docs/validation/replay-suite.md is what bench/lib/replay_suite_page.py makes of the committed
bench/results/replay_suite.json: the page is regenerated, never edited by hand."""

from __future__ import annotations

import json

from bench.lib.replay_suite_page import ORDER, markdown
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "bench" / "results" / "replay_suite.json"
BASELINE = REPO_ROOT / "bench" / "results" / "replay_suite_baseline.json"
PAGE = REPO_ROOT / "docs" / "validation" / "replay-suite.md"


def test_the_committed_page_is_generated_from_the_committed_json() -> None:
    suite = json.loads(RESULTS.read_text())
    assert PAGE.read_text() == markdown(suite, json.loads(BASELINE.read_text()))


def test_every_trace_has_every_policy_and_the_fields_the_suite_promises() -> None:
    suite = json.loads(RESULTS.read_text())
    assert {"commit", "date", "machine", "command"} <= set(suite)
    assert {"cores", "load_average_start", "load_average_end"} <= set(suite["machine"])
    names = [t["name"] for t in suite["traces"]]
    assert any(n.startswith("conversation") for n in names) and "bursty" in names
    assert {f"constant-{r}" for r in (6, 8, 10, 11, 12, 16, 20)} <= set(names)
    for trace in suite["traces"]:
        expected = set(ORDER) if trace["feasible"] else set(ORDER) - {"fixed_best"}
        assert set(trace["policies"]) == expected, trace["name"]
        for entry in trace["policies"].values():
            assert {"met_share", "replica_hours", "handover_share",
                    "cost_ratio_vs_fixed_best"} <= set(entry)
