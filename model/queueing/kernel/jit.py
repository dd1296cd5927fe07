"""Compilation of the model's inner loops with numba, behind the Python signatures they keep.

The model is evaluated thousands of times a cycle (sizing searches, the tuner's refits): a
scalar evaluation in numpy made over a hundred calls on one-element arrays. The loops that solve
the chain and assemble the mean latencies are compiled once instead (machine code cached on
disk: NUMBA_CACHE_DIR, else next to the sources) and called with plain arrays and floats.

The cache can be built ahead (`python -m model.calibration.warmup`: `make venv`, the image
build) and then read from a directory the process cannot write (an image's, on a read-only root
file system): code missing from it is compiled in memory and not saved. numba keys cached code
to the CPU it was compiled for (the host's name and features, or NUMBA_CPU_NAME and
NUMBA_CPU_FEATURES when set), so the image builds and runs with NUMBA_CPU_NAME=generic: the key
then names no host, and the cache serves any x86-64 node.

numba keys a function's cached code to its own source file only, while the kernel's functions
call one another and read constants across its modules: after an edit (or a merge) of one
module, the others' cached code would keep the old callee or constant. So every kernel
function's cache is keyed to the contents of all the kernel's modules together, the
simulator's compiled replica step and event loop (model/simulation/*_kernel.py) included.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TypeVar, cast

import numba
from numba.core import caching

_F = TypeVar("_F", bound=Callable[..., object])
_HERE = Path(__file__).resolve().parent
_MODEL = _HERE.parents[1]
_KERNEL_SOURCES = ("queueing/kernel/*.py", "simulation/*_kernel.py")  # under model/


@cache
def _kernel_stamp() -> str:
    """Hash of the source of every module of the kernel."""
    digest = hashlib.sha256()
    for pattern in _KERNEL_SOURCES:
        for path in sorted(_MODEL.glob(pattern)):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class _UserDirLocator(caching.UserProvidedCacheLocator):
    """NUMBA_CACHE_DIR, keyed to the whole kernel's sources; read-only once it exists."""

    def get_source_stamp(self) -> str:
        return _kernel_stamp()

    def ensure_cache_path(self) -> None:
        path = self.get_cache_path()  # type: ignore[no-untyped-call]
        if os.path.isdir(path) and not os.access(path, os.W_OK):
            return  # built ahead and read-only here: read it (numba would skip it)
        super().ensure_cache_path()  # type: ignore[no-untyped-call]


class _InTreeLocator(caching.InTreeCacheLocator):
    """__pycache__ beside the sources, keyed to the whole kernel's sources."""

    def get_source_stamp(self) -> str:
        return _kernel_stamp()


class _KernelCacheImpl(caching.CompileResultCacheImpl):
    _locator_classes = [_UserDirLocator, _InTreeLocator, *caching.CacheImpl._locator_classes]


class _KernelCache(caching.FunctionCache):
    _impl_class = _KernelCacheImpl

    def save_overload(self, sig: object, data: object) -> None:
        try:
            super().save_overload(sig, data)  # type: ignore[no-untyped-call]
        except OSError:
            pass  # a read-only cache (built ahead): the code compiled stays in memory


def compiled(fn: _F) -> _F:
    """`fn` compiled to machine code on its first call (cached on disk); same signature.

    IEEE float semantics (a division by 0 gives inf or nan, as in numpy), no fast-math
    reassociation: the results are those of the Python expressions, operation for operation.
    """
    dispatcher = numba.njit(error_model="numpy", nogil=True)(fn)
    kernel_cache = _KernelCache(fn)  # type: ignore[no-untyped-call]
    # What njit(cache=True) sets up (Dispatcher.enable_caching), with the kernel-wide key.
    dispatcher._cache = kernel_cache  # type: ignore[attr-defined]
    return cast(_F, dispatcher)
