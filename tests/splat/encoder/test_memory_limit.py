"""visionmoe.splat.memory: the encoder's peak-memory estimate and the limit checked before encoding."""

from __future__ import annotations

import pytest

from visionmoe.splat import memory
from visionmoe.splat.memory import EncodeMemoryError, check_encode_memory, encode_memory_needed


def test_estimate_is_two_lines_meeting_at_one_million():
    m = memory.KEEP_FREED_MEMORY_MAX_GAUSSIANS
    a, b, c = (encode_memory_needed(n, 3) for n in (0, m // 2, m))
    assert a == memory.ENCODE_BASE_BYTES and c - b == b - a > 0
    above = memory.ENCODE_LARGE_BASE_BYTES + memory.ENCODE_LARGE_BYTES_PER_GAUSSIAN * m
    assert abs(above - c) < 0.01 * c  # continuous where the two meet
    assert encode_memory_needed(6_000_000, 3) == memory.ENCODE_LARGE_BASE_BYTES + 6_000_000 * 1892
    assert len({encode_memory_needed(10**6, sh) for sh in range(4)}) == 1


@pytest.mark.parametrize("sh,n,peak", [  # docs/SCALING.md's table: tiled shared scenes at 20x
    (0, 100_000, 1.47e9), (0, 300_000, 1.51e9), (0, 1_000_000, 2.96e9), (0, 3_000_000, 5.91e9),
    (0, 6_000_000, 10.29e9),
    (3, 100_000, 1.83e9), (3, 300_000, 2.09e9), (3, 1_000_000, 4.40e9), (3, 3_000_000, 6.46e9),
    (3, 6_000_000, 9.95e9),
])
def test_estimate_covers_every_measured_peak(sh, n, peak):
    assert encode_memory_needed(n, sh) >= peak


def test_a_tiny_limit_is_refused_in_one_line_naming_estimate_and_limit():
    with pytest.raises(EncodeMemoryError) as e:
        check_encode_memory(1_000_000, 3, max_memory=1000)
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, ValueError)
    need = encode_memory_needed(1_000_000, 3)
    assert f"{need / 1e9:.2f} GB" in msg and "--max-memory of 0.00 GB" in msg


def test_a_scene_that_fits_passes_and_the_default_limit_is_the_machine(monkeypatch):
    assert check_encode_memory(100_000, 0, max_memory=10**12) == encode_memory_needed(100_000, 0)
    monkeypatch.setattr(memory, "physical_memory", lambda: 2 * 10**9)
    with pytest.raises(EncodeMemoryError, match="this machine's memory of 2.00 GB"):
        check_encode_memory(10_000_000, 3)
    monkeypatch.setattr(memory, "physical_memory", lambda: None)  # unknown: nothing to check against
    assert check_encode_memory(10_000_000, 3) == encode_memory_needed(10_000_000, 3)


@pytest.mark.parametrize("bad", [0, -5, 1.5, "1G"])
def test_a_bad_limit_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="max_memory must be a positive number of bytes"):
        check_encode_memory(1000, 0, max_memory=bad)


def test_a_bad_sh_degree_is_refused():
    with pytest.raises(ValueError, match="sh_degree must be 0-3"):
        encode_memory_needed(10, 4)


def test_compress_command_refuses_a_scene_above_max_memory_in_one_line(tmp_path, capsys):
    from pgms_helpers import ASSET

    from visionmoe.splat.cli import main

    out = tmp_path / "x.pgms"
    assert main(["compress", str(ASSET), "-o", str(out), "--max-memory", "1k", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "needs about" in err[0] and "--max-memory of 0.00 GB" in err[0]
    assert not out.exists()


def test_library_compress_honours_max_memory_before_any_work(monkeypatch):
    from pgms_helpers import ASSET

    from visionmoe.splat import compress
    from visionmoe.splat.encoder import compress as compress_module

    def never(*a, **k):
        raise AssertionError("encoded although the scene cannot fit")

    monkeypatch.setattr(compress_module, "_encode", never)
    with pytest.raises(EncodeMemoryError, match="needs about"):
        compress(ASSET, max_memory=1000)
    with pytest.raises(ValueError, match="max_memory must be a positive number of bytes"):
        compress(ASSET, max_memory=True)
    monkeypatch.undo()
    small = compress(ASSET, max_memory=10**12, effort="fast", num_views=4, view_size=32, coverage_views=2)
    assert small.nbytes > 0
