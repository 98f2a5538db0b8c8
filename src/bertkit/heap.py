"""glibc's malloc for a process that allocates the same large tensors again and again (`Heap`).

Every training step and inference batch allocates its activations afresh. glibc hands a freed block
over its moving mmap threshold (at most 32 MB) back to the OS, and trims freed heap above a threshold
too; the next step then faults those pages back in one by one, and on a VM each fault is dear
(docs/pretrain-measurements.md, "Speed against transformers").
The `bertkit` command keeps freed blocks for its whole process (`keep_freed`, what the IPEX launcher
gets by preloading jemalloc); the server keeps them while busy and trims when idle. The library
itself never changes malloc: a user's process is the user's. A no-op where the C library is not glibc.
"""
from __future__ import annotations

import ctypes
import os
import sys


class Heap:
    """glibc's malloc: fewer arenas (each thread that allocates may otherwise get its own 64 MB
    arena, kept for the life of the process), freed blocks kept for reuse (`keep_while_busy`,
    `keep_freed`) and `malloc_trim` to give freed pages back. A no-op where the C library is not glibc."""

    M_ARENA_MAX, M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -8, -1, -3

    def __init__(self):
        try:
            self.libc = ctypes.CDLL("libc.so.6")
            self.libc.malloc_trim, self.libc.mallopt
        except (OSError, AttributeError):
            self.libc = None

    def limit_arenas(self, n: int = 2) -> None:
        if self.libc is not None:
            self.libc.mallopt(self.M_ARENA_MAX, n)

    def keep_while_busy(self, mmap_mb: int = 64, keep_mb: int = 512) -> bool:
        """Blocks under `mmap_mb` from the heap, and up to `keep_mb` of freed heap kept, so that the
        activations of one batch reuse the pages of the last instead of faulting fresh ones in (glibc's
        own thresholds move with what was freed, and every trimmed or mmapped block costs page faults
        on its next use; docs/serve-measurements.md). The server still trims when it goes idle (`trim`).
        Returns whether glibc took both."""
        if self.libc is None:
            return False
        mmap_ok = self.libc.mallopt(self.M_MMAP_THRESHOLD, mmap_mb << 20) == 1
        return self.libc.mallopt(self.M_TRIM_THRESHOLD, keep_mb << 20) == 1 and mmap_ok

    def keep_freed(self, mb: int = 1024) -> str:
        """Blocks under `mb` from the heap and up to `mb` of freed heap kept, for the life of the process
        (the `bertkit` command; BERTKIT_SYSTEM_MALLOC=1 leaves malloc alone). Returns what was done."""
        if os.environ.get("BERTKIT_SYSTEM_MALLOC") == "1":
            return "system malloc settings kept (BERTKIT_SYSTEM_MALLOC=1)"
        if self.libc is None:
            return f"system malloc settings kept (no glibc on {sys.platform})"
        if not self.keep_while_busy(mb, mb):
            return "system malloc settings kept (mallopt refused)"
        return f"glibc malloc keeps freed blocks up to {mb} MB (mmap and trim thresholds)"

    def trim(self) -> None:
        if self.libc is not None:
            self.libc.malloc_trim(0)

    @staticmethod
    def rss_mb() -> float:
        """This process's resident memory (Linux; 0 elsewhere)."""
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, ValueError, IndexError):
            return 0.0
