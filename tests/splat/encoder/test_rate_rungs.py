"""The near-lossless top of the rate ladder: per-primitive SH (section SHQP) and the 5x target."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from pgms_helpers import ASSET, random_scene

from visionmoe.splat import compress, decompress
from visionmoe.splat.encoder.allocator import APPEARANCE_LADDER, GEOMETRY_LADDER, make_preset
from visionmoe.splat.io import read_ply
from visionmoe.splat.pgms import bitstream as bs

TOP_G, TOP_A = len(GEOMETRY_LADDER) - 1, len(APPEARANCE_LADDER) - 1


def test_geometry_ladder_is_monotone_and_dense():
    """Every rung is finer than the one before it in every step, and no neighbour coarsens the
    position step by more than 1.5x: where every leaf fits, the byte gap between two rungs is
    rate the encoder cannot spend."""
    for coarse, fine in zip(GEOMETRY_LADDER, GEOMETRY_LADDER[1:]):
        pos_c, dc_c, ls_c, op_c, rot_c, _ = coarse
        pos_f, dc_f, ls_f, op_f, rot_f, _ = fine
        assert pos_f < pos_c and dc_f <= dc_c and ls_f < ls_c and op_f >= op_c and rot_f >= rot_c, (coarse, fine)
        assert pos_c / pos_f <= 1.5 + 1e-9, (coarse, fine)


def test_per_primitive_sh_rungs_exist():
    p = make_preset(TOP_G, TOP_A)
    assert p.sh_step > 0 and p.sh_degree == 3
    assert make_preset(0, 0).sh_step == 0


def test_per_primitive_sh_round_trip():
    s = random_scene(500, 2, seed=4)
    w = torch.full((500,), 5.0)
    # coded as given: in the canonical frame each band is turned after decoding, which mixes
    # the per-coefficient rounding errors (the bound below is per coded coefficient)
    res = compress(s, ratio=1.5, contributions=w, preset=(TOP_G, TOP_A), frame="world")
    tags = [sec.tag for sec in bs.iter_sections(res.data)]
    assert "SHQP" in tags and "CBSH" not in tags
    assert res.primitives == 500
    dec = decompress(res.data)
    step = make_preset(TOP_G, TOP_A).sh_step
    # compare as multisets per coefficient (the decoder returns Morton order)
    for j in range(dec.sh_rest.shape[1]):
        a = np.sort(dec.sh_rest[:, j, 0].numpy())
        b = np.sort(s.sh_rest[:, j, 0].numpy())
        assert np.abs(a - b).max() <= step / 2 + 1e-6
    assert compress(s, ratio=1.5, contributions=w, preset=(TOP_G, TOP_A), frame="world").data == res.data


def test_bad_shqp_is_format_error():
    s = random_scene(300, 1, seed=6)
    res = compress(s, ratio=1.5, contributions=torch.full((300,), 5.0), preset=(TOP_G, TOP_A))
    out = bytearray(res.data[:12])
    for sec in bs.iter_sections(res.data):
        payload = sec.payload
        if sec.tag == "SHQP":
            payload = bs.SHQP.pack(3, 0, 0, 1 / 64)  # degree above the scene's SH degree 1
        out += bs.pack_section(sec.tag, payload, sec.level)
    with pytest.raises(bs.FormatError, match="SHQP"):
        decompress(bytes(out))


@pytest.mark.skipif(not ASSET.exists(), reason="assets/fruit_drops_minimal.ply missing")
def test_ratio_5_lands_within_5_percent():
    s = read_ply(ASSET)
    w = torch.rand(s.num_gaussians, generator=torch.Generator().manual_seed(0)) * 4 + 0.1
    res = compress(s, ratio=5, contributions=w, verify_views=0)
    assert res.target_met, (res.nbytes, res.target_bytes)


def test_dc_decorrelation_is_exact():
    r = np.random.default_rng(0).integers(-300, 300, (1000, 3))
    np.testing.assert_array_equal(bs.correlate_dc(bs.decorrelate_dc(r)), r)


def test_coarsest_rungs_keep_every_leaf_when_they_fit():
    """Coarse quantisation degrades gracefully, merging does not: at the coarsest rung a
    budget that holds every leaf keeps every leaf."""
    s = random_scene(800, 0, seed=8)
    w = torch.full((800,), 5.0)
    full = compress(s, ratio=1.2, contributions=w, preset=(0, 0))
    assert full.primitives == 800
    dec = decompress(full.data)
    assert dec.num_gaussians == 800 and torch.isfinite(dec.sh_dc).all()


def test_a_missed_target_says_why():
    """A target below what the coarsest rung can reach is missed, and the result says so."""
    scene = random_scene(300, 0, seed=9)
    res = compress(scene, ratio=400, num_views=4, view_size=48, refine_steps=0, prune_search=0)
    assert not res.target_met and "coarsest" in res.target_note, (res.nbytes, res.target_bytes, res.target_note)
    # every node stays in level 0 and the finest level is empty: the decoder takes it
    assert res.coded_per_level[-1] == 0
    assert decompress(res.data).num_gaussians == res.primitives


def test_fractional_geometry_rungs_lie_between_their_neighbours():
    """A fractional rung g + t interpolates rungs g and g + 1 (steps geometrically, bit depths
    rounded), finer as t grows; the ladder's own rungs are returned as they are."""
    from visionmoe.splat.encoder.allocator import geometry_rung

    for g in range(len(GEOMETRY_LADDER)):
        assert geometry_rung(g) == GEOMETRY_LADDER[g] and make_preset(float(g), 0).pos_rel == GEOMETRY_LADDER[g][0]
    for g in range(len(GEOMETRY_LADDER) - 1):
        rows = [geometry_rung(g + t) for t in (0.0, 0.25, 0.5, 0.75, 1.0)]
        for coarse, fine in zip(rows, rows[1:]):
            assert all(f <= c for c, f in zip(coarse[:3], fine[:3])) and fine[0] < coarse[0], (g, coarse, fine)
            assert all(f >= c for c, f in zip(coarse[3:5], fine[3:5])), (g, coarse, fine)
    for bad in ((-0.5, 0), (TOP_G + 0.5, 0), (3, 0.5)):
        with pytest.raises(ValueError, match="preset rungs"):
            make_preset(*bad)


