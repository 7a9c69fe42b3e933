"""Pure-Python reference of the compiled zstd literals check (``csrc/codec/zstd_check_cpu.cpp``),
with the same name, argument and result: what :mod:`visionmoe.ops.zstd_literals` runs when the
extension cannot load, and the tests' oracle for the C++ loops. Slow (about a microsecond per
literal), exact.

It walks one zstd frame (RFC 8878) block by block and, in every compressed block, reads the
literals section: the Huffman tree description (direct 4-bit weights or FSE-coded weights) of a
Compressed literals block, or the previous one for a Treeless block, then decodes each of its
1 or 4 Huffman streams and requires it to give exactly its regenerated size with the bit reader
ending exactly at the stream's first bit (RFC 8878 section 4.2.2). Everything after the literals
section (the sequences) is skipped. The result is ``(code, offset)``: ``VALID, 0`` or the first
problem's code (below) and the byte offset in the frame of the structure that has it.
"""

from __future__ import annotations

# result codes, shared with the C++ kernel (csrc/codec/zstd_check.h)
VALID = 0
BAD_FRAME_HEADER = 1  # no zstd magic, a reserved frame header bit, or a truncated frame header
BAD_BLOCK = 2  # a block header or block body past the end of the data, or block type 3
BAD_LITERALS_HEADER = 3  # a literals header or section that does not fit its block, bad sizes
BAD_HUFFMAN_TABLE = 4  # a Huffman tree description that is not a valid prefix code
NO_HUFFMAN_TABLE = 5  # a Treeless literals block with no earlier Huffman table in the frame
BAD_JUMP_TABLE = 6  # the 4-stream jump table leaves a stream empty
NO_END_MARK = 7  # a Huffman stream whose last byte is 0 (no padding bit)
INEXACT_STREAM = 8  # a Huffman stream that does not decode exactly its size to its first bit

MAGIC = b"\x28\xb5\x2f\xfd"
BLOCK_MAX = 1 << 17  # literals of one block: at most 128 KiB
MIN_LITERALS_4_STREAMS = 6
MAX_WEIGHT = 11  # RFC 8878 4.2.1: at most 11 bits per code
MAX_TABLE_LOG = 12  # libzstd's decoding table limit
FSE_WEIGHT_LOG = 6  # accuracy log limit of the FSE-coded weights


def _frame_header_size(b: bytes) -> int:
    """Bytes of the frame header (magic included); 0 when it is not a valid one."""
    if len(b) < 5 or b[:4] != MAGIC or b[4] & 0x08:
        return 0
    fhd = b[4]
    single = (fhd >> 5) & 1
    size = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + (single, 2, 4, 8)[fhd >> 6]
    return size if size <= len(b) else 0


def zstd_literals_check(b: bytes) -> tuple[int, int]:
    """-> (code, offset): VALID, 0 when every Huffman literal stream of the frame at the start of
    ``b`` is exact; else the first problem (bytes after the frame are not looked at)."""
    pos = _frame_header_size(b)
    if pos == 0:
        return BAD_FRAME_HEADER, 0
    table = None
    while True:
        if pos + 3 > len(b):
            return BAD_BLOCK, pos
        h = b[pos] | b[pos + 1] << 8 | b[pos + 2] << 16
        last, btype, size = h & 1, (h >> 1) & 3, h >> 3
        start = pos + 3
        end = start + (1 if btype == 1 else size)
        if btype == 3 or end > len(b):
            return BAD_BLOCK, pos
        if btype == 2:
            code, at, table = _literals(b, start, end, table)
            if code != VALID:
                return code, at
        pos = end
        if last:
            return VALID, 0


