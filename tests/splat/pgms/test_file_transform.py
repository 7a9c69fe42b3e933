"""The canonical frame PGMS codes in and section XFRM (format 5), which maps it back."""

import struct

import numpy as np
import pytest
import torch

from visionmoe.splat import compress, decompress
from visionmoe.splat.cameras import scene_frame
from visionmoe.splat.evaluation import rotation_matrix
from visionmoe.splat.pgms import bitstream as bs
from visionmoe.splat.pgms.decode import decode_coded
from visionmoe.splat.pgms.file_transform import apply_file_transform_
from visionmoe.splat.similarity import file_transform, transform_scene

from pgms_helpers import random_scene

FAST = dict(num_views=4, view_size=48, refine_steps=0, verify_views=1, prune_search=0)


@pytest.fixture(scope="module")
def sh2_file():
    scene = random_scene(600, 2, seed=5)
    scene = transform_scene(scene, rotation_matrix([0.2, 1.0, -0.4], 50.0), torch.tensor([3.0, -7.0, 2.0]), 40.0)
    return scene, compress(scene, ratio=6, **FAST).data


def test_default_files_code_the_canonical_frame_and_map_it_back(sh2_file):
    scene, data = sh2_file
    tags = [s.tag for s in bs.iter_sections(data)]
    assert bs.read_preamble(data) == bs.VERSION == (5, 0)
    assert tags[:2] == ["HEAD", "XFRM"]
    coded, dec = decode_coded(data), decompress(data)
    frame = scene_frame(coded)
    assert float(frame.centre.norm()) < 0.1 and 0.8 < frame.size < 1.25  # centred, unit size
    world = scene_frame(dec)  # back where the scene is, at its size
    assert float((world.centre - scene_frame(scene).centre).norm()) < 0.15 * scene_frame(scene).size
    assert abs(world.size / scene_frame(scene).size - 1) < 0.1


def test_world_frame_files_have_no_transform():
    scene = random_scene(300, 0, seed=6)
    data = compress(scene, ratio=6, frame="world", **FAST).data
    assert "XFRM" not in [s.tag for s in bs.iter_sections(data)]
    for k in ("means", "quats", "log_scales"):
        torch.testing.assert_close(getattr(decode_coded(data), k), getattr(decompress(data), k), rtol=0, atol=0)
    with pytest.raises(ValueError, match="frame"):
        compress(scene, ratio=6, frame="sideways", **FAST)


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_file_transform_matches_transform_scene(degree):
    scene = random_scene(500, degree, seed=7)
    R, t, s = rotation_matrix([1.0, -0.3, 0.5], 123.0), torch.tensor([0.5, 20.0, -3.0], dtype=torch.float64), 0.02
    back = bs.FileTransform.unpack(file_transform(R, t, s, degree).pack(), degree)  # through its bytes
    arrays = {k: getattr(scene, k).numpy().copy() for k in ("means", "quats", "log_scales", "sh_rest")}
    apply_file_transform_(arrays["means"], arrays["quats"], arrays["log_scales"], arrays["sh_rest"], back)
    ref = transform_scene(scene, R, t, s)
    for k, v in arrays.items():
        np.testing.assert_allclose(v, getattr(ref, k).numpy(), rtol=1e-5, atol=1e-5, err_msg=k)


def _with_xfrm(data: bytes, payload: bytes, major: int = 5) -> bytes:
    out = [bs.MAGIC + struct.pack("<HH", major, 0)]
    for sec in bs.iter_sections(data):
        out.append(bs.pack_section(sec.tag, payload if sec.tag == "XFRM" else sec.payload, sec.level))
    return b"".join(out)


def _xfrm(data: bytes) -> bytes:
    return next(s.payload for s in bs.iter_sections(data) if s.tag == "XFRM")


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p[:-4], "expected"),
    (lambda p: struct.pack("<d", float("nan")) + p[8:], "non-finite"),
    (lambda p: struct.pack("<d", 0.9) + p[8:], "norm"),
    (lambda p: p[:56] + struct.pack("<d", 0.0) + p[64:], "out of range"),
    (lambda p: p[:64] + struct.pack("<d", 3.0) + p[72:], "log-scale"),
    (lambda p: p[:72] + struct.pack("<f", 2.0) + p[76:], "not a rotation"),
])
def test_corrupt_transform_sections_raise_format_error(sh2_file, mutate, message):
    _, data = sh2_file
    with pytest.raises(bs.FormatError, match=message):
        decompress(_with_xfrm(data, mutate(_xfrm(data))))


def test_transform_section_is_refused_in_format_4(sh2_file):
    _, data = sh2_file
    with pytest.raises(bs.FormatError, match="unknown section 'XFRM'"):
        decompress(_with_xfrm(data, _xfrm(data), major=4))