def test_an_every_leaf_file_short_of_its_target_is_filled_between_rungs():
    """Every leaf at rung g leaves the budget short and g + 1 does not fit: the file moves to a
    fractional rung between them that keeps every leaf and fits the target on real bytes."""
    from visionmoe.splat.encoder.contribution import prune
    from visionmoe.splat.encoder.rung_search import FILL_BELOW, RungSearch, _fill_between_rungs, allocate_and_encode
    from visionmoe.splat.encoder.stages import Progress, StageTimes
    from visionmoe.splat.encoder.tree import build_tree

    scene = random_scene(3000, 0, seed=12)
    kept, w = prune(scene, torch.rand(3000, generator=torch.Generator().manual_seed(0)) + 0.1, 0.0)
    tree = build_tree(kept, w, 0, 3000, 10**6)
    leaves = tree.pyramid.levels[-1].num_gaussians

    def pinned(g, target):
        return allocate_and_encode(tree, target, pin=(g, 0), seed=0, prog=Progress(False), times=StageTimes()).encoding

    full13, full14 = pinned(13, 10**6), pinned(14, 10**6)
    assert sum(full13.terminal) == sum(full14.terminal) == leaves
    target = int(full13.nbytes + 0.8 * (full14.nbytes - full13.nbytes))
    base = pinned(13, target)  # pinned: kept as it is, every leaf, short of the target
    assert base.nbytes == full13.nbytes < FILL_BELOW * target
    filled = _fill_between_rungs(RungSearch(tree, target, 0, Progress(False)), base)
    g = filled.rung.index[0]
    assert 13 < g < 14 and sum(filled.terminal) == leaves, filled.rung.index
    assert full13.nbytes < filled.nbytes <= target and filled.nbytes >= FILL_BELOW * target, (filled.nbytes, target)
    assert decompress(filled.data).num_gaussians == leaves
    # a budget that holds every leaf at rung 14 too: whole rungs first
    above = _fill_between_rungs(RungSearch(tree, int(1.03 * full14.nbytes), 0, Progress(False)), base)
    assert 14 <= above.rung.index[0] < 15 and sum(above.terminal) == leaves, above.rung.index


