"""Keep freed memory in the process instead of handing it back to the kernel every step.

Each training step allocates and frees the same large buffers: the logits and their gradient
(num_steps x batch x vocab floats, 16 MB for PTB small at batch 20) and the decoder's 8 MB
gradient. glibc serves blocks over its mmap threshold with a fresh mmap and unmaps them on
free, and it trims the top of the heap once 128 KB of it is free, so every step faulted those
pages in again and the kernel zeroed them: 1.1 million page faults and 16 % of the CPU time in
the kernel for 120 steps of one rank. Zeroing pages is memory traffic too, which the ranks of
one host share. Raising both thresholds makes the allocator reuse the blocks.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt(3) parameters, from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc accepts at most half its largest heap (64 MB on 64-bit) as the mmap threshold.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30  # keep up to 1 GB of freed heap; a step's peak is far below


def keep_freed_memory() -> bool:
    """Tune glibc's malloc to reuse freed blocks; False where there is no glibc to tune
    (another libc or OS), which changes nothing but speed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # The mmap threshold first: setting either one turns off glibc's own adjustment, and a
    # trim threshold alone would leave every block over 128 KB to mmap.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
