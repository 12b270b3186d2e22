"""How a process's malloc (glibc's) keeps or returns the memory it frees: the one place vocagno tunes it.

``keep_freed_memory`` is for CPU steps, which allocate the same large tensors again and again. glibc's malloc gives
every freed block over 32 MB back to the system, and the next allocation faults it in again a page at a time, each
page zeroed by the kernel. A CPU step's logits, their log-softmax and gradients (batch x length x vocabulary floats:
131 MB for tiny.yaml's 8 x 128 x 32K) are such blocks: 40% of a tiny CPU run was the kernel filling pages (8 batches:
27.4 s -> 17.5 s wall, 3.7M -> 0.29M page faults; peak memory 1.62 -> 1.98 GB). Not for a GPU job, whose host keeps
no such tensors, and whose loading (a 7B checkpoint read on the host) would keep what it frees.

``return_freed_memory`` is for the converter, whose peak memory is its limit: glibc's mmap threshold rises to the
largest block freed (a long document's token arrays: tens of MB), after which such blocks come from the heap, which
fragments and grows with every group encoded (peak RSS 2.2 GB for a 20 MB document). A fixed threshold keeps big
blocks in mmap, returned to the system when freed (1.1 GB).

Other allocators (macOS, musl) hold memory otherwise: there both change nothing.
"""

from __future__ import annotations

import ctypes

__all__ = ["keep_freed_memory", "return_freed_memory"]

# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
BLOCKS_KEPT_UP_TO = 1 << 30  # a block larger than this is still mapped and given back as it is freed
TOP_KEPT_UP_TO = (1 << 31) - 1  # free memory at the heap's top is given back beyond this (mallopt takes an int)
BLOCKS_RETURNED_FROM = 1 << 20  # the converter's: every block of 1 MB or more is mapped, and given back when freed


def _mallopt(*settings: tuple[int, int]) -> bool:
    """glibc's ``mallopt`` for each (parameter, value); whether every one was taken (False where there is none)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all([mallopt(parameter, value) for parameter, value in settings])


def keep_freed_memory() -> bool:
    """Have this process's malloc keep freed blocks of up to 1 GB for the next allocations; whether it could (an older
    glibc refuses a threshold over 32 MB, and keeps its own)."""
    return _mallopt((_M_MMAP_THRESHOLD, BLOCKS_KEPT_UP_TO), (_M_TRIM_THRESHOLD, TOP_KEPT_UP_TO))


def return_freed_memory() -> bool:
    """Have this process's malloc map every block of 1 MB or more on its own, given back to the system when freed;
    whether it could."""
    return _mallopt((_M_MMAP_THRESHOLD, BLOCKS_RETURNED_FROM))
