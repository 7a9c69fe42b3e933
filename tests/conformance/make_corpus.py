"""The .pgms conformance corpus: valid and invalid files, each with the Python decoder's outcome,
that the JavaScript decoder must match file by file (``test_conformance.py``).

    python tests/conformance/make_corpus.py --out DIR [--mutants 2660] [--seed 52]

Everything is generated here, seeded (nothing is stored in the repository):

* ``source``: small format-5 encodes (SH degree 0-2, appearance codebook, per-primitive SH,
  value tables, with and without XFRM), decoded in full;
* ``prefix``: every section and stream boundary of each source and the bytes either side,
  decoded at each level the prefix holds;
* ``mutant``: the seeded mutation fuzzer of the robustness tests (``tests/splat/hostile.py``:
  truncations, HEAD and stream fields set to extremes, bit flips, splices, child counts, body
  overwrites; CRCs recomputed on most);
* ``xfrm``: section XFRM with each field set to extremes, scale/log-scale pairs that push the
  decoded log-scales past the bound, reflected, permuted and perturbed band matrices;
* ``zstd``: one byte of a zstd frame header or block header changed (frame rules);
* ``case``: the reproducers of one contract in two languages, each with the outcome FORMAT.md
  requires (``expect``), the memory rule's decompression bomb among them.

DIR/manifest.json lists each file: ``file``, ``class``, ``level`` (null: the full decode),
``expect`` ("ok", "refuse" or null where the reference decoder decides) and ``python``: the
outcome of ``decompress`` ("ok" with the SHA-256 of the decoded float32 arrays in the order
means, quats, log_scales, opacity_logits, sh_dc, sh_rest, or "FormatError" with its message, or
any other exception type: a failure of the contract).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import struct
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "tests" / "splat", ROOT / "tests" / "web"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import hostile as h  # noqa: E402
from make_fixtures import lossy_grid_scene  # noqa: E402
from pgms_helpers import random_scene  # noqa: E402

from visionmoe.splat import compress, decompress  # noqa: E402
from visionmoe.splat.pgms import bitstream as bs  # noqa: E402
from visionmoe.splat.pgms import coders  # noqa: E402
from visionmoe.splat.pgms.bitstream import FormatError  # noqa: E402

ARRAYS = ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")
MUTANTS = 2660  # the size of the mutant class the two decoders first disagreed on
SEED = 52


def sources() -> dict[str, bytes]:
    """Small valid format-5 files (given contributions: no renders), about a second each."""
    def encode(scene, **kw) -> bytes:
        w = torch.rand(scene.num_gaussians, generator=torch.Generator().manual_seed(1)) + 0.1
        return compress(scene, contributions=w, refine_steps=0, verify_views=0, prune_search=0, **kw).data

    return {
        "sh0": encode(random_scene(300, 0, seed=5), ratio=6),
        "sh1_codebook": encode(random_scene(300, 1, seed=6), ratio=6, preset=(3, 3)),
        "sh2_pinned": encode(random_scene(300, 2, seed=7), ratio=4, preset=(5, 5)),
        "palettes": encode(lossy_grid_scene(600, seed=8), ratio=4),
        "sh1_world_frame": encode(random_scene(200, 1, seed=9), ratio=6, frame="world"),
        # format 5.1: a third of the rows repeated bit for bit (the fine tier's copies stream)
        "sh1_copies": encode(random_scene(300, 1, seed=10).subset(torch.arange(400) % 300), ratio=3),
    }


def digest(arrays) -> str:
    """SHA-256 of the decoded float32 arrays, little-endian, in ARRAYS order."""
    sha = hashlib.sha256()
    for a in arrays:
        sha.update(np.ascontiguousarray(a, "<f4").tobytes())
    return sha.hexdigest()


def python_outcome(data: bytes, level: int | None) -> dict:
    try:
        scene = decompress(data, level=level)
    except FormatError as exc:
        return {"outcome": "FormatError", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - recorded: anything but FormatError breaks the contract
        return {"outcome": type(exc).__name__, "message": str(exc)}
    return {"outcome": "ok", "count": scene.num_gaussians,
            "digest": digest(getattr(scene, k).numpy() for k in ARRAYS)}


# --------------------------------------------------------------------------- classes


def prefixes(src: dict[str, bytes]):
    for name, data in src.items():
        bounds = h.section_bounds(data)
        level_ends = [end for (start, end), sec in zip(bounds, h.parse(data)[1]) if sec.tag == "LEVL"]
        # every section and stream boundary and the bytes either side (two before a section's end)
        cuts = sorted({max(0, min(len(data), e + d)) for _s, e in bounds for d in (-2, -1, 0, 1)}
                      | {max(0, min(len(data), b + d)) for b in h._boundaries(data) for d in (-1, 0, 1)})
        for cut in cuts:
            held = sum(end <= cut for end in level_ends)
            for level in range(max(held, 1)):  # the levels the prefix holds (level 0 also when it holds none)
                yield f"{name} prefix {cut} level {level}", data[:cut], level


def _xfrm_parts(data: bytes):
    version, secs = h.parse(data)
    i = next((k for k, s in enumerate(secs) if s.tag == "XFRM"), None)
    return version, secs, i


def _with_xfrm(version, secs, i, payload: bytes) -> bytes:
    secs = [replace(s) for s in secs]
    secs[i] = replace(secs[i], payload=payload)
    return h.pack(secs, version)


_XFRM_VALUES = [0.0, -0.0, 1e-300, 1e-30, 1e-9, 0.5, 1.0, 1.0 + 1e-9, 2.0, 1e30, 1.0000001e30, 1e300,
                float("inf"), float("-inf"), float("nan"), -1.0, -1e30]


def xfrm_mutants(src: dict[str, bytes], count: int, rng: random.Random):
    """Section XFRM edited field by field (the rest of the file untouched, CRCs recomputed)."""
    with_xfrm = [(name, *_xfrm_parts(d)) for name, d in src.items() if _xfrm_parts(d)[2] is not None]
    for k in range(count):
        name, version, secs, i = with_xfrm[k % len(with_xfrm)]
        p = bytearray(secs[i].payload)
        v = list(struct.unpack_from("<9d", p, 0))
        how = rng.choice(["field", "field", "scale", "scale", "reflect", "permute", "perturb", "band_extreme"])
        if how == "field":
            j = rng.randrange(9)
            v[j] = rng.choice(_XFRM_VALUES)
        elif how == "scale":  # a consistent scale/log-scale pair: the log-scale bound after XFRM decides
            s = rng.choice([1e-30, 1e-20, 1e-5, 0.5, 2.0, 1e5, 1e20, 1e25, 1e30, math.exp(60), math.exp(75)])
            v[7], v[8] = s, math.log(s)
        n_bands = (len(p) - 72) // 4
        if how in ("reflect", "permute", "perturb", "band_extreme") and n_bands:
            sizes = [(2 * l + 1) for l in range(1, 4) if sum((2 * m + 1) ** 2 for m in range(1, l + 1)) * 4 <= len(p) - 72]
            l = rng.randrange(len(sizes))
            off = 72 + 4 * sum(s * s for s in sizes[:l])
            n = sizes[l]
            D = np.frombuffer(bytes(p[off: off + 4 * n * n]), "<f4").reshape(n, n).copy()
            if how == "reflect":  # one row negated: still orthogonal, determinant -1
                D[rng.randrange(n)] *= -1
            elif how == "permute":  # two rows swapped: orthogonal, determinant -1
                a, b = rng.sample(range(n), 2) if n > 1 else (0, 0)
                D[[a, b]] = D[[b, a]]
            elif how == "perturb":
                D[rng.randrange(n), rng.randrange(n)] += rng.choice([1e-7, 1e-6, 4e-6, 1e-5, 1e-4, 1e-2])
            else:
                D[rng.randrange(n), rng.randrange(n)] = rng.choice([np.inf, np.nan, 3.4e38, 0.0])
            p[off: off + 4 * n * n] = D.astype("<f4").tobytes()
        struct.pack_into("<9d", p, 0, *v)
        yield f"{name} xfrm {how}", _with_xfrm(version, secs, i, bytes(p))


def zstd_mutants(src: dict[str, bytes], count: int, rng: random.Random):
    """One byte of a zstd frame's header or first block header set to another value (frame
    descriptor, window, content size, block type and size), CRCs recomputed: the frame rules both
    decoders must apply alike."""
    found = []
    for name, data in src.items():
        version, secs = h.parse(data)
        for i, sec in enumerate(secs):
            streams = h.parse_streams(sec.payload) if sec.tag not in ("HEAD", "XFRM", "SHQP", "END0") else None
            found += [(name, version, secs, i, j) for j, st in enumerate(streams or []) if st.coder == h.ZSTD]
    for k in range(count):
        name, version, secs, i, j = found[rng.randrange(len(found))]
        streams = h.parse_streams(secs[i].payload)
        body = bytearray(streams[j].body)
        at = rng.randrange(4, min(len(body), 12))
        body[at] = rng.choice([rng.randrange(256), body[at] ^ (1 << rng.randrange(8))])
        streams[j] = replace(streams[j], body=bytes(body))
        s2 = [replace(s) for s in secs]
        s2[i] = replace(s2[i], payload=h.pack_streams(streams))
        yield f"{name} {secs[i].tag}{secs[i].level} stream {j} zstd byte {at} = {body[at]}", h.pack(s2, version)


def _recode_stream(data: bytes, coder: int) -> bytes:
    """The first integer stream of the first level, re-coded with ``coder`` (lzma or constriction
    rANS): a stream that is valid in format 1-3, inside a format-5 file."""
    version, secs = h.parse(data)
    i = next(k for k, s in enumerate(secs) if s.tag == "LEVL")
    streams = h.parse_streams(secs[i].payload)
    st = streams[0]
    u = coders.zigzag(bs.StreamReader(st.pack(), "x").ints("s"))
    body = (coders.lzma_compress(coders.planes(u, st.width)) if coder == coders.CODER_LZMA
            else coders.rans_encode(u, st.alphabet))
    streams[0] = h.Stream(st.kind, coder, st.width, st.n, st.alphabet, body)
    secs[i] = replace(secs[i], payload=h.pack_streams(streams))
    return h.pack(secs, version)


def cases(src: dict[str, bytes]):
    """The reproducers, each with the outcome FORMAT.md requires -> (name, bytes, expect)."""
    base = src["sh1_codebook"]
    version, secs = h.parse(base)

    def edited(fn) -> bytes:
        s2 = [replace(s) for s in secs]
        fn(s2)
        return h.pack(s2, version)

    def head_total(s2):  # HEAD declares one node more than the levels hold
        hp = bytearray(s2[0].payload)
        struct.pack_into("<I", hp, 8, struct.unpack_from("<I", hp, 8)[0] + 1)
        s2[0] = replace(s2[0], payload=bytes(hp))

    def level_byte(tag):
        def fn(s2):
            k = next(k for k, s in enumerate(s2) if s.tag == tag)
            s2[k] = replace(s2[k], level=0)
        return fn

    def wide_stream(s2):  # the first level's first stream stored 8 bytes wide, its alphabet needing 1
        k = next(k for k, s in enumerate(s2) if s.tag == "LEVL")
        streams = h.parse_streams(s2[k].payload)
        raw = next(j for j, st in enumerate(streams) if st.kind == h.KIND_INT and st.alphabet <= 256 and st.n)
        st = streams[raw]
        u = bs.zigzag(bs.StreamReader(st.pack(), "x").ints("s"))
        streams[raw] = h.Stream(h.KIND_INT, h.RAW, 8, st.n, int(u.max()) + 1, bs.planes(u, 8))
        s2[k] = replace(s2[k], payload=h.pack_streams(streams))

    def reflected_band(s2):
        k = next(k for k, s in enumerate(s2) if s.tag == "XFRM")
        p = bytearray(s2[k].payload)
        D = np.frombuffer(bytes(p[72:108]), "<f4").reshape(3, 3).copy()
        D[0] *= -1
        p[72:108] = D.astype("<f4").tobytes()
        s2[k] = replace(s2[k], payload=bytes(p))

    def huge_scale(s2):  # scale 1e30: coded log-scales near -4 become about 65, inside the bound
        k = next(k for k, s in enumerate(s2) if s.tag == "XFRM")
        p = bytearray(s2[k].payload)
        struct.pack_into("<2d", p, 56, 1e30, math.log(1e30))
        s2[k] = replace(s2[k], payload=bytes(p))

    yield "valid", base, "ok"
    yield "HEAD total larger than the levels hold", edited(head_total), "refuse"
    yield "HEAD with level byte 0", edited(level_byte("HEAD")), "refuse"
    yield "XFRM with level byte 0", edited(level_byte("XFRM")), "refuse"
    yield "CBSR with level byte 0", edited(level_byte("CBSR")), "refuse"
    yield "END0 with level byte 0", edited(level_byte("END0")), "refuse"
    yield "stream width 8 where the alphabet needs 1", edited(wide_stream), "refuse"
    yield "LZMA stream (coder 2) in a 5.0 file", _recode_stream(base, coders.CODER_LZMA), "refuse"
    yield "constriction rANS stream (coder 3) in a 5.0 file", _recode_stream(base, coders.CODER_RANS), "refuse"
    yield "band matrix with determinant -1", edited(reflected_band), "refuse"
    yield "XFRM scale 1e30 (a valid transform, log-scales inside the bound)", edited(huge_scale), "ok"


def copies_cases(src: dict[str, bytes]):
    """The copies stream (format 5.1): the HEAD flag in a 5.0 file (refused), a node with the
    most copies, 15 (decodes), and one with 16 (refused) -> (name, bytes, expect)."""
    version, secs = h.parse(src["sh1_copies"])
    assert version == (5, 1)
    yield "copies flag in a 5.0 file", h.pack(secs, (5, 0)), "refuse"
    k = max(k for k, s in enumerate(secs) if s.tag == "LEVL")
    streams = h.parse_streams(secs[k].payload)
    counts = bs.StreamReader(streams[-1].pack(), "x").ints("copies")
    for top, expect in ((15, "ok"), (16, "refuse")):
        c = counts.copy()
        c[0] = top
        s2 = list(secs)
        s2[k] = replace(secs[k], payload=h.pack_streams(streams[:-1] + [h.int_stream(c)]))
        yield f"a fine-tier node with {top} further copies", h.pack(s2, version), expect


def palette_cases():
    """A one-level file written from FORMAT.md whose DC value table (PALT) reaches 1e37 (the
    bound: decodes) or 3e38 (finite, but three such channels overflow a colour in float32:
    refused) -> (name, bytes, expect)."""
    n = 4
    for top, expect in ((1e37, "ok"), (3e38, "refuse")):
        modes = h.int_stream(np.array([1, 0, 0, 0, 0, 0, 0]))
        table = h.parse_streams(bs.encode_floats(np.array([-0.5, 0.0, top]), half=False))[0]
        secs = [h.Sec("HEAD", h.GLOBAL, h.head(num_levels=1, level0=n, total=n, source=n)),
                h.Sec("CBSR", h.GLOBAL, h.f16_stream(h.SHAPE_ROW).pack()),
                h.Sec("PALT", h.GLOBAL, h.pack_streams([modes, table])),
                h.Sec("LEVL", 0, h.fine_level(n)), h.Sec("END0", h.GLOBAL, b"")]
        yield f"PALT dc0 table reaching {top:g}", h.pack(secs, (5, 0)), expect


def scale_overflow_case() -> tuple[str, bytes, str]:
    """The issue's reproducer: log-scales near the coded bound plus XFRM's ln(1e30) would decode
    above 88.7 (exp overflows float32); FORMAT.md bounds them by 80 after XFRM."""
    g = torch.Generator().manual_seed(11)
    scene = random_scene(200, 0, seed=11)
    scene.log_scales = torch.full_like(scene.log_scales, 25.0) + 0.1 * torch.randn(scene.log_scales.shape, generator=g)
    w = torch.rand(200, generator=g) + 0.1
    data = compress(scene, contributions=w, refine_steps=0, verify_views=0, prune_search=0, ratio=4).data
    version, secs, i = _xfrm_parts(data)
    p = bytearray(secs[i].payload)
    struct.pack_into("<2d", p, 56, 1e30, math.log(1e30))
    return "log-scales above 80 after XFRM (exp would overflow float32)", _with_xfrm(version, secs, i, bytes(p)), "refuse"


def memory_cases():
    """The memory rule (FORMAT.md, "Decoding"): a valid file of constant streams whose checked
    node counts need more than max(64 MiB, 256 x its size) is refused by both decoders before
    anything is decoded; a smaller one of the same kind decodes -> (name, bytes, expect)."""
    for n0, child, expect in ((20_000, 16, "refuse"), (2_000, 4, "ok")):
        data = h.constant_stream_bomb(n0=n0, child=child)
        data = data[:8] + struct.pack("<HH", 5, 0) + data[12:]  # format 5.0 (the preamble has no CRC)
        yield f"constant streams: {n0 * (1 + child)} nodes in {len(data)} bytes", data, expect


# --------------------------------------------------------------------------- the corpus


def build(out: Path, mutants: int = MUTANTS, seed: int = SEED, xfrm: int = 1200, zstd: int = 300) -> dict:
    """Write the corpus and its manifest into ``out`` -> the manifest (also DIR/manifest.json)."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    src = sources()
    entries = []

    def add(cls: str, what: str, data: bytes, level: int | None = None, expect: str | None = None) -> None:
        name = f"{len(entries):05d}.pgms"
        (out / name).write_bytes(data)
        entries.append({"file": name, "class": cls, "what": what, "level": level, "expect": expect,
                        "python": python_outcome(data, level)})

    for name, data in src.items():
        add("source", name, data, expect="ok")
    for what, data, level in prefixes(src):
        add("prefix", what, data, level)
    # the random classes draw from the format-5.0 sources they were first drawn from. Drawn with
    # sh1_copies among them, mutant "body bytes 345:346 of section 5" (file 02815) is a zstd
    # frame that libzstd refuses ("Data corruption detected") and fzstd decodes: a disagreement
    # of the two zstd decoders not yet understood (the copies stream plays no part in it)
    full, src = src, {k: v for k, v in src.items() if k != "sh1_copies"}
    for what, data in h.mutants(list(src.values()), mutants, seed):
        add("mutant", what, data)
    for what, data in xfrm_mutants(src, xfrm, random.Random(seed + 1)):
        add("xfrm", what, data)
    for what, data in zstd_mutants(src, zstd, random.Random(seed + 2)):
        add("zstd", what, data)
    for what, data, expect in [*cases(src), *copies_cases(full), *palette_cases(), scale_overflow_case(), *memory_cases()]:
        add("case", what, data, expect=expect)
    manifest = {"seed": seed, "seconds": round(time.perf_counter() - t0, 2), "files": entries}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=0))
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--mutants", type=int, default=MUTANTS)
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    m = build(args.out, args.mutants, args.seed)
    by = {}
    for e in m["files"]:
        key = (e["class"], e["python"]["outcome"])
        by[key] = by.get(key, 0) + 1
    for (cls, outcome), n in sorted(by.items()):
        print(f"{cls:8s} {outcome:12s} {n}")
    print(f"{len(m['files'])} files in {m['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
