"""The .pgms container and decoder on bad input: every corruption is one clear FormatError."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pgms_helpers import random_scene

from visionmoe.splat import compress, decompress
from visionmoe.splat.io import SceneError
from visionmoe.splat.pgms import bitstream as bs
from visionmoe.splat.pgms.coders import zstd_decompress


@pytest.fixture(scope="module")
def small_pgms() -> bytes:
    s = random_scene(400, 1, seed=5)
    return compress(s, ratio=6, contributions=torch.rand(400, generator=torch.Generator().manual_seed(1)) * 5,
                    preset=(3, 3)).data


def sections(data: bytes):
    return list(bs.iter_sections(data))


def reseal(data: bytes) -> bytes:
    """Recompute every section CRC (so corruption reaches the semantic checks)."""
    out = bytearray(data)
    pos = 12
    while pos + 16 <= len(out):
        length = struct.unpack_from("<I", out, pos + 8)[0]
        if pos + 16 + length > len(out):
            break
        crc = zlib.crc32(bytes(out[pos + 16: pos + 16 + length]), zlib.crc32(bytes(out[pos: pos + 12])))
        struct.pack_into("<I", out, pos + 12, crc)
        pos += 16 + length
    return bytes(out)


def test_valid_file_decodes(small_pgms):
    assert decompress(small_pgms).num_gaussians > 0
    assert [s.tag for s in sections(small_pgms)][0] == "HEAD"


@pytest.mark.parametrize("coder", [bs.CODER_RAW, bs.CODER_ZSTD, bs.CODER_LZMA, bs.CODER_RANS])
@pytest.mark.parametrize("values", [np.zeros(0, np.int64), np.array([0]), np.array([-3, 7, 7, 7, 100000, -2**40]),
                                    np.random.default_rng(0).integers(-20, 20, 5000)])
def test_int_stream_round_trip(coder, values):
    if coder == bs.CODER_RANS and values.size and np.abs(values).max() > 30000:
        pytest.skip("alphabet beyond rANS limit")
    b = bs.encode_ints(values, coders=(coder,))
    r = bs.StreamReader(b, "test")
    np.testing.assert_array_equal(r.ints("v", len(values)), values)
    r.done()


def test_coder_is_chosen_by_size():
    skewed = np.zeros(10000, np.int64)
    skewed[::97] = 1
    b = bs.encode_ints(skewed)
    assert b[1] != bs.CODER_RAW and len(b) < 400


def test_float_stream_round_trip():
    x = np.random.default_rng(0).normal(size=300).astype(np.float32)
    r = bs.StreamReader(bs.encode_floats(x, half=False), "t")
    np.testing.assert_array_equal(r.floats("x", 300), x)


@pytest.mark.parametrize("mutate,match", [
    (lambda d: b"", "shorter than the 12-byte preamble"),
    (lambda d: b"PK\x03\x04" + d[4:], "magic"),
    (lambda d: d[:8] + struct.pack("<HH", 6, 0) + d[12:], "version 6.0 is not supported"),
    (lambda d: d[:-17], "truncated"),
    (lambda d: d[:40], "truncated"),
    (lambda d: d + b"\x00", "unexpected bytes after the END0"),
    (lambda d: d[:12] + b"XXXX" + d[16:], "checksum mismatch|first section"),
    (lambda d: d[:20] + struct.pack("<I", 0x7FFFFFFF) + d[24:], "declares .* payload bytes"),
])
def test_corrupt_files(small_pgms, mutate, match):
    with pytest.raises(bs.FormatError, match=match):
        decompress(mutate(small_pgms))


def test_every_bit_flip_in_a_sample_is_caught(small_pgms):
    rng = np.random.default_rng(0)
    for pos in rng.choice(len(small_pgms), 200, replace=False):
        bad = bytearray(small_pgms)
        bad[pos] ^= 1 << int(rng.integers(8))
        with pytest.raises(bs.FormatError):
            decompress(bytes(bad))


def test_lying_head_counts(small_pgms):
    secs = sections(small_pgms)
    head = bytearray(secs[0].payload)
    for field_offset, value in ((4, 10**8), (8, 10**8), (8, 1), (4, 0)):  # level0 count, total nodes
        h = bytearray(head)
        struct.pack_into("<I", h, field_offset, value)
        data = reseal(small_pgms[:28] + bytes(h) + small_pgms[28 + len(h):])
        with pytest.raises(bs.FormatError):
            decompress(data)


def test_resealed_payload_corruption(small_pgms):
    """Payload bytes changed with valid CRCs: semantic checks still give FormatError (or a valid scene)."""
    rng = np.random.default_rng(1)
    for _ in range(150):
        bad = bytearray(small_pgms)
        for pos in rng.choice(np.arange(28, len(bad)), 3, replace=False):
            bad[pos] = int(rng.integers(256))
        try:
            sc = decompress(reseal(bytes(bad)))
        except bs.FormatError:
            continue
        assert torch.isfinite(sc.means).all()


def test_format_error_is_scene_error():
    assert issubclass(bs.FormatError, SceneError)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=600))
def test_fuzz_random_bytes(data):
    for blob in (data, bs.MAGIC + struct.pack("<HH", 1, 0) + data):
        try:
            decompress(blob)
        except bs.FormatError:
            pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.integers(0, 10**9), resealed=st.booleans())
@example(edits=[(22490785, 224)], cut=1, resealed=True)  # a zstd frame header made to declare its size
def test_fuzz_mutated_files(small_pgms, edits, cut, resealed):
    bad = bytearray(small_pgms)
    for pos, val in edits:
        bad[pos % len(bad)] = val
    blob = bytes(bad)
    if cut % 3 == 0:
        blob = blob[: cut % len(blob)]
    if resealed:
        blob = reseal(blob)
    try:
        sc = decompress(blob)
        assert sc.num_gaussians > 0
    except bs.FormatError:
        pass


def test_zstd_frame_declaring_another_size_is_a_format_error():
    """A zstd frame whose header declares a content size other than the stream's (the encoder
    writes none) is rejected before anything is allocated for it."""
    import zstandard

    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"x" * 500)
    with pytest.raises(bs.FormatError, match="declares 500 bytes, expected 400"):
        zstd_decompress(frame, 400)
    assert zstd_decompress(frame, 500) == b"x" * 500


def test_a_memoised_stream_is_the_fresh_encode_byte_for_byte():
    from visionmoe.splat.pgms import bitstream as bs
    from visionmoe.splat.pgms.stream_memo import _Memo

    rng = np.random.default_rng(3)
    v = rng.integers(-300, 300, 5000)
    fresh = bs.encode_ints.__wrapped__(v, coders=bs.ALL_CODERS)
    assert bs.encode_ints(v) == fresh and bs.encode_ints(v.copy()) == fresh  # a miss, then a hit
    assert bs.encode_ints(v[:-1]) != fresh  # other values, another key
    memo = _Memo(max_bytes=100)
    for i in range(20):
        memo.put((i,), bytes(10))
    assert memo.size <= 100 and memo.get((0,)) is None and memo.get((19,)) == bytes(10)  # bounded, LRU
