"""Keep freed memory in the process on a CPU run, so that large tensors do not fault in fresh pages every step.

glibc's malloc serves every request above its mmap threshold (at most 32 MiB) with a fresh
mmap and gives it back with munmap when freed. A full-batch step allocates activations far
larger than that (the IRM paper's Colored MNIST: 50,000 x 390 floats, 78 MB a layer), so each
step maps and zero-fills hundreds of megabytes anew: on a CPU run of IRMColoredMNIST that
page faulting is about a fifth of the step. `retain_freed_memory` tells glibc to serve large
requests from its heap and not to trim the heap, so freed blocks are reused and the process
keeps its peak size, as a GPU caching allocator does. Numbers do not change: where memory
comes from never enters a computation. Elsewhere (not glibc, not Linux) it does nothing.
Set DOMAINGEN_RETAIN_FREED_MEMORY=0 to leave glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
ENV = "DOMAINGEN_RETAIN_FREED_MEMORY"

_retained = False


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc with mallopt, else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


def retain_freed_memory() -> bool:
    """Serve large allocations from glibc's heap and keep freed memory for reuse (see the module docstring).

    Returns True when this call found the setting in force or put it there; False, changing nothing,
    with DOMAINGEN_RETAIN_FREED_MEMORY=0 or where the C library is not glibc.
    """
    global _retained
    if os.environ.get(ENV, "1") == "0":
        return False
    if _retained:
        return True
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    # mallopt takes an int: the heap's top is given back only past 2 GiB free
    _retained = bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)) and bool(libc.mallopt(M_MMAP_MAX, 0))
    return _retained
