"""zstd compressors kept per thread and level for the .pgms writers."""

from __future__ import annotations

import threading

_compressors = threading.local()


def zstd_compressor(level: int):
    """This thread's zstd compressor at ``level`` (no checksum, no content size): one per thread
    and level, kept, since a level-19 context costs more to set up than a small table to code
    (a compressor's output does not depend on what it coded before)."""
    import zstandard

    kept = _compressors.__dict__.setdefault("by_level", {})
    if level not in kept:
        kept[level] = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=False)
    return kept[level]
