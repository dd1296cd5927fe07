"""Exposition text -> metric families, salvaging what parses. ecosystem §1.1.

One garbage line must not hide a whole pod: when the whole text fails to parse, the lines that
fail alone are dropped and the rest parsed again (and counted as skipped).
"""

from __future__ import annotations

import logging

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

# prometheus-client raises these on malformed text; anything else would be our bug.
PARSER_ERRORS = (ValueError, IndexError, KeyError, TypeError, UnicodeError)


def parse_families(text: str) -> tuple[list[Metric], int]:
    """Whole-text parse; on a parser error, drop the lines that fail alone and parse again."""
    try:
        return list(text_string_to_metric_families(text)), 0
    except PARSER_ERRORS as exc:
        # Salvage below: one garbage line must not hide a whole pod. The second parse of the
        # kept lines may still fail; then the caller rejects the pod as a whole.
        logger.debug("whole-text parse failed (%s); salvaging line by line", exc)
    kept: list[str] = []
    skipped = 0
    for line in text.split("\n"):
        if _line_parses(line):
            kept.append(line)
        else:
            skipped += 1
    return list(text_string_to_metric_families("\n".join(kept) + "\n")), skipped


def _line_parses(line: str) -> bool:
    try:
        list(text_string_to_metric_families(line + "\n"))
    except PARSER_ERRORS:
        return False
    return True
