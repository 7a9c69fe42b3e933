"""The PGMS encoder's cost model: time and peak memory per stage against the number of Gaussians.

Scenes are real shared scenes tiled on a horizontal grid and jittered (not random points):
SH0 from ``academic_tarot_cards`` (115k Gaussians, from a .splat), SH3 from ``ertz_couch_sh3``
(14k, float-trained SH3). A size below the source's is a seeded random subset of it; above, whole
copies side by side (gap of a tenth of the source's extent) and a seeded subset of one more copy,
each Gaussian's centre moved by a normal of 5% of its own mean scale and its base colour by 0.02
(SH DC units), so no two copies are exact duplicates. Each scene is written as a float32 .ply and
encoded at ``--ratio`` (default 20x) in its own process, read as the command line reads it (with
its malloc setting, ``visionmoe.splat.memory``), with default options on the CPU.

Per stage (the encoder's logged stages: contributions, pyramid, allocate, prune search, refine;
the time between them is named after what runs there) it records seconds and the peak RSS
(``/proc/self/statm`` sampled every 10 ms in a thread), plus the process's peak RSS (``getrusage``).
Then it fits, per stage and SH degree, the exponent of time against N (least squares in log-log)
and the peak RSS as ``a + b N``; prints the table, writes JSON, and draws time and memory against
N (``--plot``).

    python scripts/bench_compress.py --scaling                                  # 100k..6M, SH0 and SH3
    python scripts/bench_scaling.py --sizes 100k,300k,1M --sh 0,3 --out out/scaling_before
    python scripts/bench_scaling.py --from-json out/scaling/scaling.json --plot docs/bench_scaling.png

A worker whose RSS passes ``--rss-limit`` (default 20 GB) stops itself, so a run that would not fit
never takes the machine down; its row says so.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import functools
import json
import lzma
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = {0: "academic_tarot_cards", 3: "ertz_couch_sh3"}
DEFAULT_SIZES = "100k,300k,1M,3M,6M"
STAGES = ("contributions", "pyramid", "allocate", "prune search", "refine")
# what runs in the time after a logged stage and before the next one
GAP_NAMES = {None: "setup", "contributions": "references", "allocate": "check + cut", "prune search": "between",
             "refine": "tail", "pyramid": "before allocate"}
_PAGE = os.sysconf("SC_PAGE_SIZE")


def parse_count(text: str) -> int:
    t = text.strip().lower()
    mult = {"k": 1000, "m": 1000**2}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def label(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


# --------------------------------------------------------------------------- scenes


def load_source(scenes_dir: Path, name: str):
    from visionmoe.splat.io import read_ply

    cache = Path(os.environ.get("TMPDIR", "/tmp")) / f"visionmoe_scaling_{name}.ply"
    if not cache.exists():
        cache.write_bytes(lzma.decompress((scenes_dir / f"{name}.ply.xz").read_bytes()))
    return read_ply(cache)


def tiled_scene(src, n: int, seed: int):
    """``n`` Gaussians from ``src``: a random subset when smaller, copies on an x-z grid otherwise."""
    import torch

    from visionmoe.splat.io import GaussianScene

    g = torch.Generator().manual_seed(seed)
    m = src.num_gaussians
    copies = math.ceil(n / m)
    side = math.ceil(math.sqrt(copies))
    q = torch.quantile(src.means[torch.randperm(m, generator=g)[:100_000]].float(),
                       torch.tensor([0.05, 0.95]), dim=0)
    step = (q[1] - q[0]) * 1.1
    parts = []
    for c in range(copies):
        take = min(m, n - c * m)
        idx = torch.randperm(m, generator=g)[:take].sort().values if take < m else torch.arange(m)
        part = src.subset(idx)
        offset = torch.tensor([(c % side) * float(step[0]), 0.0, (c // side) * float(step[2])])
        if copies == 1:
            offset.zero_()
        sigma = torch.exp(part.log_scales.float()).mean(1, keepdim=True) * 0.05
        means = part.means + offset + torch.randn(part.means.shape, generator=g) * sigma
        dc = part.sh_dc + torch.randn(part.sh_dc.shape, generator=g) * 0.02
        parts.append(GaussianScene(means=means, quats=part.quats, log_scales=part.log_scales,
                                   opacity_logits=part.opacity_logits, sh_dc=dc, sh_rest=part.sh_rest))
    return GaussianScene(**{k: torch.cat([getattr(p, k) for p in parts]) for k in
                            ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")})


def make_scene(scenes_dir: Path, sh: int, n: int, path: Path, seed: int) -> None:
    from visionmoe.splat.io import write_ply

    write_ply(tiled_scene(load_source(scenes_dir, SOURCES[sh]), n, seed), path)


# --------------------------------------------------------------------------- worker


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=1)
def _mallinfo2():
    """glibc's ``mallinfo2``, looked up once (None where that is not glibc 2.33+)."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


