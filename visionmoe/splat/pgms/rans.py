"""A portable interleaved rANS coder for .pgms integer streams (format 4).

Every byte this module writes is defined in ``docs/FORMAT.md`` ("Coder 4: interleaved rANS"),
so that any language can decode it from the specification alone; ``web/src/rans.js`` is the
JavaScript implementation. Parameters:

* **State**: 32 bits, kept in ``[L, 2^32)`` with ``L = 2^16``; **renormalisation** reads or
  writes one 16-bit word at a time (at most one per symbol, since the precision is at most 16).
* **Precision** ``M`` (1-16): symbol frequencies are integers summing to ``2^M``, stored in the
  stream (varint table, optionally zstd-compressed), so no floating point is involved anywhere.
* **Lanes** ``N`` (1-65535, chosen by the encoder from the stream's estimated size): symbol
  ``i`` goes to lane ``i mod N``; each lane has its own state, and the lanes share one word
  stream in a fixed order (symbol order), so the decoder needs no per-lane lengths.

The loops over the symbols run compiled where the extension is built (``visionmoe.ops.rans``:
the same bytes, several times faster); the numpy loops here (vectorised over the
lanes) are the fallback and the reference the tests compare the compiled ones with.

Body layout (all little-endian)::

    lanes u16 | precision u8 | table_coder u8 | table_len u32 | table (table_len bytes)
    | state[lanes] u32 | word u16 ...

Decoding symbol ``i`` (lane ``j = i mod N``, state ``x = state[j]``)::

    slot = x & (2^M - 1);  s = the symbol with cum[s] <= slot < cum[s] + freq[s]
    x = freq[s] * (x >> M) + slot - cum[s]
    if x < 2^16: x = (x << 16) | next word
    state[j] = x

A valid stream uses every word and ends with every lane's state equal to ``2^16``; anything
else is corrupt. Errors raise :class:`RansError` (the stream reader turns it into its
``FormatError``). Memory is bounded by the arguments, never by counts read from the stream.
"""

from __future__ import annotations

import struct

import numpy as np

from ...ops import rans as compiled_ops
from ._zstd import zstd_compressor

__all__ = ["RansError", "encode", "decode", "quantize_frequencies", "choose_lanes", "MAX_PRECISION",
           "MAX_ALPHABET", "MAX_LANES"]

STATE_LOW = 1 << 16  # L: states live in [L, 2^32)
WORD_BITS = 16
MAX_PRECISION = 16
MAX_ALPHABET = 1 << 16
MAX_LANES = 0xFFFF
HEADER = struct.Struct("<HBBI")  # lanes, precision, table_coder, table_len
TABLE_VARINT, TABLE_ZSTD = 0, 1
# lanes: about one per LANE_BYTES of estimated output (the lanes' final states cost ~3 bytes
# each), at most MAX_AUTO_LANES
LANE_BYTES = 1024
MAX_AUTO_LANES = 4096


class RansError(ValueError):
    """A rANS stream body is corrupt or does not match the counts the caller expects."""


# --------------------------------------------------------------------------- frequency tables


def quantize_frequencies(counts: np.ndarray, precision: int) -> np.ndarray:
    """Integer frequencies summing to ``2^precision``, >= 1 wherever ``counts > 0``, 0 elsewhere,
    close to proportional (greedy on the coding cost ``sum c_i log2(2^M / f_i)``). Deterministic."""
    c = np.asarray(counts, np.int64)
    idx = np.flatnonzero(c > 0)
    if len(idx) == 0:
        raise ValueError("no symbol has a nonzero count")
    f = np.zeros(len(c), np.int64)
    f[idx] = _quantize_nonzero(c[idx].astype(np.float64), precision)
    return f


def _quantize_nonzero(cn: np.ndarray, precision: int) -> np.ndarray:
    """:func:`quantize_frequencies` of the nonzero counts ``cn`` (float64) alone (the precision
    search quantises one stream's counts at a dozen precisions)."""
    total_f = 1 << precision
    if len(cn) > total_f:
        raise ValueError(f"{len(cn)} distinct symbols do not fit precision {precision}")
    target = cn * (total_f / cn.sum())
    fq = np.maximum(np.floor(target).astype(np.int64), 1)
    diff = total_f - int(fq.sum())
    if diff > 0:
        # +1 where it saves the most bits: c * log2((f + 1) / f); diff < k, so one pass
        gain = cn * np.log2((fq + 1) / fq)
        order = np.lexsort((np.arange(len(fq)), -gain))
        fq[order[:diff]] += 1
    while diff < 0:
        # -1 (only where f > 1) where it costs the least: c * log2(f / (f - 1))
        can = fq > 1
        cost = np.where(can, cn * np.log2(fq / np.maximum(fq - 1, 1)), np.inf)
        order = np.lexsort((np.arange(len(fq)), cost))
        take = order[: min(-diff, int(can.sum()))]
        fq[take] -= 1
        diff = total_f - int(fq.sum())
        if diff > 0:  # cannot happen (each step removes at most what is over), kept as a guard
            raise AssertionError("frequency quantisation overshot")
    return fq