def _literals(b: bytes, start: int, end: int, table):
    """Check the literals section at ``b[start:end]`` (a compressed block) -> (code, offset,
    the Huffman table the next Treeless block reuses)."""
    if start >= end:
        return BAD_LITERALS_HEADER, start, table
    ltype, sf = b[start] & 3, (b[start] >> 2) & 3
    if ltype < 2:  # Raw or RLE literals: no Huffman stream
        return VALID, 0, table
    lh = 3 if sf < 2 else sf + 2
    if start + lh > end:
        return BAD_LITERALS_HEADER, start, table
    v = int.from_bytes(b[start:start + lh], "little")
    bits = (10, 10, 14, 18)[sf]
    regen, comp = (v >> 4) & ((1 << bits) - 1), (v >> (4 + bits)) & ((1 << bits) - 1)
    streams = 1 if sf == 0 else 4
    if regen > BLOCK_MAX or (streams == 4 and regen < MIN_LITERALS_4_STREAMS) or start + lh + comp > end:
        return BAD_LITERALS_HEADER, start, table
    pos, stop = start + lh, start + lh + comp
    if ltype == 2:
        parsed = _huffman_table(b, pos, stop)
        if parsed is None:
            return BAD_HUFFMAN_TABLE, pos, table
        table, used = parsed
        pos += used
    elif table is None:
        return NO_HUFFMAN_TABLE, start, table
    code, at = _streams(b, pos, stop, regen, streams, table)
    return code, at, table


def _streams(b: bytes, pos: int, stop: int, regen: int, streams: int, table) -> tuple[int, int]:
    """Decode the 1 or 4 Huffman streams of ``b[pos:stop]`` (``regen`` literals in all)."""
    if streams == 1:
        return _stream(b, pos, stop, regen, table)
    if stop - pos < 10:
        return BAD_JUMP_TABLE, pos
    sizes = [b[pos] | b[pos + 1] << 8, b[pos + 2] | b[pos + 3] << 8, b[pos + 4] | b[pos + 5] << 8]
    sizes.append(stop - pos - 6 - sum(sizes))
    if min(sizes) < 1:
        return BAD_JUMP_TABLE, pos
    segment = (regen + 3) // 4
    counts = (segment, segment, segment, regen - 3 * segment)
    at = pos + 6
    for size, count in zip(sizes, counts):
        code, where = _stream(b, at, at + size, count, table)
        if code != VALID:
            return code, where
        at += size
    return VALID, 0


def _stream(b: bytes, lo: int, hi: int, count: int, table) -> tuple[int, int]:
    """One Huffman stream ``b[lo:hi]``, read backwards from its padding bit: ``count`` codes must
    take it exactly to its first bit."""
    log, nbits = table
    if hi <= lo or b[hi - 1] == 0:
        return NO_END_MARK, lo
    # little-endian 24-bit windows at every byte, three zero bytes in front for the peeks that
    # reach below the first bit (the last code may be shorter than the table's log)
    data = bytes(3) + b[lo:hi] + bytes(2)
    win = [data[i] | data[i + 1] << 8 | data[i + 2] << 16 for i in range(len(data) - 2)]
    p = 8 * (hi - lo - 1) + b[hi - 1].bit_length() - 1 + 24  # bits left, plus the 24 in front
    mask = (1 << log) - 1
    for _ in range(count):
        if p <= 24:  # no bit left for this code
            return INEXACT_STREAM, lo
        q = p - log
        p -= nbits[(win[q >> 3] >> (q & 7)) & mask]
    return (VALID, 0) if p == 24 else (INEXACT_STREAM, lo)