def malloc_state() -> dict | None:
    """glibc's view of the heap (``mallinfo2``, every arena): bytes in use, free but held, and
    mapped for large blocks; None where that is not glibc 2.33+. Free-but-held bytes count in RSS
    without holding any array (fragmentation)."""
    fn = _mallinfo2()
    if fn is None:
        return None
    m = fn()
    return {"heap_in_use": m.uordblks, "heap_free": m.fordblks, "mapped": m.hblkhd}


class RssSampler(threading.Thread):
    """Samples this process's RSS every ``period`` seconds: -> [(time, bytes)], and where the
    encoder was (its innermost frames) at the highest sample since the last ``segment()`` call;
    exits the process when RSS passes ``limit`` (a run that would not fit must not take the
    machine down)."""

    def __init__(self, period: float = 0.01, limit: int | None = None):
        super().__init__(daemon=True)
        self.period, self.limit, self.samples, self.stop = period, limit, [], threading.Event()
        self.main = threading.get_ident()
        self.seg_max, self.seg_where, self.seg_malloc, self.peaks = 0, "", None, []

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE

    def where(self) -> str:
        """The encoder's innermost frames on the main thread, then on any other thread it runs
        (the rung checks and the pruning search's variants run on helper threads). Read with
        ``faulthandler``, which walks the interpreter's frames without making frame objects:
        walking them with ``sys._current_frames`` kept the encoder's arrays alive (playbot at
        20x: 5.05 GB peak against 2.94 GB without the walk)."""
        with tempfile.TemporaryFile("w+") as fh:
            faulthandler.dump_traceback(fh, all_threads=True)
            fh.seek(0)
            text = fh.read()
        stacks, ident = {}, None
        for line in text.splitlines():
            head = re.match(r"(?:Current thread|Thread) (0x[0-9a-f]+)", line)
            if head:
                ident = int(head.group(1), 16)
                stacks[ident] = []
                continue
            m = re.match(r'\s+File "([^"]+)", line (\d+) in (\S+)', line)
            if m and ident is not None and "visionmoe" in m.group(1):
                stacks[ident].append(f"{Path(m.group(1)).name}:{m.group(2)} {m.group(3)}")  # innermost first
        order = [self.main] + [i for i in stacks if i not in (self.main, threading.get_ident())]
        return " | ".join(" < ".join(stacks[i][:4]) for i in order if stacks.get(i))

    def segment(self, name: str) -> None:
        """Close a segment (the encode up to the end of stage ``name``): keep its peak and where."""
        self.peaks.append({"until": name, "peak_rss": self.seg_max, "where": self.seg_where, "malloc": self.seg_malloc})
        self.seg_max, self.seg_where, self.seg_malloc = 0, "", None

    def run(self) -> None:
        while not self.stop.is_set():
            r = self.rss()
            self.samples.append((time.perf_counter(), r))
            if r > self.seg_max:
                self.seg_max, self.seg_where, self.seg_malloc = r, self.where(), malloc_state()
            if self.limit and r > self.limit:
                sys.stderr.write(f"RSS {r / 1e9:.1f} GB passed the limit of {self.limit / 1e9:.1f} GB at "
                                 f"{self.where()}: stopped\n")
                sys.stderr.flush()
                os._exit(3)
            time.sleep(self.period)


