"""The portable interleaved rANS coder (format 4): round trips, edge cases, corrupt input, and the
compiled loops against the numpy reference (the same bytes)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from visionmoe.ops import rans as compiled_ops
from visionmoe.splat.pgms import rans


def roundtrip(u, alphabet=None, **kw):
    u = np.asarray(u, np.int64)
    alphabet = int(u.max()) + 1 if alphabet is None and u.size else (alphabet or 0)
    body = rans.encode(u, alphabet, **kw)
    out = rans.decode(body, u.size, alphabet)
    assert out.dtype == np.uint64
    np.testing.assert_array_equal(out.astype(np.int64), u)
    return body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 300), max_size=600), st.integers(1, 64), st.sampled_from([None, 9, 12, 16]))
def test_roundtrip_hypothesis(values, lanes, precision):
    u = np.asarray(values, np.int64)
    kw = {}
    if u.size:
        kw["lanes"] = min(lanes, u.size)
        distinct = len(np.unique(u))
        if precision is not None and distinct <= 1 << precision:
            kw["precision"] = precision
    roundtrip(u, **kw)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20000), st.floats(0.01, 5.0), st.integers(2, 2000), st.integers(0, 2**32 - 1))
def test_roundtrip_skewed_hypothesis(n, conc, alphabet, seed):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(alphabet, conc))
    roundtrip(rng.choice(alphabet, size=n, p=p))


def test_empty():
    body = rans.encode(np.zeros(0, np.int64), 0)
    assert len(body) == rans.HEADER.size
    assert rans.decode(body, 0, 0).size == 0
    with pytest.raises(rans.RansError):
        rans.decode(body + b"\0", 0, 0)


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 100000])
def test_single_symbol(n):
    body = roundtrip(np.full(n, 5), alphabet=6)
    # a certain symbol costs nothing: header, a 2-entry table and the lanes' states only
    lanes = struct.unpack_from("<H", body)[0]
    assert len(body) <= rans.HEADER.size + 8 + 4 * lanes


def test_large_alphabet():
    rng = np.random.default_rng(1)
    # every symbol of the largest alphabet, each once: every frequency is 1 at precision 16
    u = rng.permutation(rans.MAX_ALPHABET)
    roundtrip(u, alphabet=rans.MAX_ALPHABET)
    # a sparse draw from the full range (zero runs in the table)
    u = rng.integers(0, rans.MAX_ALPHABET, size=3000)
    roundtrip(u, alphabet=rans.MAX_ALPHABET)
    with pytest.raises(ValueError):
        rans.encode(np.zeros(3, np.int64), rans.MAX_ALPHABET + 1)


def test_size_close_to_entropy():
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.full(200, 0.3))
    u = rng.choice(200, size=300000, p=p)
    body = rans.encode(u, 200)
    c = np.bincount(u)
    q = c[c > 0] / u.size
    ideal = -(c[c > 0] * np.log2(q)).sum() / 8
    assert ideal < len(body) < ideal * 1.006


def test_quantize_frequencies():
    rng = np.random.default_rng(3)
    for m in (1, 4, 12, 16):
        k = min(1 << m, 500)
        c = np.zeros(k + 10, np.int64)
        c[rng.choice(k + 10, size=k, replace=False)] = rng.integers(1, 10**6, size=k)
        f = rans.quantize_frequencies(c, m)
        assert f.sum() == 1 << m
        assert ((f > 0) == (c > 0)).all()
    with pytest.raises(ValueError):
        rans.quantize_frequencies(np.ones(5), 2)


def test_deterministic():
    rng = np.random.default_rng(4)
    u = rng.integers(0, 50, size=50000)
    assert rans.encode(u, 50) == rans.encode(u.copy(), 50)


def test_lanes_are_interleaved_symbol_order():
    """The documented layout, decoded by a plain scalar loop (the reference for other languages)."""
    rng = np.random.default_rng(5)
    u = rng.choice(40, size=5003, p=rng.dirichlet(np.ones(40)))
    body = rans.encode(u, 40, lanes=7)
    lanes, m, tcoder, tlen = rans.HEADER.unpack_from(body)
    assert lanes == 7
    pos = rans.HEADER.size
    table = body[pos: pos + tlen]
    if tcoder == rans.TABLE_ZSTD:
        import zstandard

        table = zstandard.ZstdDecompressor().decompress(table, max_output_size=1 << 16)
    freqs = rans._parse_table(table, 40, m).tolist()
    cum = [0]
    for f in freqs:
        cum.append(cum[-1] + f)
    pos += tlen
    state = list(struct.unpack_from(f"<{lanes}I", body, pos))
    pos += 4 * lanes
    words = struct.unpack_from(f"<{(len(body) - pos) // 2}H", body, pos)
    w = 0
    out = []
    for i in range(len(u)):
        j = i % lanes
        x = state[j]
        slot = x & ((1 << m) - 1)
        s = next(k for k in range(40) if cum[k] <= slot < cum[k + 1])
        x = freqs[s] * (x >> m) + slot - cum[s]
        if x < 1 << 16:
            x = (x << 16) | words[w]
            w += 1
        state[j] = x
        out.append(s)
    assert out == u.tolist() and w == len(words) and state == [1 << 16] * lanes


# ----------------------------------------------------------------------------- corrupt input


@pytest.fixture(scope="module")
def sample():
    rng = np.random.default_rng(6)
    u = rng.choice(300, size=20000, p=rng.dirichlet(np.full(300, 0.5)))
    return u, rans.encode(u, 300)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_corruption_raises_rans_error(sample, data):
    u, body = sample
    b = bytearray(body)
    op = data.draw(st.sampled_from(["flip", "truncate", "extend", "splice"]))
    if op == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(b) - 1))
            b[i] ^= data.draw(st.integers(1, 255))
    elif op == "truncate":
        b = b[: data.draw(st.integers(0, len(b) - 1))]
    elif op == "extend":
        b += bytes(data.draw(st.binary(min_size=1, max_size=8)))
    else:
        i = data.draw(st.integers(0, len(b)))
        b[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        out = rans.decode(bytes(b), len(u), 300)
    except rans.RansError:
        return
    # a change that still decodes consistently must at least decode to valid symbols
    assert out.shape == (len(u),) and int(out.max()) < 300


@pytest.mark.parametrize("patch", [
    lambda b: struct.pack("<HBBI", 0, 16, 0, 0) + b[8:],  # zero lanes
    lambda b: struct.pack("<HBBI", 65535, 16, 0, 12) + b[8:],  # lanes beyond n and the bytes
    lambda b: b[:2] + bytes([17]) + b[3:],  # precision 17
    lambda b: b[:2] + bytes([0]) + b[3:],  # precision 0
    lambda b: b[:3] + bytes([7]) + b[4:],  # unknown table coder
    lambda b: b[:4] + struct.pack("<I", 2**32 - 1) + b[8:],  # table length past the end
    lambda b: b[:-1],  # odd word bytes
    lambda b: b[:-2],  # a word missing
    lambda b: b + b"\0\0",  # an unused word
])
def test_structural_corruption(sample, patch):
    u, body = sample
    with pytest.raises(rans.RansError):
        rans.decode(patch(body), len(u), 300)


def test_zstd_table_bomb_is_bounded():
    import zstandard

    rng = np.random.default_rng(7)
    u = rng.integers(0, 2000, size=5000)
    body = rans.encode(u, 2000)
    lanes, m, _, tlen = rans.HEADER.unpack_from(body)
    bomb = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(b"\x01" * (1 << 24))
    bad = rans.HEADER.pack(lanes, m, rans.TABLE_ZSTD, len(bomb)) + bomb + body[rans.HEADER.size + tlen:]
    with pytest.raises(rans.RansError):
        rans.decode(bad, 5000, 2000)


def test_wrong_counts(sample):
    u, body = sample
    for n in (len(u) - 1, len(u) + 1):
        with pytest.raises(rans.RansError):
            rans.decode(body, n, 300)
    with pytest.raises(rans.RansError):
        rans.decode(body, len(u), 299)
    with pytest.raises(rans.RansError):
        rans.decode(body, len(u), rans.MAX_ALPHABET + 1)


# ----------------------------------------------------------------------------- compiled loops

compiled = pytest.mark.skipif(not compiled_ops.available(), reason="visionmoe._C is not built")


def _numpy_only(monkeypatch):
    monkeypatch.setattr(compiled_ops, "available", lambda: False)


@compiled
@settings(max_examples=120, deadline=None)
@given(st.integers(1, 5000), st.floats(0.05, 3.0), st.integers(1, 400), st.integers(1, 70),
       st.integers(0, 2**32 - 1))
def test_compiled_loops_match_numpy(n, conc, alphabet, lanes, seed):
    """The C++ loops write the reference's states and words exactly and decode them back."""
    rng = np.random.default_rng(seed)
    u = rng.choice(alphabet, size=n, p=rng.dirichlet(np.full(alphabet, conc)))
    counts = np.bincount(u, minlength=alphabet)
    precision = max(4, int(np.ceil(np.log2((counts > 0).sum()))) + int(rng.integers(0, 4)))
    precision = min(precision, rans.MAX_PRECISION)
    freqs = rans.quantize_frequencies(counts, precision)
    lanes = min(lanes, n)
    states, words = compiled_ops.rans_encode(u, freqs, precision, lanes)
    ref_states, ref_words = rans._encode_lanes(u.astype(np.int64), freqs, precision, lanes)
    np.testing.assert_array_equal(states, ref_states)
    np.testing.assert_array_equal(words, ref_words)
    out, status, _ = compiled_ops.rans_decode(states, words, freqs, precision, n)
    assert status == compiled_ops.DECODED
    np.testing.assert_array_equal(out, u)
    np.testing.assert_array_equal(rans._decode_lanes(states.astype(np.uint64), words.astype(np.uint64), freqs,
                                                     precision, n), u)