def _varint_table(freqs: np.ndarray) -> bytes:
    """freq 0 runs as ``0, run - 1``; other frequencies as themselves; LEB128 varints. Compiled
    where the extension has it: every candidate precision of every rANS stream of every
    candidate file of the searches writes one (numpy's passes were 5% of a `default` encode)."""
    if compiled_ops.has_table_writer():
        return compiled_ops.table_varints(freqs)
    return _varint_table_ref(freqs)


def _varint_table_ref(freqs: np.ndarray) -> bytes:
    """:func:`_varint_table` in numpy, vectorised (a Python loop was a tenth of the coding time at
    SOG's size on academic_tarot_cards)."""
    f = np.asarray(freqs, np.int64).reshape(-1)
    if f.size == 0:
        return b""
    zero = f == 0
    starts = zero & np.concatenate(([True], ~zero[:-1]))  # first zero of each run
    kept = np.flatnonzero(~zero | starts)
    ends = np.flatnonzero(zero & np.concatenate((~zero[1:], [True])))  # last zero of each run
    run_len = ends - np.flatnonzero(starts)  # run - 1
    is_run = zero[kept]
    tokens = np.empty(len(kept) + int(is_run.sum()), np.int64)
    pos = np.arange(len(kept)) + np.concatenate(([0], np.cumsum(is_run)[:-1]))
    tokens[pos] = np.where(is_run, 0, f[kept])
    tokens[pos[is_run] + 1] = run_len
    return _leb128(tokens)


def _leb128(values: np.ndarray) -> bytes:
    """Unsigned LEB128 of each value, concatenated (7 bits a byte, low first, 0x80 = more)."""
    v = values.astype(np.uint64)
    nbytes = np.ones(len(v), np.int64)
    rest = v >> np.uint64(7)
    while rest.any():
        nbytes += rest > 0
        rest >>= np.uint64(7)
    owner = np.repeat(np.arange(len(v)), nbytes)
    k = np.arange(len(owner)) - np.repeat(np.cumsum(nbytes) - nbytes, nbytes)
    byte = (v[owner] >> (np.uint64(7) * k.astype(np.uint64))) & np.uint64(0x7F)
    more = k < nbytes[owner] - 1
    return (byte | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8).tobytes()


def _parse_table(b: bytes, alphabet: int, precision: int) -> np.ndarray:
    freqs = np.zeros(alphabet, np.int64)
    pos, s, nb = 0, 0, len(b)

    def varint():
        nonlocal pos
        v, shift = 0, 0
        while True:
            if pos >= nb:
                raise RansError("rANS frequency table is truncated")
            byte = b[pos]
            pos += 1
            v |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return v
            shift += 7
            if shift > 28:
                raise RansError("rANS frequency table holds an over-long varint")

    total = 1 << precision
    while s < alphabet:
        v = varint()
        if v == 0:
            run = varint() + 1
            if s + run > alphabet:
                raise RansError(f"rANS frequency table zero run passes the alphabet of {alphabet}")
            s += run
        else:
            if v > total:
                raise RansError(f"rANS frequency {v} exceeds 2^{precision}")
            freqs[s] = v
            s += 1
    if pos != nb:
        raise RansError(f"rANS frequency table has {nb - pos} bytes after its last entry")
    if int(freqs.sum()) != total:
        raise RansError(f"rANS frequencies sum to {int(freqs.sum())}, expected 2^{precision}")
    return freqs


# --------------------------------------------------------------------------- choices


def _cost_bits(counts: np.ndarray, freqs: np.ndarray, precision: int) -> float:
    nz = counts > 0
    return float((counts[nz] * (precision - np.log2(freqs[nz]))).sum())


