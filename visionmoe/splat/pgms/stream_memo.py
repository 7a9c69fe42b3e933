"""A bounded memo of coded streams: the encoder's searches code the same stream many times.

The rung search, its render checks and the cut tuner encode dozens of candidate files whose
streams are often unchanged between candidates (the positions of one geometry rung under every
appearance rung): at SOG's size on academic_tarot_cards, 119 of 527 integer streams were coded
before, 35% of the coding time. A stream's bytes are a pure function of its values, dtype and
coder set, so a hit returns the very bytes a fresh encode would.

``StreamWriter``'s ``cache`` (one cut tuner's, unbounded) stays beside it: it keeps the streams
above this memo's per-stream limit (an eighth of ``MEMO_BYTES``), which scenes of millions of
Gaussians write, for the files of one tuner.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict

import numpy as np

MEMO_BYTES = 64 << 20  # coded bytes kept (least recently used first out)


class _Memo:
    def __init__(self, max_bytes: int):
        self.max_bytes, self.size = max_bytes, 0
        self.items: OrderedDict[tuple, bytes] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple) -> bytes | None:
        with self.lock:
            out = self.items.get(key)
            if out is not None:
                self.items.move_to_end(key)
            return out

    def put(self, key: tuple, out: bytes) -> None:
        if len(out) > self.max_bytes // 8:
            return
        with self.lock:
            if key not in self.items:
                self.items[key] = out
                self.size += len(out)
            while self.size > self.max_bytes:
                self.size -= len(self.items.popitem(last=False)[1])


def values_key(values: np.ndarray) -> tuple:
    """The values' identity for a memo: a digest of their bytes, their dtype and shape."""
    v = np.ascontiguousarray(values)
    return hashlib.blake2b(v.view(np.uint8).reshape(-1), digest_size=20).digest(), v.dtype.str, v.shape


def memoized_stream(fn):
    """Memoise ``fn(values, **kw) -> bytes`` on the values' bytes, dtype and shape and ``kw``.
    ``key``: the caller's :func:`values_key` of ``values``, when it has one (hashing is a large
    part of a memo hit's time)."""
    memo = _Memo(MEMO_BYTES)

    @functools.wraps(fn)
    def wrapper(values, *, key: tuple | None = None, **kw):
        v = np.ascontiguousarray(values)
        key = (values_key(v) if key is None else key) + (tuple(sorted(kw.items())),)
        out = memo.get(key)
        if out is None:
            out = fn(v, **kw)
            memo.put(key, out)
        return out

    wrapper.memo = memo
    return wrapper