class StageLog:
    """Collects the encoder's ``stage NAME: S s`` log records with their end times (and closes
    the sampler's segment there)."""

    def __init__(self, sampler: RssSampler, partial: Path | None = None):
        import logging

        self.ends: list[tuple[str, float, float]] = []  # (stage, start, end) on perf_counter's clock
        self.t0 = time.perf_counter()
        outer = self

        class Handler(logging.Handler):
            def emit(self, record):
                if isinstance(record.msg, str) and record.msg.startswith("stage %s") and record.args:
                    now = time.perf_counter()
                    outer.ends.append((record.args[0], now - float(record.args[1]), now))
                    sampler.segment(record.args[0])
                    if partial is not None:  # what a run stopped before its end still tells
                        partial.write_text(json.dumps({"stages_done": [
                            {"stage": n, "start_s": round(s - outer.t0, 2), "end_s": round(e - outer.t0, 2)}
                            for n, s, e in outer.ends], "peaks": sampler.peaks}))

        log = logging.getLogger("visionmoe.splat.encoder")
        log.setLevel(logging.INFO)
        log.addHandler(Handler())


def stage_intervals(ends, t0: float, t1: float) -> list[tuple[str, float, float]]:
    """The logged stages plus the gaps between them (named in ``GAP_NAMES``), in time order."""
    out, prev_end, prev = [], t0, None
    for name, s, e in sorted(ends, key=lambda x: x[1]):
        if s - prev_end > 1e-3:
            out.append((GAP_NAMES.get(prev, f"after {prev}"), prev_end, s))
        out.append((name, s, e))
        prev_end, prev = e, name
    if t1 - prev_end > 1e-3:
        out.append((GAP_NAMES.get(prev, f"after {prev}"), prev_end, t1))
    return out


def run_worker(ply: Path, ratio: float, out: Path, rss_limit: int) -> None:
    from visionmoe.splat import compress
    from visionmoe.splat.io import read_ply
    from visionmoe.splat.memory import KEEP_FREED_MEMORY_MAX_GAUSSIANS, keep_freed_memory

    sampler = RssSampler(limit=rss_limit)
    log = StageLog(sampler, out.with_suffix(".partial.json"))
    sampler.start()
    t_read = time.perf_counter()
    held = [read_ply(ply)]
    n, sh = held[0].num_gaussians, held[0].sh_degree
    if n <= KEEP_FREED_MEMORY_MAX_GAUSSIANS:  # as the command line does
        keep_freed_memory()
    t0 = time.perf_counter()
    rss_loaded = sampler.rss()
    res = compress(held.pop(), ratio=ratio)  # the encoder holds the only reference, as from a path
    t1 = time.perf_counter()
    sampler.stop.set()
    sampler.join()
    sampler.segment("end")
    samples = sampler.samples
    stages = []
    for name, s, e in stage_intervals(log.ends, t0, t1):
        inside = [r for t, r in samples if s <= t <= e]
        stages.append({"stage": name, "seconds": round(e - s, 3), "peak_rss": max(inside) if inside else None})
    rec = {
        "gaussians": n, "sh_degree": sh, "read_s": round(t0 - t_read, 3),
        "encode_s": round(t1 - t0, 3), "rss_loaded": rss_loaded,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "bytes": res.nbytes, "ratio": round(res.ratio, 3), "primitives": res.primitives,
        "kept": res.input_gaussians - res.pruned, "stages": stages, "peaks": sampler.peaks,
    }
    out.write_text(json.dumps(rec))


# --------------------------------------------------------------------------- driver


def fit_loglog(ns, ys) -> float | None:
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx > 0 else None


def fit_linear(ns, ys) -> tuple[float, float] | None:
    """Least squares ``y = a + b n`` -> (a, b)."""
    pts = [(n, y) for n, y in zip(ns, ys) if y]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    b = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    return my - b * mx, b


def fits(rows: list[dict]) -> dict:
    out = {}
    for sh in sorted({r["sh_degree"] for r in rows}):
        done = sorted((r for r in rows if r["sh_degree"] == sh and r.get("encode_s")), key=lambda r: r["gaussians"])
        ns = [r["gaussians"] for r in done]
        names = []
        for r in done:
            names += [s["stage"] for s in r["stages"] if s["stage"] not in names]
        per = {}
        for name in names:
            secs = [sum(s["seconds"] for s in r["stages"] if s["stage"] == name) for r in done]
            per[name] = fit_loglog(ns, secs)
        lin = fit_linear(ns, [r["peak_rss"] for r in done])
        out[str(sh)] = {"time_exponent": {k: (round(v, 2) if v is not None else None) for k, v in per.items()},
                        "total_time_exponent": fit_loglog(ns, [r["encode_s"] for r in done]),
                        "peak_rss_exponent": fit_loglog(ns, [r["peak_rss"] for r in done]),
                        "peak_rss_linear": None if lin is None else {"a_bytes": round(lin[0]), "b_bytes_per_gaussian": round(lin[1], 1)}}
    return out


