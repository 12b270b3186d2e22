"""Keeping freed memory in the heap on a CPU, where steps allocate the same large tensors again and again.

glibc's malloc gives every freed block over 32 MB back to the system, and the next allocation faults it in again a
page at a time, each page zeroed by the kernel. A CPU step's logits, their log-softmax and gradients (batch x length x
vocabulary floats: 131 MB for tiny.yaml's 8 x 128 x 32K) are such blocks: 40% of a tiny CPU run was the kernel
filling pages (8 batches: 27.4 s -> 17.5 s wall, 3.7M -> 0.29M page faults; peak memory 1.62 -> 1.98 GB).

Only for CPU work: a GPU job's host keeps no such tensors, and its loading (a 7B checkpoint read on the host) would
keep what it frees. Not for the converter either, whose peak memory is its limit (conversion/convert_dataset.py).
"""

from __future__ import annotations

import ctypes

__all__ = ["keep_freed_memory"]

# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
BLOCKS_KEPT_UP_TO = 1 << 30  # a block larger than this is still mapped and given back as it is freed
TOP_KEPT_UP_TO = (1 << 31) - 1  # free memory at the heap's top is given back beyond this (mallopt takes an int)


def keep_freed_memory() -> bool:
    """Have this process's malloc keep freed blocks of up to 1 GB for the next allocations; whether it could (glibc
    only: elsewhere nothing changes)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    kept = [mallopt(option, value) for option, value in ((_M_MMAP_THRESHOLD, BLOCKS_KEPT_UP_TO),
                                                          (_M_TRIM_THRESHOLD, TOP_KEPT_UP_TO))]
    return all(kept)  # an older glibc refuses a threshold over 32 MB (and keeps its own)