def test_a_fractional_rung_codes_and_decodes():
    """A file pinned between two rungs sits between their sizes and decodes."""
    s = random_scene(600, 0, seed=12)
    kw = dict(ratio=1.05, num_views=4, view_size=48, refine_steps=0, prune_search=0, frame="world")
    sizes = [compress(s, preset=(g, 0), **kw) for g in (13, 13.5, 14)]
    assert [r.primitives for r in sizes] == [600] * 3 and sizes[1].preset_index == (13.5, 0)
    assert sizes[0].nbytes < sizes[1].nbytes < sizes[2].nbytes, [r.nbytes for r in sizes]
    dec = decompress(sizes[1].data)
    assert dec.num_gaussians == 600 and torch.isfinite(dec.means).all()
    # closer to the original than rung 13, in position
    err = [float((decompress(r.data).means.sort(0).values - s.means.sort(0).values).abs().mean()) for r in sizes]
    assert err[2] < err[1] < err[0], err


def test_a_fill_short_below_a_bit_depth_jump_holds_the_bits():
    """Between rungs 11 and 12 the rotation bits round 8 -> 9 at 11.5 and the file jumps 3%; a
    target inside the jump is filled by rung 11's bit depths with the steps moved on toward 12
    (``bits_from``), to at least FILL_BELOW of it, every leaf kept, and the file decodes."""
    from visionmoe.splat.encoder.contribution import prune
    from visionmoe.splat.encoder.rung_search import FILL_BELOW, RungSearch, _fill_between_rungs, allocate_and_encode
    from visionmoe.splat.encoder.stages import Progress, StageTimes
    from visionmoe.splat.encoder.tree import build_tree

    scene = random_scene(3000, 0, seed=12)
    kept, w = prune(scene, torch.rand(3000, generator=torch.Generator().manual_seed(0)) + 0.1, 0.0)
    tree = build_tree(kept, w, 0, 3000, 10**6)
    leaves = tree.pyramid.levels[-1].num_gaussians

    def pinned(pin, target=10**6):
        return allocate_and_encode(tree, target, pin=pin, seed=0, prog=Progress(False), times=StageTimes()).encoding

    below, above = pinned((11.484375, 0)), pinned((11.5, 0))
    target = (below.nbytes + above.nbytes) // 2
    assert below.nbytes < FILL_BELOW * target < target < above.nbytes  # inside the jump
    filled = _fill_between_rungs(RungSearch(tree, target, 0, Progress(False)), pinned((11, 0), target))
    g, a, bits_from = filled.rung.index
    assert 11.5 < g < 12 and a == 0 and bits_from == 11, filled.rung.index
    assert filled.rung.preset.rot_bits == GEOMETRY_LADDER[11][4] and filled.rung.preset.op_bits == GEOMETRY_LADDER[11][3]
    assert FILL_BELOW * target <= filled.nbytes <= target and sum(filled.terminal) == leaves, (filled.nbytes, target)
    assert decompress(filled.data).num_gaussians == leaves


