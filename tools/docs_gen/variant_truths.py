"""docs/validation/variant-truths-table.md: the mixed-fleet test bed's true parameters per
variant and our priors' errors against them, computed from exporter/testbed/variant_truths.py."""

from __future__ import annotations

from exporter.testbed.variant_truths import (
    REFERENCE_ITL_MS,
    REFERENCE_TTFT_MS,
    REFERENCE_WORKLOAD,
    table_markdown,
)
from tools.docs_gen.config_keys import HEADER

PAGE = "docs/validation/variant-truths-table.md"


def render() -> str:
    w = REFERENCE_WORKLOAD
    return "\n".join([
        HEADER,
        "# Variant truths: the table",
        "",
        "How each truth is built and why: [variant truths](variant-truths.md). Errors are "
        "prior / truth - 1; capacity is one replica's SLO capacity (req/s) at "
        f"{w.avg_input_tokens:.0f} prompt / {w.avg_output_tokens:.0f} output tokens, mean TTFT "
        f"<= {REFERENCE_TTFT_MS:.0f} ms and mean ITL <= {REFERENCE_ITL_MS:.0f} ms, vLLM's "
        "default B and M. *rule*: the H100 fit scaled by peak FLOP/s (beta) and memory "
        "bandwidth (alpha, gamma) per GPU count, the transfer a variant without pods gets; "
        "*physical prior*: `model/calibration/prior.py` with the GPUs' summed peak figures.",
        "",
        table_markdown(),
    ])
