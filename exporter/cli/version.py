"""The installed vllm-sizer version, for `--version` and the daemon's build_info metric."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    """The distribution's version, or "0+unknown" when it is not installed."""
    try:
        return version("vllm-sizer")
    except PackageNotFoundError:
        return "0+unknown"