def table(rows: list[dict], fitted: dict) -> str:
    lines = ["| SH | N | kept | encode s | peak RSS GB | per stage: s (peak RSS GB) |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["sh_degree"], r["gaussians"])):
        if not r.get("encode_s"):
            lines.append(f"| {r['sh_degree']} | {label(r['gaussians'])} | | {r.get('error', 'failed')} | | |")
            continue
        st = ", ".join(f"{s['stage']} {s['seconds']:.1f}" + (f" ({s['peak_rss'] / 1e9:.2f})" if s["peak_rss"] else "")
                       for s in r["stages"] if s["seconds"] >= 0.05)
        lines.append(f"| {r['sh_degree']} | {label(r['gaussians'])} | {r['kept']} | {r['encode_s']:.1f} | "
                     f"{r['peak_rss'] / 1e9:.2f} | {st} |")
    for sh, f in fitted.items():
        exps = ", ".join(f"{k} {v}" for k, v in f["time_exponent"].items() if v is not None)
        lin = f["peak_rss_linear"]
        lines.append("")
        tt = f["total_time_exponent"]
        lines.append(f"SH{sh}: time ~ N^{tt:.2f} (per stage: {exps})" if tt is not None else f"SH{sh}: one size only")
        if lin:
            lines.append(f"SH{sh}: peak RSS ~ N^{f['peak_rss_exponent']:.2f}; linear fit {lin['a_bytes'] / 1e9:.2f} GB "
                         f"+ {lin['b_bytes_per_gaussian']:.0f} B x N")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors, labelled = {}, set()

    def once(text):
        if text in labelled:
            return None
        labelled.add(text)
        return text

    for sh, ls in ((0, "-"), (3, "--")):
        done = sorted((r for r in rows if r["sh_degree"] == sh and r.get("encode_s")), key=lambda r: r["gaussians"])
        stopped = [r for r in rows if r["sh_degree"] == sh and not r.get("encode_s") and r.get("peak_rss")]
        for r in stopped:  # a run stopped before its end (RSS limit, time): the peak it reached
            ax_m.plot([r["gaussians"]], [r["peak_rss"] / 1e9], "x", ms=9, color="tab:red",
                      label=once("stopped before the end: peak so far"))
        if not done:
            continue
        names = []
        for r in done:
            names += [s["stage"] for s in r["stages"] if s["stage"] not in names]
        for name in names:
            pts = [(r["gaussians"], sum(s["seconds"] for s in r["stages"] if s["stage"] == name)) for r in done]
            pts = [(n, t) for n, t in pts if t >= 0.5]  # a stage that did not run (refine above 150k primitives)
            if not pts:
                continue
            line, = ax_t.plot(*zip(*pts), ls, marker="o", ms=3, color=colors.get(name), label=once(name))
            colors[name] = line.get_color()
            peaks = [(r["gaussians"], max((s["peak_rss"] or 0) for s in r["stages"] if s["stage"] == name) / 1e9)
                     for r in done if any(s["stage"] == name and s["peak_rss"] for s in r["stages"])]
            if name in ("check + cut", "prune search", "contributions", "pyramid") and peaks:
                ax_m.plot(*zip(*peaks), ls, lw=1, color=colors[name], label=once(f"{name} peak"))
        ns = [r["gaussians"] for r in done]
        ax_t.plot(ns, [r["encode_s"] for r in done], ls, color="k", lw=2, label=once("total"))
        ax_m.plot(ns, [r["peak_rss"] / 1e9 for r in done], ls, marker="o", color="k", lw=2, label=f"peak RSS, SH{sh}")
        ax_m.plot(ns, [r["rss_loaded"] / 1e9 for r in done], ls, marker=".", color="tab:gray",
                  label=f"RSS with the scene loaded, SH{sh}")
    ax_m.axhline(16, color="tab:red", lw=1, ls=":", label="16 GB")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log")
        ax.set_xlabel("Gaussians (solid SH0, dashed SH3)")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("seconds (wall, shared busy cores)")
    ax_t.set_title("encode time per stage", fontsize=10)
    ax_m.set_ylabel("GB")
    ax_m.set_title("peak RSS of the encoding process (total and per stage)", fontsize=10)
    ax_t.legend(fontsize=7)
    ax_m.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def run_all(args) -> list[dict]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "scaling.json"
    rows = json.loads(json_path.read_text())["rows"] if args.resume and json_path.exists() else []
    done = {(r["sh_degree"], r["gaussians"]) for r in rows if r.get("encode_s")}
    rows = [r for r in rows if (r["sh_degree"], r["gaussians"]) in done]
    for sh in [int(s) for s in args.sh.split(",")]:
        for n in [parse_count(s) for s in args.sizes.split(",")]:
            if (sh, n) in done:
                continue
            ply = Path(args.scene_dir) / f"scaling_sh{sh}_{label(n)}.ply"
            if not ply.exists():
                subprocess.run([sys.executable, __file__, "--make", str(ply), "--make-sh", str(sh), "--make-n", str(n),
                                "--scenes-dir", args.scenes_dir], check=True)
            rec_path = out / f"sh{sh}_{label(n)}.json"
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--worker", str(ply), "--ratio", str(args.ratio),
                                   "--worker-out", str(rec_path), "--rss-limit", str(args.rss_limit)],
                                  capture_output=True, text=True, timeout=args.timeout)
            if proc.returncode == 0:
                rec = json.loads(rec_path.read_text())
            else:
                tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                rec = {"gaussians": n, "sh_degree": sh, "error": f"exit {proc.returncode} after "
                       f"{time.perf_counter() - t:.0f} s: {tail}"}
            rows.append(rec)
            print(f"SH{sh} {label(n)}: " + (f"{rec['encode_s']:.1f} s, peak RSS {rec['peak_rss'] / 1e9:.2f} GB"
                                            if "encode_s" in rec else rec["error"]), flush=True)
            json_path.write_text(json.dumps({"ratio": args.ratio, "rows": rows, "fits": fits(rows)}, indent=1))
            if not args.keep_scenes:
                ply.unlink(missing_ok=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"Gaussians per scene (default {DEFAULT_SIZES})")
    ap.add_argument("--sh", default="0,3", help="SH degrees (0: tiled academic_tarot_cards, 3: tiled ertz_couch_sh3)")
    ap.add_argument("--ratio", type=float, default=20.0)
    ap.add_argument("--scenes-dir", default=str(REPO.parent / "shared" / "scenes"))
    ap.add_argument("--scene-dir", default=os.environ.get("TMPDIR", "/tmp"), help="where the tiled .ply files go")
    ap.add_argument("--keep-scenes", action="store_true", help="keep the tiled .ply files")
    ap.add_argument("--out", default=str(REPO / "out" / "scaling"))
    ap.add_argument("--plot", default=None, help="PNG path (e.g. docs/bench_scaling.png)")
    ap.add_argument("--title", default="PGMS encoder at 20x: tiled real scenes, 2 shared CPU cores")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in OUT/scaling.json")
    ap.add_argument("--from-json", help="only print the table and draw the plot from this JSON")
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per encode (default 4 h)")
    ap.add_argument("--rss-limit", type=float, default=20e9, help="bytes; a worker above it stops (default 20e9)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--make", help=argparse.SUPPRESS)
    ap.add_argument("--make-sh", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--make-n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.make:
        make_scene(Path(args.scenes_dir), args.make_sh, args.make_n, Path(args.make), seed=args.make_n)
        return 0
    if args.worker:
        run_worker(Path(args.worker), args.ratio, Path(args.worker_out), int(args.rss_limit))
        return 0
    rows = json.loads(Path(args.from_json).read_text())["rows"] if args.from_json else run_all(args)
    fitted = fits(rows)
    print(table(rows, fitted))
    if args.plot:
        plot(rows, Path(args.plot), args.title)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
