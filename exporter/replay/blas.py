"""One BLAS thread while a replay runs (issue 45).

numpy and scipy each load their own OpenBLAS, which splits a long dot product (over 10k
elements: a busy window's inter-token gaps, summed into the emulated ITL histogram) over
every core and then keeps its threads spinning. On a replay, whose policies already run in one
process per core (exporter/replay/parallel.py), those threads do no useful work: measured on
the 1 h bench slice, 9.1 s CPU with the default threads against 5.0 s with one, the decisions
unchanged (the tuner's fitted parameters moved by 1e-15, relative).

The libraries are found among the process's mapped files and driven through OpenBLAS's own
thread-count functions (named with the prefixes and suffixes the numpy and scipy wheels give
them); a library without them is left alone, so elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_MAPS = Path("/proc/self/maps")
_NAMES = tuple((f"{prefix}openblas_get_num_threads{suffix}",
                f"{prefix}openblas_set_num_threads{suffix}")
               for prefix in ("", "scipy_") for suffix in ("", "64_", "_64"))


def _thread_controls() -> list[tuple[Callable[[], int], Callable[[int], None]]]:
    """(get, set) of the thread count of every OpenBLAS the process has loaded."""
    try:
        maps = _MAPS.read_text()
    except OSError:
        return []
    paths = sorted({line.split()[-1] for line in maps.splitlines()
                    if len(line.split()) >= 6 and "openblas" in Path(line.split()[-1]).name})
    controls = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in _NAMES:
            get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and set_ is not None:
                get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
                controls.append((get, set_))
                break
    return controls


@contextmanager
def blas_threads(count: int) -> Iterator[int]:
    """At most `count` threads in every OpenBLAS loaded, the counts put back on exit; yields
    how many libraries were limited."""
    controls = _thread_controls()
    before = [get() for get, _ in controls]
    for (_, set_), n in zip(controls, before, strict=True):
        set_(min(count, n))
    try:
        yield len(controls)
    finally:
        for (_, set_), n in zip(controls, before, strict=True):
            set_(n)


def blas_thread_counts() -> list[int]:
    """The thread count of every OpenBLAS loaded (for tests)."""
    return [get() for get, _ in _thread_controls()]
