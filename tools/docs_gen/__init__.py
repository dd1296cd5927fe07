"""Generated documentation: reference pages from the code, results tables from the bench JSON.

`python -m tools.docs_gen` rewrites every generated page; `python -m tools.docs_gen --check`
lists the pages that differ from what the code and the JSON give, and exits 1 if any does.
"""

from __future__ import annotations

from pathlib import Path

from tools.docs_gen import (
    cli_help,
    config_keys,
    forecast_table,
    http_api,
    metrics,
    modules,
    validation,
    variant_truths,
)

ROOT = Path(__file__).resolve().parents[2]


def generate() -> dict[str, str]:
    """Repository-relative path -> the page's text."""
    pages = {
        "docs/reference/config-keys.md": config_keys.render(),
        "docs/reference/metrics-generated.md": metrics.render(),
        "docs/reference/metric-labels-generated.md": metrics.render_labels(),
        "docs/reference/http-api-generated.md": http_api.render(),
        variant_truths.PAGE: variant_truths.render(),
        forecast_table.PAGE: forecast_table.render(),
    }
    pages.update(cli_help.pages())
    pages.update(modules.pages())
    pages.update(validation.pages())
    return pages


def stale(pages: dict[str, str]) -> list[str]:
    """The pages whose file differs from their generated text."""
    return sorted(
        path
        for path, text in pages.items()
        if not (ROOT / path).exists() or (ROOT / path).read_text() != text
    )