def _huffman_table(b: bytes, pos: int, stop: int):
    """The Huffman tree description at ``b[pos:stop]`` -> ((table log, code length of each
    table index), bytes used), or None when it is invalid."""
    if pos >= stop:
        return None
    hb = b[pos]
    if hb >= 128:
        n = hb - 127
        used = 1 + (n + 1) // 2
        if pos + used > stop:
            return None
        weights = [(b[pos + 1 + i // 2] >> (0 if i & 1 else 4)) & 15 for i in range(n)]
    else:
        used = 1 + hb
        if pos + used > stop:
            return None
        weights = _fse_weights(b[pos + 1:pos + used])
        if weights is None:
            return None
    table = _decoding_table(weights)
    return None if table is None else (table, used)


def _decoding_table(weights: list[int]):
    """(table log, code length per table index) of the prefix code the weights give (the last
    symbol's weight is implied); None if they give none."""
    if any(w > MAX_WEIGHT for w in weights):
        return None
    total = sum((1 << w) >> 1 for w in weights)
    if total == 0:
        return None
    log = total.bit_length()  # highbit(total) + 1
    rest = (1 << log) - total
    if log > MAX_TABLE_LOG or rest & (rest - 1):
        return None
    weights = weights + [rest.bit_length()]
    if weights.count(1) < 2 or weights.count(1) & 1:
        return None
    nbits = []
    for w in range(1, log + 1):  # weight 1 (the longest codes) first, symbols in order
        nbits += [log + 1 - w] * (weights.count(w) << (w - 1))
    return log, nbits


def _read_ncount(src: bytes, max_log: int):
    """FSE table description (RFC 8878 4.1.1) -> (accuracy log, normalized counts, bytes used),
    or None."""
    bits = int.from_bytes(src, "little")
    log = (bits & 15) + 5
    if log > max_log:
        return None
    at, remaining, threshold, nb = 4, (1 << log) + 1, 1 << log, log + 1
    counts: list[int] = []
    previous0 = False
    while True:
        if previous0:
            while True:
                repeat = (bits >> at) & 3
                at += 2
                counts += [0] * repeat
                if repeat < 3:
                    break
            if len(counts) >= 256:
                break
        most = 2 * threshold - 1 - remaining
        value = (bits >> at) & (threshold - 1)
        if value < most:
            at += nb - 1
        else:
            value = (bits >> at) & (2 * threshold - 1)
            if value >= threshold:
                value -= most
            at += nb
        count = value - 1
        remaining -= abs(count)
        counts.append(count)
        previous0 = count == 0
        if remaining < threshold:
            if remaining <= 1:
                break
            nb = remaining.bit_length()
            threshold = 1 << (nb - 1)
        if len(counts) >= 256:
            break
    used = (at + 7) >> 3
    if remaining != 1 or len(counts) > 256 or used > len(src):
        return None
    return log, counts, used


def _fse_table(log: int, counts: list[int]):
    """FSE decoding table -> (symbol, bits, base of the next state) per state, or None."""
    size = 1 << log
    symbol = [0] * size
    high = size - 1
    following = []
    for s, c in enumerate(counts):
        if c == -1:
            symbol[high] = s
            high -= 1
            following.append(1)
        else:
            following.append(c)
    step, position = (size >> 1) + (size >> 3) + 3, 0
    for s, c in enumerate(counts):
        for _ in range(max(c, 0)):
            symbol[position] = s
            position = (position + step) & (size - 1)
            while position > high:
                position = (position + step) & (size - 1)
    if position != 0:
        return None
    table = []
    for u in range(size):
        nxt = following[symbol[u]]
        following[symbol[u]] += 1
        nb = log - (nxt.bit_length() - 1)
        table.append((symbol[u], nb, (nxt << nb) - size))
    return table


def _fse_weights(src: bytes):
    """The Huffman weights coded by FSE in ``src`` (a table description, then two interleaved
    states read backwards) -> weights, or None."""
    if len(src) < 2:
        return None
    ncount = _read_ncount(src, FSE_WEIGHT_LOG)
    if ncount is None:
        return None
    log, counts, used = ncount
    table = _fse_table(log, counts)
    stream = src[used:]
    if table is None or not stream or stream[-1] == 0:
        return None
    bits = int.from_bytes(stream, "little")
    pos = 8 * (len(stream) - 1) + stream[-1].bit_length() - 1

    def read(n: int) -> int:  # bits below the stream's first read as 0 (at most 18 are read)
        nonlocal pos
        pos -= n
        return ((bits << 32) >> (pos + 32)) & ((1 << n) - 1)

    state = [read(log), read(log)]
    weights: list[int] = []
    while True:
        for k in (0, 1):
            if len(weights) > 253:
                return None
            sym, nb, base = table[state[k]]
            weights.append(sym)
            state[k] = base + read(nb)
            if pos < 0:  # the stream is used up: the other state gives the last weight
                weights.append(table[state[1 - k]][0])
                return weights