def test_bits_from_holds_the_bit_depths_only():
    """``bits_from`` keeps one end's opacity and rotation bits; steps and codebook cap are the
    fractional rung's own; a rung that is not next to the geometry is refused."""
    plain, held = make_preset(11.75, 0), make_preset(11.75, 0, bits_from=11)
    assert (held.op_bits, held.rot_bits) == tuple(GEOMETRY_LADDER[11][3:5]) != (plain.op_bits, plain.rot_bits)
    assert (held.pos_rel, held.dc_step, held.ls_step, held.shape_codebook) == \
        (plain.pos_rel, plain.dc_step, plain.ls_step, plain.shape_codebook)
    assert make_preset(11.25, 0, bits_from=12).rot_bits == GEOMETRY_LADDER[12][4]
    with pytest.raises(ValueError, match="preset rungs"):
        make_preset(11.5, 0, bits_from=13)


def test_a_fill_short_below_a_palette_jump_holds_the_palettes():
    """8-bit colours (a palette of each DC channel): from geometry rung 8.64 on, the DC step is
    fine enough for the lossless tables and the file jumps 5%; a target inside the jump is
    filled by finer rungs that keep the coarser rung's uniform colours (``palettes_from``), to
    at least FILL_BELOW of it, every leaf kept, and the file decodes."""
    from visionmoe.splat.encoder.contribution import prune
    from visionmoe.splat.encoder.rung_search import FILL_BELOW, RungSearch, _fill_between_rungs, allocate_and_encode
    from visionmoe.splat.encoder.stages import Progress, StageTimes
    from visionmoe.splat.encoder.tree import build_tree

    scene = random_scene(3000, 0, seed=12)
    c0 = 0.28209479177387814
    rgb = torch.round((scene.sh_dc * c0 + 0.5).clamp(0, 1) * 255) / 255
    scene = dataclasses.replace(scene, sh_dc=((rgb - 0.5) / c0).float())
    kept, w = prune(scene, torch.rand(3000, generator=torch.Generator().manual_seed(0)) + 0.1, 0.0)
    tree = build_tree(kept, w, 0, 3000, 10**6)
    leaves = tree.pyramid.levels[-1].num_gaussians
    assert {"dc0", "dc1", "dc2"} <= set(tree.meta.palettes.values)

    def pinned(pin, target=10**6):
        return allocate_and_encode(tree, target, pin=pin, seed=0, prog=Progress(False), times=StageTimes()).encoding

    below, above = pinned((8.625, 0)), pinned((8.640625, 0))
    assert below.rung.tables.palettes is None and above.rung.tables.palettes is not None
    target = (below.nbytes + above.nbytes) // 2
    assert below.nbytes < FILL_BELOW * target < target < above.nbytes  # inside the jump
    filled = _fill_between_rungs(RungSearch(tree, target, 0, Progress(False)), pinned((8, 0), target))
    g, a, bits_from, palettes_from = filled.rung.index
    assert g > 8.64 and a == 0 and bits_from is None and 8.5 < palettes_from < 8.64, filled.rung.index
    assert filled.rung.tables.palettes is None
    assert FILL_BELOW * target <= filled.nbytes <= target and sum(filled.terminal) == leaves, (filled.nbytes, target)
    dec = decompress(filled.data)
    assert dec.num_gaussians == leaves and torch.isfinite(dec.sh_dc).all()


def test_palettes_from_chooses_the_tables_by_another_rungs_steps():
    from visionmoe.splat.encoder.rung import active_palettes
    from visionmoe.splat.pgms.quantize import Palettes

    grid = (np.arange(256, dtype=np.float32) / 255 - 0.5) / 0.28209479177387814
    pal = Palettes({"dc0": grid}, {"dc0": 0})
    assert active_palettes(pal, make_preset(9, 0)) is not None  # a step finer than 1.25x the spacing
    assert active_palettes(pal, make_preset(9, 0, palettes_from=8)) is None
    assert active_palettes(pal, make_preset(8, 0, palettes_from=9)) is not None
    assert make_preset(9.5, 0, None, 8.5).dc_step == make_preset(9.5, 0).dc_step  # only the tables are held
    with pytest.raises(ValueError, match="palettes_from"):
        make_preset(9, 0, palettes_from=40)