@compiled
def test_compiled_and_numpy_write_the_same_bytes(monkeypatch, sample):
    u, body = sample
    for lanes in (1, 5, 8, 64, None):
        compiled_body = rans.encode(u, 300, lanes=lanes)
        with monkeypatch.context() as m:
            _numpy_only(m)
            assert rans.encode(u, 300, lanes=lanes) == compiled_body


@pytest.mark.parametrize("loops", ["compiled", "numpy"])
@pytest.mark.parametrize("patch", [
    lambda b: b[:-2],  # a word missing: the words run out
    lambda b: b + b"\0\0",  # an unused word
    lambda b: b[:rans.HEADER.size + struct.unpack_from("<I", b, 4)[0]] + struct.pack("<I", 1 << 16)
    + b[rans.HEADER.size + struct.unpack_from("<I", b, 4)[0] + 4:],  # lane 0's state replaced
])
def test_both_loops_reject_corrupt_words(monkeypatch, sample, loops, patch):
    if loops == "numpy":
        _numpy_only(monkeypatch)
    elif not compiled_ops.available():
        pytest.skip("visionmoe._C is not built")
    u, body = sample
    with pytest.raises(rans.RansError, match="words|initial state"):
        rans.decode(patch(body), len(u), 300)


def test_numpy_fallback_roundtrips(monkeypatch):
    _numpy_only(monkeypatch)
    rng = np.random.default_rng(8)
    for lanes in (1, 7, 8, 300):
        roundtrip(rng.choice(60, size=4000, p=rng.dirichlet(np.ones(60))), lanes=lanes)


