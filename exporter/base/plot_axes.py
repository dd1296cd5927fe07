"""Axis formatting shared by the subcommands' plots (matplotlib is imported by the caller)."""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.ticker import LogFormatter, MaxNLocator


class _PlainLogFormatter(LogFormatter):
    """matplotlib's choice of which log ticks to label, written as plain numbers."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:,.0f}" if x >= 1 else f"{x:g}"  # log ticks >= 1 are whole numbers


def plain_log_ticks(ax: Axes) -> None:
    """Label the log-scaled axes of `ax` with plain numbers (20, 50, 100), not 2x10^1: matplotlib
    labels minor ticks in scientific notation when an axis spans less than a decade or two."""
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            axis.set_major_formatter(_PlainLogFormatter())
            axis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False))


def integer_ticks(ax: Axes) -> None:
    """Ticks of the y axis at whole numbers only (a count of replicas has no 1.5)."""
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
