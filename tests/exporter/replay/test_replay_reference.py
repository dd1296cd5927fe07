"""The replay's reports stay those of the engine before issue 45's speed work (the numpy replica
step, every window read through the exposition text, the policies in one process): a short
slice of the bench's generated diurnal trace and of the shared real trace, four policies (in
this process, and in 2 or 3 processes), each report compared figure by figure within 1e-9 to
the one that engine wrote (tests/data/replay-reference-*.json). Regenerate only for a
deliberate change of behaviour: `python -m tests.exporter.replay.test_replay_reference
--write`, and say why in the commit.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from bench.replay_trace import CONFIG, write_trace
from exporter.replay.parallel import replay_parallel
from exporter.replay.policies import PolicyName
from exporter.replay.session import result_json
from exporter.replay.settings import load_settings
from exporter.replay.trace import TraceReader, Transform
from tests.conftest import DATA_DIR, shared_path

SEED = 20
TOLERANCE = 1e-9
# (name, trace maker, transform): generated rows are written to a temporary CSV.
GENERATED_REQUESTS, GENERATED_SPAN_S = 4_000, 900.0
REAL_WINDOW_S = 900.0


def _expected_path(name: str) -> Path:
    return DATA_DIR / f"replay-reference-{name}.json"


def _report(name: str, work: Path, jobs: int = 1) -> dict[str, Any]:
    """The JSON report of one reference replay (run-dependent keys left out); `jobs` > 1:
    the policies in that many processes."""
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    settings = load_settings(config)
    truth = settings.truth
    assert truth is not None
    if name == "generated":
        path = work / "trace.csv"
        write_trace(path, GENERATED_REQUESTS, SEED, span_s=GENERATED_SPAN_S)
        transform = Transform()
    else:
        path = shared_path("data", "traces", "mooncake-conversation.jsonl")
        transform = Transform(spread_s=3.0, window_end_s=REAL_WINDOW_S)

    def reader() -> TraceReader:
        return TraceReader(path, rng=np.random.default_rng(SEED), transform=transform)

    result = replay_parallel(settings, truth, tuple(PolicyName), reader, jobs=jobs)
    if jobs > 1:
        assert result.rows_read is not None and result.rows_read > 1000
    out = json.loads(json.dumps(result_json(result, 2.5)))
    out.pop("wall_s")
    return dict(out)


def _differences(expected: Any, got: Any, where: str = "") -> list[str]:
    """Where two JSON values differ beyond TOLERANCE (relative, or absolute near 0)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        if expected.keys() != got.keys():
            return [f"{where}: keys {sorted(expected)} != {sorted(got)}"]
        return [d for k in expected for d in _differences(expected[k], got[k], f"{where}/{k}")]
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: {len(expected)} items != {len(got)}"]
        return [d for i, (a, b) in enumerate(zip(expected, got, strict=True))
                for d in _differences(a, b, f"{where}[{i}]")]
    if (isinstance(expected, float | int) and isinstance(got, float | int)
            and not isinstance(expected, bool) and not isinstance(got, bool)):
        if math.isclose(expected, got, rel_tol=TOLERANCE, abs_tol=TOLERANCE):
            return []
    elif expected == got:
        return []
    return [f"{where}: {expected!r} != {got!r}"]


@pytest.mark.parametrize("name,jobs", [("generated", 1), ("real", 1), ("generated", 2),
                                       ("real", 3)])
def test_report_equals_the_reference_engine(name: str, jobs: int, tmp_path: Path) -> None:
    expected = json.loads(_expected_path(name).read_text())
    got = _report(name, tmp_path, jobs)
    assert expected["arrivals"] > 1000  # the slice holds real work
    differences = _differences(expected, got)
    assert not differences, "\n".join(differences[:20])


def test_the_comparison_sees_a_change_past_the_tolerance() -> None:
    expected = json.loads(_expected_path("generated").read_text())
    changed = json.loads(json.dumps(expected))
    ours = changed["policies"]["ours"]
    ours["replica_hours"] *= 1 + 1e-7
    assert _differences(expected, changed) == [
        f"/policies/ours/replica_hours: {expected['policies']['ours']['replica_hours']!r} "
        f"!= {ours['replica_hours']!r}"]
    assert _differences(expected, json.loads(json.dumps(expected))) == []


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m tests.exporter.replay.test_replay_reference --write")
    for case in ("generated", "real"):
        with tempfile.TemporaryDirectory() as tmp:
            report = _report(case, Path(tmp))
        _expected_path(case).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {_expected_path(case)}: {report['arrivals']} arrivals")
