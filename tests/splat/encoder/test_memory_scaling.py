"""scripts/bench_scaling.py: the tiled scenes it encodes and the fits it reports."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from pgms_helpers import random_scene

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scaling", REPO / "scripts" / "bench_scaling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("n", [700, 1000, 3500])
def test_tiled_scene_has_the_size_and_degree_asked(bench, n):
    src = random_scene(1000, degree=3, seed=1)
    out = bench.tiled_scene(src, n, seed=n)
    assert out.num_gaussians == n and out.sh_degree == 3
    assert torch.isfinite(out.means).all()
    # the view-dependent colour is the source's, copied, never invented
    assert set(map(tuple, out.sh_rest[:, 0].tolist())) <= set(map(tuple, src.sh_rest[:, 0].tolist()))


def test_tiled_scene_is_deterministic_and_its_copies_differ(bench):
    src = random_scene(1000, degree=0, seed=2)
    a, b = bench.tiled_scene(src, 2500, seed=5), bench.tiled_scene(src, 2500, seed=5)
    assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("means", "sh_dc", "quats"))
    # three copies side by side: the second lies beyond the first along x, no centre repeats
    assert float(a.means[1000:2000, 0].mean()) > float(a.means[:1000, 0].mean()) + 0.5 * float(
        src.means[:, 0].max() - src.means[:, 0].min())
    assert torch.unique(a.means, dim=0).shape[0] == 2500
    assert not torch.equal(a.means, bench.tiled_scene(src, 2500, seed=6).means)


def test_fits_recover_known_exponent_and_line(bench):
    ns = [100_000, 300_000, 1_000_000]
    assert bench.fit_loglog(ns, [2e-5 * n**1.5 for n in ns]) == pytest.approx(1.5)
    a, b = bench.fit_linear(ns, [5e8 + 1200 * n for n in ns])
    assert a == pytest.approx(5e8) and b == pytest.approx(1200)
    assert bench.fit_loglog(ns[:1], [1.0]) is None


def test_stage_intervals_name_the_gaps(bench):
    got = bench.stage_intervals([("pyramid", 3.0, 4.0), ("contributions", 1.0, 2.0)], 0.0, 5.0)
    assert [g[0] for g in got] == ["setup", "contributions", "references", "pyramid", "before allocate"]
    assert math.isclose(sum(e - s for _, s, e in got), 5.0)


def test_table_and_fits_from_rows(bench):
    rows = [{"gaussians": n, "sh_degree": 0, "encode_s": n / 1e4, "peak_rss": int(1e9 + 800 * n),
             "rss_loaded": int(5e8), "kept": n, "stages": [{"stage": "pyramid", "seconds": n / 1e5, "peak_rss": 1}]}
            for n in (100_000, 1_000_000)]
    rows.append({"gaussians": 6_000_000, "sh_degree": 0, "error": "exit 3 after 10 s: stopped"})
    fitted = bench.fits(rows)
    assert fitted["0"]["time_exponent"]["pyramid"] == pytest.approx(1.0)
    assert fitted["0"]["peak_rss_linear"]["b_bytes_per_gaussian"] == pytest.approx(800)
    text = bench.table(rows, fitted)
    assert "exit 3 after 10 s" in text and "800 B x N" in text


def test_malloc_state_reports_the_heap_where_glibc_has_mallinfo2():
    """In a fresh process: a test before this one may have run the CLI in this one, whose
    ``keep_freed_memory`` serves large blocks from the heap (nothing is mapped then)."""
    import subprocess
    import sys

    code = (f"import importlib.util as u; s = u.spec_from_file_location('b', {str(REPO / 'scripts' / 'bench_scaling.py')!r}); "
            "b = u.module_from_spec(s); s.loader.exec_module(b); state = b.malloc_state()\n"
            "if state is None: print('skip'); raise SystemExit\n"
            "assert set(state) == {'heap_in_use', 'heap_free', 'mapped'} and state['heap_in_use'] > 0, state\n"
            "big = bytearray(64 << 20)  # a large block is mapped, not carved from the heap\n"
            "assert b.malloc_state()['mapped'] >= state['mapped'] + (64 << 20) - (1 << 20)\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.strip() == "skip":
        pytest.skip("not glibc 2.33+")
    assert out.stdout.strip() == "ok"


def test_the_encoder_lets_the_input_scene_go_once_it_has_the_canonical_copy(monkeypatch):
    import gc
    import weakref

    from visionmoe.splat.encoder import compress as compress_mod

    seen = {}
    real = compress_mod._contributions

    def probe(scene, opts, prog):
        gc.collect()
        seen["input alive"] = ref() is not None
        return real(scene, opts, prog)

    monkeypatch.setattr(compress_mod, "_contributions", probe)
    held = [random_scene(300, degree=1, seed=4)]
    ref = weakref.ref(held[0].means)  # the tensors die with the scene (nothing else holds them)
    compress_mod.compress(held.pop(), ratio=10, effort="fast", num_views=4, coverage_views=4, view_size=32)
    assert seen == {"input alive": False}


def test_the_sampler_names_where_the_main_thread_is(bench):
    import threading

    sampler = bench.RssSampler()
    seen = []
    src = ("def inner(run):\n"
           "    run()\n"
           "def outer(run):\n"
           "    inner(run)\n")
    ns = {}
    exec(compile(src, "/pkg/visionmoe/fake_stage.py", "exec"), ns)  # a frame the sampler keeps

    def from_another_thread():
        t = threading.Thread(target=lambda: seen.append(sampler.where()))
        t.start()
        t.join()

    ns["outer"](from_another_thread)
    assert seen == ["fake_stage.py:2 inner < fake_stage.py:4 outer"]