@compiled
def test_compiled_loops_check_their_arguments():
    freqs = rans.quantize_frequencies(np.array([3, 0, 5]), 8)  # symbol 1 has frequency 0
    with pytest.raises(RuntimeError, match="frequency 0"):
        compiled_ops.rans_encode(np.array([0, 1, 2]), freqs, 8, 1)
    with pytest.raises(RuntimeError, match="sum to 2\\^precision"):
        compiled_ops.rans_encode(np.array([0, 2]), freqs, 9, 1)
    with pytest.raises(RuntimeError, match="lanes"):
        compiled_ops.rans_encode(np.array([0, 2]), freqs, 8, 3)
    with pytest.raises(RuntimeError, match="lane state"):
        compiled_ops.rans_decode(np.array([5]), np.zeros(0, np.uint16), freqs, 8, 1)


def _varint_table_loop(freqs) -> bytes:
    """The table layout written one value at a time: the reference of the vectorised writer."""
    out, fl, i = bytearray(), [int(x) for x in freqs], 0

    def put(v):
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)

    while i < len(fl):
        if fl[i] == 0:
            j = i
            while j < len(fl) and fl[j] == 0:
                j += 1
            put(0)
            put(j - i - 1)
            i = j
        else:
            put(fl[i])
            i += 1
    return bytes(out)


def test_vectorised_frequency_table_matches_the_loop_byte_for_byte():
    rng = np.random.default_rng(7)
    cases = [np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(300, np.int64), np.array([1 << 20]),
             np.array([0, 0, 5, 0]), np.array([127, 128, 16383, 16384, 0, 1])]
    for _ in range(300):
        n = int(rng.integers(1, 3000))
        f = rng.integers(0, 1 << int(rng.integers(1, 22)), n)
        f[rng.random(n) < rng.random()] = 0  # zero runs of every length
        cases.append(f)
    for f in cases:
        assert rans._varint_table_ref(f) == _varint_table_loop(f)
        if compiled_ops.has_table_writer():
            assert compiled_ops.table_varints(f) == _varint_table_loop(f)


@pytest.mark.skipif(not compiled_ops.has_table_writer(), reason="needs the compiled extension (make build)")
def test_compiled_table_writer_refuses_negative_frequencies():
    with pytest.raises(RuntimeError, match="non-negative"):
        compiled_ops.table_varints(np.array([3, -1, 2]))
