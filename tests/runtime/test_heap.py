"""specdec.runtime.heap: with glibc's mmap threshold fixed, a large block freed leaves
RSS (without it, the heap keeps it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc")

# Allocates 400 blocks of 256 KiB (100 MiB) through malloc, keeps one at the top of the
# heap so nothing can be trimmed from its end, frees the rest, and prints RSS growth.
SCRIPT = """
import ctypes, sys
from specdec.runtime import heap
if sys.argv[1] == "fixed":
    assert heap.return_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
# a block of 16 MiB freed raises glibc's dynamic threshold above 256 KiB
big = libc.malloc(16 << 20); libc.free(big)
before = rss()
blocks = [libc.malloc(256 << 10) for _ in range(400)]
for b in blocks:
    ctypes.memset(b, 1, 256 << 10)
keep = libc.malloc(1024)
for b in blocks:
    libc.free(b)
print((rss() - before) // 1024)
"""


def grown_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True,
                         text=True, timeout=60, check=True)
    return int(out.stdout.strip())


def test_fixed_threshold_returns_freed_blocks():
    assert grown_mib("default") >= 80  # the heap kept the 100 MiB
    assert grown_mib("fixed") <= 10
