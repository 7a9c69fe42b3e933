"""Hostile .pgms input (issue 31): memory bombs under RLIMIT_AS, the seeded mutation fuzzer,
strict parsing. Files are built here from docs/FORMAT.md (``hostile.py``), never stored.

Memory rule (docs/ROBUSTNESS.md): a decode in a child process, after a warm-up decode, may add
at most ``max(64 MiB, 256 x file size)`` (``decode.decode_budget``) to its address space; outcomes are a scene or
``FormatError``, nothing else, within a wall-clock limit.

Nightly-size fuzzing: ``VISIONMOE_FUZZ_MUTANTS=5000 pytest tests/splat/pgms/test_hostile_decode.py -k fuzz``.
"""

from __future__ import annotations

import json
import lzma
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pgms_helpers import random_scene

import hostile as h
from visionmoe.splat import FormatError, compress, decompress

DATA = Path(__file__).resolve().parents[1] / "data"
FUZZ_MUTANTS = int(os.environ.get("VISIONMOE_FUZZ_MUTANTS", "400"))
FUZZ_SEED = int(os.environ.get("VISIONMOE_FUZZ_SEED", "31"))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Valid sources: a two-level file written from the spec, format 2 test data, and fresh
    encodes (SH appearance codebook; SH degree 0)."""
    d = tmp_path_factory.mktemp("hostile")
    out = {"two_level": h.valid_two_level(), "format2": (DATA / "format2.pgms").read_bytes()}
    for name, deg, n in (("sh1", 1, 400), ("sh0", 0, 300)):
        contrib = torch.rand(n, generator=torch.Generator().manual_seed(1)) * 5
        out[name] = compress(random_scene(n, deg, seed=5), ratio=6, contributions=contrib, preset=(3, 3)).data
    paths = {}
    for name, data in out.items():
        paths[name] = d / f"{name}.pgms"
        paths[name].write_bytes(data)
    return paths


def test_builders_write_valid_files(files):
    """The spec-only writer in hostile.py agrees with the decoder on a valid file."""
    s = decompress(files["two_level"])
    assert s.num_gaussians == 8 and s.sh_degree == 0
    assert torch.allclose(s.log_scales, torch.full((8, 3), -3.0), atol=0.01)


def test_valid_decode_within_budget(files):
    r = h.decode_limited(files["sh1"], files["two_level"])
    assert r["outcome"] == "ok", r


def test_large_valid_decode_is_a_small_multiple_of_the_scene(files, tmp_path):
    """200k leaves (a 2.6 MB file of raw streams): the decode fits the file's budget; the
    decoded scene itself is 200k x 56 bytes = 11 MB."""
    p = tmp_path / "big.pgms"
    p.write_bytes(h.valid_two_level(n0=20_000, child=10))
    r = h.decode_limited(p, files["two_level"])
    assert r["outcome"] == "ok" and r["message"] == "200000", r
    # the decoder's own estimate, which it checks against the budget, bounds what it really uses
    from visionmoe.splat.pgms.decode import memory_needed

    need = memory_needed(p.read_bytes())
    r = h.decode_limited(p, files["two_level"], budget=need - 24 * h.MiB)  # less its fixed allowance
    assert r["outcome"] == "ok", (r, need)


def test_child_count_bomb(files, tmp_path):
    p = tmp_path / "children.pgms"
    p.write_bytes(h.child_count_bomb())
    r = h.decode_limited(p, files["two_level"], timeout=60)
    assert r["outcome"] == "FormatError", r


def test_lying_header_bomb(files, tmp_path):
    p = tmp_path / "head.pgms"
    p.write_bytes(h.lying_header_bomb())
    r = h.decode_limited(p, files["two_level"], timeout=60)
    assert r["outcome"] == "FormatError", r


def test_fuzz_mutants_under_memory_and_time_limits(files):
    """A seeded few hundred mutants (VISIONMOE_FUZZ_MUTANTS for more): truncations at every
    section/stream boundary, HEAD/stream/section fields at extremes (CRCs recomputed), bit
    flips, splices between files, child counts replaced, stream bodies overwritten. Each
    decodes to a finite scene or raises FormatError within 10 s, under the memory budget."""
    sources = [files[k] for k in ("two_level", "format2", "sh1", "sh0")]
    r = h.fuzz_limited(sources, FUZZ_MUTANTS, FUZZ_SEED, timeout=max(120, FUZZ_MUTANTS * 0.5))
    print(json.dumps({k: r[k] for k in ("outcomes", "seconds", "slowest_s", "slowest", "peak")}))
    assert not r["escaped"], r["escaped"]
    assert sum(r["outcomes"].values()) == FUZZ_MUTANTS
    assert r["outcomes"]["FormatError"] > FUZZ_MUTANTS // 2  # the mutants do reach the checks


def test_mutants_are_deterministic(files):
    src = [files["sh1"].read_bytes(), files["two_level"].read_bytes()]
    a = [m for _w, m in h.mutants(src, 50, 7)]
    b = [m for _w, m in h.mutants(src, 50, 7)]
    assert a == b and len({bytes(x) for x in a}) > 40


# --------------------------------------------------------------------------- strict parsing


def _two_level_sections():
    version, secs = h.parse(h.valid_two_level())
    return version, secs


@pytest.mark.parametrize("tag", ["HEAD", "CBSR", "END0"])
def test_global_section_level_must_be_255(tag):
    version, secs = _two_level_sections()
    next(s for s in secs if s.tag == tag).level = 0
    with pytest.raises(FormatError, match="level"):
        decompress(h.pack(secs, version))


def _with_stream(secs, index: int, stream: h.Stream):
    lv = next(s for s in secs if s.tag == "LEVL" and s.level == 1)
    streams = h.parse_streams(lv.payload)
    streams[index] = stream
    lv.payload = h.pack_streams(streams)


def test_zstd_and_lzma_streams_decode():
    """Control for the trailing-bytes cases: the same streams without trailing bytes decode."""
    version, secs = _two_level_sections()
    _with_stream(secs, 0, _zstd_zeros(8))
    _with_stream(secs, 1, _lzma_zeros(8))
    assert decompress(h.pack(secs, version)).num_gaussians == 8


def _zstd_zeros(n: int, tail: bytes = b"") -> h.Stream:
    s = h.int_stream(np.zeros(n, np.int64), h.ZSTD)
    s.body += tail
    return s


def _lzma_zeros(n: int, tail: bytes = b"") -> h.Stream:
    s = h.int_stream(np.zeros(n, np.int64))
    filters = [{"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": 1 << 20}]
    s.coder, s.body = 2, lzma.compress(s.body, format=lzma.FORMAT_RAW, filters=filters) + tail
    return s


@pytest.mark.parametrize("coder", ["zstd", "lzma"])
@pytest.mark.parametrize("tail", [b"\x00", b"junk" * 4])
def test_bytes_after_a_compressed_stream(coder, tail):
    version, secs = _two_level_sections()
    _with_stream(secs, 0, _zstd_zeros(8, tail) if coder == "zstd" else _lzma_zeros(8, tail))
    with pytest.raises(FormatError):
        decompress(h.pack(secs, version))


def test_head_total_larger_than_real():
    version, secs = _two_level_sections()
    secs[0].payload = h.head(num_levels=2, level0=4, total=13, source=8)  # real: 4 + 8 = 12
    with pytest.raises(FormatError, match="total|nodes"):
        decompress(h.pack(secs, version))


def test_head_total_smaller_than_real():
    version, secs = _two_level_sections()
    secs[0].payload = h.head(num_levels=2, level0=4, total=11, source=8)
    with pytest.raises(FormatError):
        decompress(h.pack(secs, version))


def _splat_cli(*args, timeout=120):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "visionmoe.splat", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=h.REPO)


def test_info_prints_the_files_version(files, tmp_path):
    p = tmp_path / "v2.pgms"
    data = bytearray(files["two_level"].read_bytes())
    struct.pack_into("<HH", data, 8, 2, 0)  # the two-level file is valid 2.0 too (1 level x 0 SH)
    p.write_bytes(bytes(data))
    assert decompress(p).num_gaussians == 8
    r = _splat_cli("info", "--json", p)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["version"] in ("2.0", [2, 0], "2")


def test_constant_stream_bomb_is_refused_before_any_allocation(files, tmp_path):
    """A valid 80 KB file of constant zstd streams declaring 5.2M nodes (64 per byte, what
    HEAD's node rule lets through) needs over 1 GB to decode: refused from the checked counts,
    under the file's budget, without allocating."""
    p = tmp_path / "constant.pgms"
    p.write_bytes(h.constant_stream_bomb())
    r = h.decode_limited(p, files["two_level"], timeout=60)
    assert r["outcome"] == "FormatError" and "max_memory" in r["message"], r
    assert r["peak"] < 16 * h.MiB, r


def test_max_memory_lets_a_trusted_file_decode(tmp_path):
    """The refusal is a budget, not a format rule: the same kind of file decodes when the
    caller raises ``max_memory``, and a budget below the need refuses a small valid file."""
    from visionmoe.splat import DecodeMemoryError

    data = h.constant_stream_bomb(n0=20_000, child=16)  # 340k nodes in ~5 KB: above the 64 MiB floor
    with pytest.raises(DecodeMemoryError, match="max_memory"):
        decompress(data)
    scene = decompress(data, max_memory=1 << 30)
    assert scene.num_gaussians == 320_000
    with pytest.raises(DecodeMemoryError):
        decompress(h.valid_two_level(), max_memory=1 << 20)
    with pytest.raises(ValueError, match="max_memory"):
        decompress(h.valid_two_level(), max_memory=0)


def test_cli_max_memory(tmp_path):
    p = tmp_path / "bomb.pgms"
    p.write_bytes(h.constant_stream_bomb(n0=20_000, child=16))
    cmd = [sys.executable, "-m", "visionmoe.splat.cli", "decompress", str(p), "-o", str(tmp_path / "x.ply")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--max-memory" in r.stderr, r.stderr
    assert not (tmp_path / "x.ply").exists()
    r = subprocess.run(cmd + ["--max-memory", "1G"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and (tmp_path / "x.ply").is_file(), r.stderr


def test_the_densest_real_encodes_fit_the_default_budget():
    """playbot (SH2) at 50x: 239,646 nodes in 1,619,323 bytes, refused by a factor of 64; SH3
    files up to 0.4 nodes per byte fit too, and the 80 KB zip bomb's 5.2M nodes do not."""
    from visionmoe.splat.pgms.decode import decode_budget, decode_bytes_needed

    assert decode_bytes_needed(239_646, 2) <= decode_budget(1_619_323)
    size = 10_000_000
    assert decode_bytes_needed(int(0.4 * size), 3) <= decode_budget(size)
    assert decode_bytes_needed(5_200_000, 0) > decode_budget(80_000)
