"""visionmoe.splat.memory: the encoder's peak-memory estimate and the limit checked before encoding."""

from __future__ import annotations

import pytest

from visionmoe.splat import memory
from visionmoe.splat.memory import EncodeMemoryError, check_encode_memory, encode_memory_needed


def test_estimate_is_linear_in_n_and_grows_with_the_sh_degree():
    for sh in range(4):
        a, b, c = (encode_memory_needed(n, sh) for n in (0, 1_000_000, 2_000_000))
        assert a == memory.ENCODE_BASE_BYTES
        assert c - b == b - a > 0
    per = [encode_memory_needed(1_000_000, sh) for sh in range(4)]
    assert per == sorted(per)
    assert encode_memory_needed(1_000_000, 0) - memory.ENCODE_BASE_BYTES == 1_000_000 * memory.ENCODE_BYTES_PER_GAUSSIAN[0]


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
