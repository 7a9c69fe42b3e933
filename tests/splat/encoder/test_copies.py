"""Exact duplicate Gaussians coded once with a copy count (``encoder.copies``, format 5.1)."""

import struct
import zlib

import numpy as np
import pytest
import torch

from visionmoe.splat import compress, decompress
from visionmoe.splat.encoder.copies import find_copies
from visionmoe.splat.io import GaussianScene
from visionmoe.splat.pgms import bitstream as bs
from visionmoe.splat.pgms.decode import DecodeMemoryError, decode_bytes_needed, memory_needed

from pgms_helpers import random_scene

# given contributions, no renders: the rung and the cut depend on the scene alone
GIVEN = dict(refine_steps=0, verify_views=0, prune_search=0)


def with_copies(base: GaussianScene, extra: torch.Tensor, seed: int = 1) -> GaussianScene:
    """``base`` plus the rows ``extra`` again, shuffled."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([torch.arange(base.num_gaussians), extra])
    return base.subset(rows[torch.randperm(len(rows), generator=g)])


def row_bytes(scene: GaussianScene) -> list[bytes]:
    parts = [scene.means, scene.quats, scene.log_scales, scene.opacity_logits[:, None], scene.sh_dc,
             scene.sh_rest.reshape(scene.num_gaussians, -1)]
    a = np.ascontiguousarray(torch.cat(parts, 1).float().numpy())
    return [r.tobytes() for r in a]


def multiplicities(scene: GaussianScene) -> list[int]:
    """How often each distinct row occurs, sorted."""
    _, counts = np.unique(np.array(row_bytes(scene), dtype=object), return_counts=True)
    return sorted(counts.tolist())


def test_find_copies_groups_identical_rows_only():
    base = random_scene(200, 1, seed=3)
    scene = with_copies(base, torch.tensor([5, 5, 9, 17]))
    c = find_copies(scene)
    assert c is not None and len(c.rows) == 200 and int(c.count.sum()) == 204
    assert sorted(c.count.tolist())[-3:] == [2, 2, 3]
    same = row_bytes(scene)
    for e in range(len(c.rows)):  # every row of an entry equals the entry's coded row
        members = (c.entry == e).nonzero().squeeze(1).tolist()
        assert len(members) == int(c.count[e]) and {same[m] for m in members} == {same[int(c.rows[e])]}
    assert find_copies(base) is None
    # a sign of zero or one ulp apart is another row
    twin = base.subset(torch.tensor([0, 0, 1, 1]))
    twin.sh_dc[1, 0] = torch.nextafter(twin.sh_dc[1, 0], torch.tensor(1.0))
    twin.means[3, 2] = -twin.means[3, 2] if float(twin.means[3, 2]) == 0 else twin.means[3, 2] * -1
    assert find_copies(twin) is None


def test_groups_above_the_limit_are_split():
    base = random_scene(10, 0, seed=4)
    scene = with_copies(base, torch.full((bs.MAX_COPIES + 3,), 2))  # row 2: MAX_COPIES + 4 times
    c = find_copies(scene)
    assert sorted(c.count.tolist())[-2:] == [4, bs.MAX_COPIES] and int(c.count.sum()) == scene.num_gaussians


@pytest.fixture(scope="module")
def copied():
    base = random_scene(2000, 1, seed=5)
    extra = torch.randperm(2000, generator=torch.Generator().manual_seed(6))[:600]
    scene = with_copies(base, extra)
    w = torch.rand(scene.num_gaussians, generator=torch.Generator().manual_seed(7)) + 0.1
    return scene, w


def test_a_scene_with_copies_decodes_every_copy(copied):
    scene, w = copied
    data = compress(scene, ratio=3, contributions=w, **GIVEN).data
    assert bs.read_preamble(data) == bs.VERSION_COPIES == (5, 1)
    dec = decompress(data)
    assert dec.num_gaussians == scene.num_gaussians  # every leaf kept at 3x
    assert multiplicities(dec) == multiplicities(scene)
    # coarser levels are the merged nodes, without repeats
    assert decompress(data, level=0).num_gaussians < 2000
    # the decoder's memory estimate counts the repeated rows
    header, books, _ = bs.read_container(data)
    grid = bs.read_tables(header, books)[0].sh_codebook
    grid = grid.coefficients if isinstance(grid, bs.ShGrid) else 0
    assert memory_needed(data) == decode_bytes_needed(header.total_nodes + scene.num_gaussians - 2000, 1, grid)


def test_copies_cost_far_less_than_coding_each_one(copied):
    """The same rung for the scene and for the scene whose copies differ by one ulp: the copies
    file is about the size of the unique rows' file, the other pays for every row."""
    scene, w = copied
    distinct = GaussianScene(**{k: getattr(scene, k).clone() for k in
                                ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")})
    first = {}
    for i, r in enumerate(row_bytes(scene)):
        if r in first:
            distinct.opacity_logits[i] = torch.nextafter(distinct.opacity_logits[i], torch.tensor(9.0))
        first.setdefault(r, i)
    assert find_copies(distinct) is None
    unique = scene.subset(torch.tensor(sorted(first.values())))
    sizes = {name: len(compress(s, ratio=1.0001, preset=(6, 6), contributions=torch.ones(s.num_gaussians), **GIVEN).data)
             for name, s in (("copies", scene), ("distinct", distinct), ("unique", unique))}
    assert sizes["copies"] < 1.05 * sizes["unique"]
    assert sizes["distinct"] > 1.1 * sizes["copies"]


def test_copies_survive_the_render_checks_and_the_refinement(copied):
    scene, _ = copied
    res = compress(scene, ratio=4, num_views=4, view_size=48, refine_steps=3, verify_views=2, prune_search=1)
    dec = decompress(res.data)
    assert bs.read_preamble(res.data) == (5, 1) and max(multiplicities(dec)) == 2
    assert 0 <= res.pruned < scene.num_gaussians


def _fine_tier_copies(data: bytes) -> tuple[int, int]:
    """(offset of the fine tier's last stream, its length): the copies stream."""
    secs = [s for s in bs.iter_sections(data) if s.tag == "LEVL"]
    fine = secs[-1]
    pos, start = 0, fine.offset + 16
    last = None
    while pos < len(fine.payload):
        size = bs.STREAM_HEAD.unpack_from(fine.payload, pos)[6]
        last = (start + pos, bs.STREAM_HEAD.size + size)
        pos += bs.STREAM_HEAD.size + size
    return last


def _recrc(data: bytearray, offset: int, length: int) -> None:
    """Rewrite the checksum of the section at ``offset`` with a payload of ``length`` bytes."""
    body = bytes(data[offset + 16: offset + 16 + length])
    struct.pack_into("<I", data, offset + 12, zlib.crc32(body, zlib.crc32(bytes(data[offset: offset + 12]))))


def test_bad_copy_counts_and_flags_are_refused(copied):
    scene, w = copied
    data = compress(scene, ratio=3, contributions=w, **GIVEN).data
    # a 5.0 file cannot set the copies flag
    old = bytearray(data)
    struct.pack_into("<HH", old, 8, 5, 0)
    with pytest.raises(bs.FormatError, match="reserved"):
        decompress(bytes(old))
    # a copy count past the limit: the copies stream rewritten raw with one value of MAX_COPIES
    fine = [s for s in bs.iter_sections(data) if s.tag == "LEVL"][-1]
    at, length = _fine_tier_copies(data)
    values = np.zeros(bs.STREAM_HEAD.unpack_from(data, at)[4], np.int64)
    values[0] = bs.MAX_COPIES
    stream = bs.encode_ints(values, coders=(0,))
    bad = bytearray(data[:at] + stream + data[at + length:])
    new_length = len(fine.payload) - length + len(stream)
    struct.pack_into("<I", bad, fine.offset + 8, new_length)
    _recrc(bad, fine.offset, new_length)
    with pytest.raises(bs.FormatError, match="copies"):
        decompress(bytes(bad))
    # the repeated rows count against the memory limit
    with pytest.raises(DecodeMemoryError):
        decompress(data, max_memory=memory_needed(data) - 1)