def choose_lanes(estimated_bytes: float, n: int) -> int:
    """Lanes for a stream of ``n`` symbols and about ``estimated_bytes`` coded bytes: one per
    ``LANE_BYTES`` (the lanes' states cost ~0.3%), at least 1, at most ``n`` and MAX_AUTO_LANES."""
    return int(max(1, min(n, MAX_AUTO_LANES, estimated_bytes // LANE_BYTES)))


def _table_bytes(freqs: np.ndarray) -> tuple[int, bytes]:
    raw = _varint_table(freqs)
    if len(raw) > 64:
        z = zstd_compressor(19).compress(raw)
        if len(z) < len(raw):
            return TABLE_ZSTD, z
    return TABLE_VARINT, raw


# --------------------------------------------------------------------------- coder


def encode(u: np.ndarray, alphabet: int, *, precision: int | None = None, lanes: int | None = None) -> bytes:
    """Code unsigned symbols ``u`` (each < ``alphabet`` <= 65536) -> stream body bytes.

    ``precision`` / ``lanes``: None chooses them (the precision with the fewest estimated table
    plus payload bytes among a few candidates; lanes from the estimated size)."""
    u = np.asarray(u).reshape(-1)
    n = u.size
    if not 0 <= alphabet <= MAX_ALPHABET:
        raise ValueError(f"alphabet {alphabet} outside [0, {MAX_ALPHABET}]")
    if n == 0:
        return HEADER.pack(0, MAX_PRECISION, TABLE_VARINT, 0)
    u = u.astype(np.int64)
    if int(u.min()) < 0 or int(u.max()) >= alphabet:
        raise ValueError(f"symbols must lie in [0, {alphabet})")
    counts = np.bincount(u, minlength=alphabet)
    nz_bits = max(1, int(np.ceil(np.log2(max(int((counts > 0).sum()), 1)))))
    if precision is None:
        cands = range(max(nz_bits, 4), MAX_PRECISION + 1)
        best = None
        idx = np.flatnonzero(counts)
        cn = counts[idx].astype(np.float64)
        fr = np.zeros(alphabet, np.int64)
        for m in cands:
            fq = _quantize_nonzero(cn, m)
            fr[idx] = fq
            tc, tb = _table_bytes(fr)
            est = len(tb) + float((cn * (m - np.log2(fq))).sum()) / 8  # _cost_bits on the nonzero counts
            if best is None or est < best[0]:
                best = (est, m, fr.copy(), tc, tb)
        _, precision, freqs, tcoder, table = best
    else:
        if not nz_bits <= precision <= MAX_PRECISION:
            raise ValueError(f"precision {precision} outside [{nz_bits}, {MAX_PRECISION}]")
        freqs = quantize_frequencies(counts, precision)
        tcoder, table = _table_bytes(freqs)
    if lanes is None:
        lanes = choose_lanes(_cost_bits(counts, freqs, precision) / 8, n)
    if not 1 <= lanes <= min(n, MAX_LANES):
        raise ValueError(f"lanes {lanes} outside [1, min(n, {MAX_LANES})]")
    states, words = _encode_loop(u, freqs, precision, lanes)
    return (HEADER.pack(lanes, precision, tcoder, len(table)) + table + states.astype("<u4").tobytes()
            + words.astype("<u2").tobytes())


# below this many lanes a plain Python loop over the symbols beats numpy steps over the lanes
_SCALAR_LANES = 8


def _encode_loop(u: np.ndarray, freqs: np.ndarray, precision: int, lanes: int):
    if compiled_ops.available():
        return compiled_ops.rans_encode(u, freqs, precision, lanes)
    return _encode_lanes(u, freqs, precision, lanes)


def _decode_loop(x: np.ndarray, words: np.ndarray, freqs: np.ndarray, precision: int, n: int) -> np.ndarray:
    if not compiled_ops.available():
        return _decode_lanes(x, words.astype(np.uint64), freqs, precision, n)
    out, status, detail = compiled_ops.rans_decode(x, words, freqs, precision, n)
    if status == compiled_ops.WORDS_EXHAUSTED:
        raise RansError(f"rANS word stream exhausted at symbol {detail} ({len(words)} words)")
    if status == compiled_ops.WORDS_UNUSED:
        raise RansError(f"rANS stream has {detail} unused words")
    if status == compiled_ops.BAD_FINAL_STATE:
        raise RansError("rANS lanes do not end in the initial state (corrupt stream)")
    return out


def _encode_lanes(u: np.ndarray, freqs: np.ndarray, precision: int, lanes: int):
    if lanes < _SCALAR_LANES:
        return _encode_scalar(u, freqs, precision, lanes)
    cum = np.concatenate([[0], np.cumsum(freqs)[:-1]]).astype(np.uint64)
    f64 = freqs.astype(np.uint64)
    n = len(u)
    n_blocks = -(-n // lanes)
    pad = n_blocks * lanes - n
    # symbols as [blocks, lanes]; the padding lanes of the last block carry no symbol: they get
    # frequency 2^M (x stays x) and a bound no state reaches, so they never emit or change
    fb = np.concatenate([f64[u], np.full(pad, 1 << precision, np.uint64)]).reshape(n_blocks, lanes)
    cb = np.concatenate([cum[u], np.zeros(pad, np.uint64)]).reshape(n_blocks, lanes)
    xmax = fb << np.uint64(32 - precision)  # renormalise while x >= freq << (32 - M)
    x = np.full(lanes, STATE_LOW, np.uint64)
    chunks = []
    M = np.uint64(precision)
    for b in range(n_blocks - 1, -1, -1):
        f = fb[b]
        need = x >= xmax[b]
        chunks.append(x[need])
        x >>= need.astype(np.uint64) << np.uint64(4)  # 16 where a word was written
        q, r = np.divmod(x, f)
        x = (q << M) + r + cb[b]
    words = (np.concatenate(chunks[::-1]) & np.uint64(0xFFFF)).astype(np.uint16) if chunks else np.zeros(0, np.uint16)
    return x.astype(np.uint32), words


def _encode_scalar(u: np.ndarray, freqs: np.ndarray, precision: int, lanes: int):
    fl = freqs.tolist()
    cl = [0] * len(fl)
    acc = 0
    for i, f in enumerate(fl):
        cl[i] = acc
        acc += f
    x = [STATE_LOW] * lanes
    shift = 32 - precision
    out = []  # words in reverse order
    ul = u.tolist()
    n = len(ul)
    for i in range(n - 1, -1, -1):
        j = i % lanes
        s = ul[i]
        f = fl[s]
        xs = x[j]
        if xs >= f << shift:
            out.append(xs & 0xFFFF)
            xs >>= 16
        x[j] = ((xs // f) << precision) + xs % f + cl[s]
    # the vector encoder emits, per block, in lane order; in reverse symbol order that is the
    # same sequence read backwards, so reversing ``out`` gives the decoder's order
    return np.array(x, np.uint32), np.array(out[::-1], np.uint16)


def decode(body: bytes, n: int, alphabet: int) -> np.ndarray:
    """Decode ``n`` symbols (each < ``alphabet``) from a stream body -> uint64 array [n].

    ``n`` and ``alphabet`` come from the caller (the stream header, checked against the format's
    limits); every count read from ``body`` is checked against them and against ``len(body)``
    before anything is allocated from it. Raises :class:`RansError` on any inconsistency."""
    if not 0 <= alphabet <= MAX_ALPHABET:
        raise RansError(f"rANS alphabet {alphabet} outside [0, {MAX_ALPHABET}]")
    if n < 0:
        raise RansError(f"rANS symbol count {n} is negative")
    mv = memoryview(body)
    if len(mv) < HEADER.size:
        raise RansError(f"rANS stream of {len(mv)} bytes is shorter than its {HEADER.size}-byte header")
    lanes, precision, tcoder, tlen = HEADER.unpack_from(mv, 0)
    if n == 0:
        if lanes or tlen or len(mv) != HEADER.size:
            raise RansError("empty rANS stream must be a bare header with 0 lanes")
        return np.zeros(0, np.uint64)
    if not 1 <= lanes <= n:
        raise RansError(f"rANS stream declares {lanes} lanes for {n} symbols")
    if not 1 <= precision <= MAX_PRECISION:
        raise RansError(f"rANS precision {precision} outside [1, {MAX_PRECISION}]")
    if alphabet == 0:
        raise RansError("rANS stream with symbols but an empty alphabet")
    pos = HEADER.size
    if pos + tlen + 4 * lanes > len(mv):
        raise RansError(f"rANS table ({tlen} bytes) and {lanes} lane states pass the end of the {len(mv)}-byte stream")
    tb = bytes(mv[pos: pos + tlen])
    pos += tlen
    if tcoder == TABLE_ZSTD:
        tb = _unzstd_table(tb, 3 * alphabet + 8)
    elif tcoder != TABLE_VARINT:
        raise RansError(f"rANS table coder {tcoder} unknown (0 varint, 1 zstd)")
    freqs = _parse_table(tb, alphabet, precision)
    x = np.frombuffer(mv[pos: pos + 4 * lanes], dtype="<u4").astype(np.uint64)
    pos += 4 * lanes
    if (len(mv) - pos) % 2:
        raise RansError("rANS word stream has an odd number of bytes")
    if int(x.min()) < STATE_LOW:
        raise RansError("rANS lane state below 2^16")
    words = np.frombuffer(mv[pos:], dtype="<u2")
    return _decode_loop(x, words, freqs, precision, n)


def _unzstd_table(b: bytes, limit: int) -> bytes:
    import zstandard

    try:
        # a frame that declares a content size larger than any valid table is corrupt; without
        # one, max_output_size bounds the buffer (never a size read from the stream)
        declared = zstandard.frame_content_size(b)
        if declared > limit:
            raise RansError(f"rANS table frame declares {declared} bytes, more than {limit}")
        return zstandard.ZstdDecompressor().decompress(b, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise RansError(f"corrupt zstd rANS table ({exc})") from None


def _decode_lanes(x: np.ndarray, words: np.ndarray, freqs: np.ndarray, precision: int, n: int) -> np.ndarray:
    lanes = len(x)
    cum = np.concatenate([[0], np.cumsum(freqs)[:-1]]).astype(np.int64)
    if lanes < _SCALAR_LANES:
        return _decode_scalar(x, words, freqs, cum, precision, n)
    # slot -> symbol: repeat each symbol freq times (2^M entries)
    slot_sym = np.repeat(np.arange(len(freqs), dtype=np.uint64), freqs)
    f_of = freqs.astype(np.uint64)[slot_sym.astype(np.int64)]
    bias_of = np.arange(1 << precision, dtype=np.uint64) - cum.astype(np.uint64)[slot_sym.astype(np.int64)]
    mask = np.uint64((1 << precision) - 1)
    M = np.uint64(precision)
    low = np.uint64(STATE_LOW)
    n_blocks = -(-n // lanes)
    out = np.empty(n_blocks * lanes, np.uint64).reshape(n_blocks, lanes)
    ptr, nw = 0, len(words)
    last = n - (n_blocks - 1) * lanes
    for b in range(n_blocks):
        if b == n_blocks - 1 and last < lanes:
            x, rest = x[:last].copy(), x[last:]
            out = out.reshape(-1)[: n_blocks * lanes]
            o = out[b * lanes: b * lanes + last]
        else:
            rest = None
            o = out[b]
        slot = x & mask
        np.take(slot_sym, slot, out=o)
        x = f_of[slot] * (x >> M) + bias_of[slot]
        need = x < low
        k = int(np.count_nonzero(need))
        if k:
            if ptr + k > nw:
                raise RansError(f"rANS word stream exhausted at symbol {b * lanes} ({nw} words)")
            x[need] = (x[need] << np.uint64(16)) | words[ptr: ptr + k]
            ptr += k
        if rest is not None:
            x = np.concatenate([x, rest])
    if ptr != nw:
        raise RansError(f"rANS stream has {nw - ptr} unused words")
    if (x != low).any():
        raise RansError("rANS lanes do not end in the initial state (corrupt stream)")
    return out.reshape(-1)[:n]


def _decode_scalar(x: np.ndarray, words: np.ndarray, freqs: np.ndarray, cum: np.ndarray, precision: int,
                   n: int) -> np.ndarray:
    lanes = len(x)
    xs = x.tolist()
    wl = words.tolist()
    nw = len(wl)
    fl = freqs.tolist()
    cl = cum.tolist()
    slot_sym = np.repeat(np.arange(len(fl)), freqs).tolist()
    mask = (1 << precision) - 1
    out = [0] * n
    ptr = 0
    j = 0
    for i in range(n):
        v = xs[j]
        slot = v & mask
        s = slot_sym[slot]
        out[i] = s
        v = fl[s] * (v >> precision) + slot - cl[s]
        if v < STATE_LOW:
            if ptr >= nw:
                raise RansError(f"rANS word stream exhausted at symbol {i} ({nw} words)")
            v = (v << 16) | wl[ptr]
            ptr += 1
        xs[j] = v
        j += 1
        if j == lanes:
            j = 0
    if ptr != nw:
        raise RansError(f"rANS stream has {nw - ptr} unused words")
    if any(v != STATE_LOW for v in xs):
        raise RansError("rANS lanes do not end in the initial state (corrupt stream)")
    return np.array(out, np.uint64)
