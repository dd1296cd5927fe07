"""The one threshold for a trusted calibration, and the shipped queries that repeat it."""

from __future__ import annotations

import re

from model.calibration.trust import TRUSTED_CONFIDENCE, is_trusted
from tests.conftest import REPO_ROOT


def test_trusted_starts_at_the_threshold() -> None:
    assert is_trusted(TRUSTED_CONFIDENCE)
    assert not is_trusted(TRUSTED_CONFIDENCE - 1e-9)
    assert not is_trusted(0.0)


def test_shipped_queries_leave_the_threshold_to_the_sizer() -> None:
    # The hand-over is the sizer's count (exporter.sizing.handover): no query repeats the rule.
    for name in (
        "base/keda-scaledobject.yaml",
        "hpa.yaml",
        "central-ha/scaledobject-ha-patch.yaml",
    ):
        text = (REPO_ROOT / "config" / "k8s" / name).read_text()
        assert not re.search(r"calibration_confidence\{[^}]*\} *[<>]", text), name
