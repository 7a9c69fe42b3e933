"""The strict zstd literals check (visionmoe.ops.zstd_literals): the C++ loops and the pure-Python
reference accept every frame libzstd writes (seeded inputs of many kinds and sizes, at many
levels, with every kind of literals section) and give the same result, code and offset, on
thousands of corrupted frames; frames whose Huffman streams do not end exactly at their last
bit are refused with what and where."""

from __future__ import annotations

import collections
import logging
import random

import numpy as np
import pytest
import zstandard

from visionmoe.ops import ZstdLiteralsError, _backend, zstd_literals_check
from visionmoe.ops import _zstd_literals_ref as ref
from visionmoe.ops import zstd_literals as op

needs_compiled = pytest.mark.skipif(not op.compiled_available(),
                                    reason="compares with the compiled extension (make build)")
LEVELS = (-5, 1, 3, 6, 9, 15, 19, 22)
SIZES = (1, 5, 17, 64, 300, 1000, 4000, 20000, 70000, 140000)


def _input(i: int, rng: random.Random) -> bytes:
    n = rng.choice(SIZES)
    kind = i % 6
    gen = np.random.default_rng(i)
    if kind == 0:  # random bytes: raw literals, or Huffman ones on a few symbols
        return gen.integers(0, rng.choice((4, 16, 256)), n, dtype=np.uint8).tobytes()
    if kind == 1:  # skewed symbols: Huffman literals, few matches
        return np.minimum(gen.geometric(rng.choice((0.05, 0.3, 0.7)), n), 255).astype(np.uint8).tobytes()
    if kind == 2:  # repetitive text
        words = [bytes(gen.integers(97, 123, rng.randint(2, 8), dtype=np.uint8)) for _ in range(20)]
        return b" ".join(rng.choice(words) for _ in range(n // 4 + 1))[:n]
    if kind == 3:  # byte planes of integers, as the .pgms streams
        u = gen.integers(0, rng.choice((3, 300, 70000)), max(n // 4, 1)).astype("<u4")
        return np.ascontiguousarray(u.view(np.uint8).reshape(-1, 4).T).tobytes()
    if kind == 4:  # small inputs
        return gen.integers(0, 256, rng.randint(0, 40), dtype=np.uint8).tobytes()
    return bytes(rng.choice(b"\x00\x00\x00\x01\x02\x03\xff") for _ in range(n))


@pytest.fixture(scope="module")
def frames() -> list[bytes]:
    rng = random.Random(52)
    out = []
    for i in range(300):
        data = _input(i, rng)
        cctx = zstandard.ZstdCompressor(level=rng.choice(LEVELS), write_checksum=rng.random() < 0.3,
                                        write_content_size=rng.random() < 0.5)
        out.append(cctx.compress(data))
    return out


def literal_kinds(frame: bytes) -> collections.Counter:
    """What the frame's compressed blocks hold: literals type x stream count, weight coding."""
    kinds: collections.Counter = collections.Counter()
    pos = ref._frame_header_size(frame)
    while True:
        h = int.from_bytes(frame[pos:pos + 3], "little")
        start, btype = pos + 3, (h >> 1) & 3
        if btype == 2 and frame[start] & 3 >= 2:
            ltype, sf = frame[start] & 3, (frame[start] >> 2) & 3
            kinds[("compressed" if ltype == 2 else "treeless", 1 if sf == 0 else 4)] += 1
            if ltype == 2:
                kinds["fse weights" if frame[start + (3 if sf < 2 else sf + 2)] < 128 else "direct weights"] += 1
        pos = start + (1 if btype == 1 else h >> 3)
        if h & 1:
            return kinds


def test_the_valid_frames_hold_every_kind_of_literals(frames):
    kinds = sum((literal_kinds(f) for f in frames), collections.Counter())
    for kind in (("compressed", 1), ("compressed", 4), ("treeless", 1), ("treeless", 4), "fse weights",
                 "direct weights"):
        assert kinds[kind] >= 2, (kind, kinds)


def test_the_reference_accepts_every_frame_libzstd_writes(frames):
    refused = [(i, ref.zstd_literals_check(f)) for i, f in enumerate(frames) if ref.zstd_literals_check(f) != (0, 0)]
    assert not refused


@needs_compiled
def test_the_compiled_check_accepts_every_frame_libzstd_writes(frames):
    refused = [(i, op.zstd_literals_status(f, compiled=True)) for i, f in enumerate(frames)
               if op.zstd_literals_status(f, compiled=True) != (0, 0)]
    assert not refused
    for f in frames[:20]:
        zstd_literals_check(f)  # the public op: no error


def mutants(frames: list[bytes], per_frame: int, seed: int):
    """Frames with one to three bytes replaced or bit-flipped, most in the first block."""
    rng = random.Random(seed)
    for f in frames:
        for _ in range(per_frame):
            g = bytearray(f)
            for _ in range(rng.choice((1, 1, 2, 3))):
                i = rng.randrange(min(len(g), 400))
                g[i] = rng.randrange(256) if rng.random() < 0.5 else g[i] ^ (1 << rng.randrange(8))
            yield bytes(g)
    yield from (f[:k] for f in frames[:40] for k in range(0, len(f), max(1, len(f) // 7)))  # truncations
    for f in frames:  # the first block's literals made Treeless: no table to reuse yet
        at = ref._frame_header_size(f)
        if (f[at] >> 1) & 3 == 2:
            yield f[:at + 3] + bytes([f[at + 3] | 3]) + f[at + 4:]


@needs_compiled
def test_the_compiled_check_matches_the_reference_on_corrupt_frames(frames):
    small = [f for f in frames if len(f) < 6000]
    codes: collections.Counter = collections.Counter()
    differ = []
    for g in mutants(small, 12, 7):
        expect = ref.zstd_literals_check(g)
        got = op.zstd_literals_status(g, compiled=True)
        codes[expect[0]] += 1
        if got != expect:
            differ.append((g.hex(), expect, got))
    assert not differ, differ[:3]
    # the mutants reach every check
    for code in range(ref.BAD_FRAME_HEADER, ref.INEXACT_STREAM + 1):
        assert codes[code] > 0, (code, codes)
    assert codes[ref.INEXACT_STREAM] > 50, codes


def test_inexact_streams_are_refused_with_what_and_where(frames):
    """Some mutants that libzstd may decode (its fast path does not look at the end of a stream)
    are refused; the error names the rule and the byte."""
    inexact = [g for g in mutants(frames[:60], 10, 11) if ref.zstd_literals_check(g)[0] == ref.INEXACT_STREAM]
    assert len(inexact) > 10
    for g in inexact[:10]:
        with pytest.raises(ZstdLiteralsError, match=r"does not end exactly at its last bit at byte \d+"):
            zstd_literals_check(g)


def test_the_op_runs_the_reference_without_the_extension(frames, monkeypatch, caplog):
    def fail():
        raise ImportError("libc10_cuda.so: cannot open shared object file")

    monkeypatch.setattr(_backend, "_import_extension", fail)
    _backend._load.cache_clear()
    _backend.warn_fallback.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=_backend.logger.name):
            assert not op.compiled_available()
            for f in frames[:10]:
                zstd_literals_check(f)
            bad = next(g for g in mutants(frames[:60], 10, 11) if ref.zstd_literals_check(g)[0] == ref.INEXACT_STREAM)
            with pytest.raises(ZstdLiteralsError):
                zstd_literals_check(bad)
        assert any("pure-PyTorch or numpy path" in r.getMessage() for r in caplog.records)
    finally:
        monkeypatch.undo()
        _backend._load.cache_clear()
        _backend.warn_fallback.cache_clear()
