"""Degenerate scenes through ``visionmoe-splat compress`` (issue 31): each case ends within a
wall-clock limit with its expected behaviour, a decodable file (exit 0) or one clear error
line (exit 2), never a traceback, a hang or a stream of warnings."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from pgms_helpers import random_scene

from visionmoe.splat import decompress, write_ply

REPO = Path(__file__).resolve().parents[3]
ENCODE_TIMEOUT = 90  # s; each case encodes in seconds when it ends
FAST = ["--views", "4", "--view-size", "64", "--quiet"]


def splat_cli(*args, timeout=ENCODE_TIMEOUT) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    try:
        return subprocess.run([sys.executable, "-m", "visionmoe.splat", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail(f"visionmoe-splat {' '.join(map(str, args))} did not end within {timeout} s")


def _scene(n=800, seed=3, **overrides):
    s = random_scene(n, 1, seed=seed)
    return replace(s, **{k: v(s) if callable(v) else v for k, v in overrides.items()})


def _one_outlier_scale(s):
    ls = s.log_scales.clone()
    ls[17] = -100.0
    return ls


def _one_far(value):
    def f(s):
        m = s.means.clone()
        m[5, 0] = value
        return m
    return f


# (name, scene factory, expected: "ok" or a regex the one error line must match)
CASES = [
    pytest.param("outlier_scale", lambda: _scene(log_scales=_one_outlier_scale), "ok"),
    pytest.param("all_tiny", lambda: _scene(log_scales=lambda s: torch.full_like(s.log_scales, -30.0)), "ok"),
    pytest.param("all_huge", lambda: _scene(log_scales=lambda s: torch.full_like(s.log_scales, 80.0)),
                 "ok"),
    pytest.param("far_3e38", lambda: _scene(means=_one_far(3e38)), "position"),
    pytest.param("far_1e15", lambda: _scene(means=_one_far(1e15)), "position"),
    pytest.param("dc_1e38", lambda: _scene(sh_dc=lambda s: s.sh_dc.index_fill(0, torch.tensor([9]), 1e38)),
                 "DC colour"),
    # one Gaussian at --ratio 6 asks for 121 bytes: refused before encoding, naming the smallest
    # file (test_target_guard encodes the smallest case for real)
    pytest.param("one_gaussian", lambda: _scene(n=1), "smallest .pgms"),
    pytest.param("one_position", lambda: _scene(n=50, means=lambda s: torch.ones_like(s.means),
                                                log_scales=lambda s: torch.full_like(s.log_scales, -3.0)), "ok"),
    pytest.param("transparent", lambda: _scene(opacity_logits=lambda s: torch.full_like(s.opacity_logits, -20.0)),
                 "ok"),
]


@pytest.mark.parametrize("name,make,expected", CASES)
def test_degenerate_scene(tmp_path, name, make, expected):
    src, out = tmp_path / f"{name}.ply", tmp_path / f"{name}.pgms"
    write_ply(make(), src)
    r = splat_cli("compress", src, "-o", out, "--ratio", "6", *FAST)
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr, r.stderr[-3000:]
    if expected == "ok":
        assert r.returncode == 0, r.stderr
        assert r.stderr.strip() == ""
        dec = decompress(out)
        assert dec.num_gaussians >= 1
        assert all(bool(getattr(dec, k).isfinite().all()) for k in ("means", "log_scales", "sh_dc", "opacity_logits"))
    else:
        assert r.returncode == 2, (r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("visionmoe-splat compress: error:"), r.stderr
        assert __import__("re").search(expected, lines[0]), lines[0]
        assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_library_rules_for_degenerate_input():
    """The same rules through the Python API: far positions refused (SceneError), out-of-range
    log-scales clamped and counted in the result."""
    from visionmoe.splat import SceneError, compress

    contrib = torch.ones(200)
    with pytest.raises(SceneError, match="beyond 1e\\+07"):
        compress(_scene(n=200, means=_one_far(2e7)), contributions=contrib, preset=(3, 3))
    res = compress(_scene(n=200, log_scales=_one_outlier_scale), ratio=4, contributions=contrib, preset=(3, 3))
    assert res.clamped_log_scales == 1
    assert decompress(res.data).log_scales.min() >= -31
