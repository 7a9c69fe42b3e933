"""``visionmoe-splat`` PGMS commands: compress, decompress, eval, info.

Each ``cmd_*`` returns an exit status and raises ``CLIError`` (or a library error) for bad
input, which ``main`` prints as one line with exit status 2. Outputs are written atomically
(``visionmoe.common.files.atomic_write``) and never over an input file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ...common.cli import CLIError
from ...common.validators import nonnegative_int, positive_int
from ..memory import KEEP_FREED_MEMORY_MAX_GAUSSIANS, check_encode_memory, keep_freed_memory
from ._common import EncodeProgress, add_output_options, plan_outputs, progress_over, read_scene

__all__ = ["PGMS_SUBCOMMANDS"]


def _size(text: str) -> int:
    units = {"k": 1000, "m": 1000**2, "g": 1000**3, "kb": 1000, "mb": 1000**2, "kib": 1024, "mib": 1024**2}
    t = text.strip().lower()
    num = t.rstrip("abgikm")
    unit = t[len(num):]
    try:
        value = float(num) * (units[unit] if unit else 1)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"expected a size like 250000, 250k or 1.5M, got {text!r}") from None
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return int(value)


def _add_max_memory(p) -> None:
    p.add_argument("--max-memory", type=_size, default=None, metavar="BYTES",
                   help="memory a decode may use (suffixes k, M, G; default max(64 MiB, 256 x the file's size): "
                        "a larger need is refused as a decompression bomb; raise it only for files you trust)")


def _up(text: str):
    from ..cameras import CameraError, up_vector

    value = text.strip()
    if "," in value:
        try:
            value = [float(x) for x in value.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected +x,-x,+y,-y,+z,-z or three numbers x,y,z, got {text!r}") from None
    try:
        up_vector(value)
    except CameraError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 like 20, got {text!r}") from None
    if not value >= 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 1 like 20, got {text!r}")
    return value


def _psnr(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected dB like 38, got {text!r}") from None
    if not 0 < value < 150:
        raise argparse.ArgumentTypeError(f"expected dB in (0, 150), got {text!r}")
    return value


def _preset(text: str) -> tuple[float, int]:
    try:
        g_text, a_text = text.split(",")
        g, a = float(g_text), int(a_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two rungs like 4,4 or 14.5,4 (geometry,appearance), got {text!r}") from None
    return (int(g) if g == int(g) else g), a


def _refine_steps(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return nonnegative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 0, got {text!r}") from None


def _add_target(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ratio", type=_ratio, help="target compression ratio against the native-degree float32 .ply (default 20)")
    g.add_argument("--size", type=_size, help="target file size in bytes (suffixes k, M)")
    g.add_argument("--psnr", type=_psnr, help="target PSNR in dB on the contribution views (bisection on size; slower)")
    p.add_argument("--views", type=positive_int, default=None, help="orbit views for contributions at 20 degrees, plus half as many at 45 and at 0 (default: the effort's, 16; 8 at fast)")
    p.add_argument("--view-size", type=positive_int, default=256, help="contribution view size in pixels (default 256)")
    p.add_argument("--coverage-views", type=nonnegative_int, default=None,
                   help="without --cameras: views from every direction (orbit distance and half of it) that also "
                        "count in the contributions and the pruning search, so nothing seen from below or close up "
                        "is pruned (default: the effort's, 16; 8 at fast; 0: off)")
    p.add_argument("--cameras", help="INRIA cameras.json to use instead of orbit views")
    p.add_argument("--up", type=_up, default="-y",
                   help="the scene's up direction for the orbit views: +x,-x,+y,-y,+z,-z or x,y,z (default -y, "
                        "the INRIA/COLMAP convention; +z for z-up captures)")
    p.add_argument("--frame", choices=("scene", "world"), default="scene",
                   help="axes of the views' azimuth and the grouping grid: the scene's own, so a turned or "
                        "rescaled copy encodes alike (default), or the world's (the former encoder)")
    p.add_argument("--device", default=None,
                   help="device for the encoder's renders (cpu, cuda, cuda:N; default: cuda if present; "
                        "cpu gives bit-exact bytes)")
    p.add_argument("--preset", type=_preset, default=None, help="pin the allocator's rungs geometry,appearance (e.g. 4,4)")
    p.add_argument("--refine-steps", type=_refine_steps, default=None,
                   help="render-vs-original refinement steps on the chosen primitives, kept only if they help "
                        "(default auto: 80 on cuts of at most 150k primitives below 48 dB; 0: off, faster)")
    p.add_argument("--prune-search", type=nonnegative_int, default=None,
                   help="pruned variants render-checked against a merged cut (default: the effort's, 3; 0: off, faster)")
    p.add_argument("--effort", choices=("fast", "default", "max"), default="default",
                   help="what the encoder's searches spend: fast (no pruning search, no refinement), default, max")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log the encoder's stages, their results and timings (stderr), one line each")


def _check_target(args, scene) -> None:
    """Refuse, before any work, a ``--size``/``--ratio`` no .pgms of ``scene`` can meet."""
    from ..encoder.compress import reference_ply_bytes
    from ..encoder.guards import check_target
    from ..io import SceneError

    if args.psnr is not None:
        return
    ratio = args.ratio if args.ratio is not None else 20.0
    target = args.size if args.size is not None else int(reference_ply_bytes(scene.num_gaussians, scene.sh_degree) / ratio)
    try:
        check_target(target, scene.sh_degree, args.frame)
    except SceneError as exc:
        asked = f"--size {args.size}" if args.size is not None else f"--ratio {ratio:g} (a {target}-byte file)"
        raise CLIError(f"{asked}: {exc}") from None


def _compress(args, scene, cameras=None):
    """Compress with the target options; ``cameras`` (if given) instead of ``--cameras``."""
    from ..cameras import load_cameras_json
    from ..encoder.compress import compress

    _check_target(args, scene)
    if cameras is None and args.cameras:
        cameras = load_cameras_json(args.cameras, width=args.view_size, height=args.view_size)
    with EncodeProgress(enabled=not args.quiet) as progress:
        return compress(
            scene, ratio=args.ratio, size=args.size, psnr=args.psnr, cameras=cameras, device=args.device,
            num_views=args.views, view_size=args.view_size, coverage_views=args.coverage_views, up=args.up,
            frame=args.frame, preset=args.preset, progress=progress,
            refine_steps=args.refine_steps, prune_search=args.prune_search, effort=args.effort,
        )


# ----------------------------------------------------------------------------- compress


def add_compress_parser(subparsers) -> None:
    p = subparsers.add_parser("compress", help="compress scenes (.ply, .compressed.ply, .splat, .spz, .sog, meta.json, .ksplat) to .pgms",
                              description="Compress 3DGS scenes (INRIA .ply, PlayCanvas .compressed.ply, antimatter15 .splat, "
                                          "Niantic .spz, PlayCanvas .sog or its meta.json folder, GaussianSplats3D "
                                          ".ksplat) to rate-controlled PGMS bitstreams (.pgms).")
    p.add_argument("scene", nargs="+", help="input scenes (.ply, .compressed.ply, .splat, .spz, .sog, meta.json, .ksplat)")
    add_output_options(p, "output .pgms path; with several inputs, a folder (NAME.pgms per input)")
    _add_target(p)
    p.add_argument("--drop-nonfinite", action="store_true", help="drop Gaussians with NaN/Inf values instead of failing")
    p.add_argument("--max-memory", type=_size, default=None, metavar="BYTES",
                   help="memory the encode may use (suffixes k, M, G; default this machine's memory): a scene whose "
                        "estimated peak is larger is refused before any work")
    p.set_defaults(func=cmd_compress)


def cmd_compress(args) -> int:
    from ..render import resolve_device

    pairs = plan_outputs(args.scene, args.out, ".pgms", args.overwrite)  # before any encode
    resolve_device(args.device)  # a bad --device fails before the scene is read
    for inp, out in progress_over(pairs, args.quiet, "compress"):
        scene = read_scene(inp, args.drop_nonfinite)
        check_encode_memory(scene.num_gaussians, scene.sh_degree, args.max_memory)  # one line when it cannot fit
        if scene.num_gaussians <= KEEP_FREED_MEMORY_MAX_GAUSSIANS:
            keep_freed_memory()
        t = time.perf_counter()
        res = _compress(args, scene)
        elapsed = time.perf_counter() - t
        res.save(out)
        g, a = res.preset_index[:2]
        print(f"wrote {out}: {res.nbytes} bytes, {res.ratio:.2f}x vs float32 .ply ({res.reference_bytes} bytes), "
              f"{res.primitives} primitives from {res.input_gaussians} Gaussians, preset {g},{a}, {elapsed:.1f} s")
        # a target missed and a decode above the default budget are the encoder's warnings (stderr)
        if res.clamped_log_scales:
            print(f"note: {res.clamped_log_scales} Gaussians had log-scales outside [-30, 30] and were clamped")
    return 0


# ----------------------------------------------------------------------------- decompress


def add_decompress_parser(subparsers) -> None:
    p = subparsers.add_parser("decompress", help="decode .pgms to .ply, .compressed.ply, .splat, .spz or .sog",
                              description="Decode .pgms bitstreams to a scene file, in the format its name asks for: "
                                          "INRIA .ply (any 3DGS viewer), PlayCanvas .compressed.ply, antimatter15 "
                                          ".splat, Niantic .spz, PlayCanvas .sog (or a meta.json folder).")
    p.add_argument("input", nargs="+", help="input .pgms files")
    add_output_options(p, "output .ply, .compressed.ply, .splat, .spz, .sog or meta.json path; with several "
                          "inputs, a folder "
                          "(NAME.ply per input, NAME.FORMAT with --format)")
    p.add_argument("--format", choices=("ply", "compressed.ply", "splat", "spz", "sog"), default=None,
                   help="output format with several inputs (default ply); one output takes it from its name")
    p.add_argument("--level", type=int, default=None, help="decode only pyramid levels 0..LEVEL (coarser scene)")
    _add_max_memory(p)
    p.set_defaults(func=cmd_decompress)


def cmd_decompress(args) -> int:
    from ..formats import WRITE_FORMATS, format_of, write_any
    from ..pgms.decode import decompress

    if args.level is not None and args.level < 0:
        raise CLIError(f"--level must be >= 0, got {args.level}")
    pairs = plan_outputs(args.input, args.out, "." + (args.format or "ply"), args.overwrite)
    for _inp, out in pairs:
        if format_of(out) not in WRITE_FORMATS:
            raise CLIError(f"output {out}: decompress writes .ply, .compressed.ply, .splat, .spz, .sog or meta.json")
    for inp, out in progress_over(pairs, args.quiet, "decompress"):
        t = time.perf_counter()
        scene = decompress(inp, level=args.level, max_memory=args.max_memory)
        elapsed = time.perf_counter() - t
        write_any(scene, out)
        print(f"wrote {out}: {scene.num_gaussians} Gaussians, SH degree {scene.sh_degree}, decoded in {elapsed:.2f} s")
    return 0


# ----------------------------------------------------------------------------- eval


def add_eval_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="size, ratio, PSNR/SSIM of a compression against the original",
        description="Compare a .pgms (or a compression made now, from the target options) with the original .ply: "
                    "size, ratio against the native-degree float32 .ply, PSNR and SSIM on held-out views (never "
                    "among the encoder's views: seeded views over elevations -30..60 degrees at 0.5-1.3x the orbit "
                    "distance or, with --cameras, every 8th camera, the others going to the encoder), the same on "
                    "some of the encoder's own views (labelled 'seen'), encode and decode time.")
    p.add_argument("scene", help="original scene, INRIA-layout .ply")
    p.add_argument("compressed", nargs="?", help=".pgms to evaluate (default: compress now with the target options)")
    _add_target(p)
    p.add_argument("--eval-views", type=positive_int, default=32,
                   help="held-out views to compare without --cameras (default 32)")
    p.add_argument("--seen-views", type=nonnegative_int, default=8,
                   help="of the encoder's own views, how many to score apart, labelled 'seen' (default 8; 0: none)")
    p.add_argument("--eval-size", type=positive_int, default=512, help="comparison view size in pixels (default 512)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text (printed with -q too)")
    _add_max_memory(p)
    p.set_defaults(func=cmd_eval)


def cmd_eval(args) -> int:
    from ..cameras import load_cameras_json
    from ..encoder.compress import reference_ply_bytes
    from ..evaluation import (
        HOLDOUT_EVERY, HeldoutError, encoder_cameras, evaluate_decoded, heldout_cameras, split_cameras,
    )
    from ..pgms.decode import decompress
    from ..render import resolve_device

    inp = Path(args.scene)
    if not inp.is_file():
        raise CLIError(f"input file {inp} does not exist")
    resolve_device(args.device)  # a bad --device fails before the scene is read
    scene = read_scene(inp)
    train = None
    if args.cameras:  # every 8th camera held out, the encoder gets the others (3DGS convention)
        split = split_cameras(load_cameras_json(args.cameras, width=args.eval_size, height=args.eval_size))
        eval_cams = split.test
        train = load_cameras_json(args.cameras, width=args.view_size, height=args.view_size)[split.train_index]
        where = f"{len(eval_cams)} held-out cameras (every {HOLDOUT_EVERY}th of {args.cameras})"
    else:
        eval_cams = heldout_cameras(scene, num_views=args.eval_views, size=args.eval_size, up=args.up)
        where = f"{len(eval_cams)} held-out views"
    enc_cams = encoder_cameras(scene, train, num_views=args.views, view_size=args.view_size, up=args.up,
                               coverage_views=args.coverage_views, frame=args.frame, effort=args.effort)
    orbit = len(encoder_cameras(scene, train, num_views=args.views, view_size=args.view_size, up=args.up,
                                coverage_views=0, frame=args.frame, effort=args.effort))  # "seen" views come from these
    encode_s = None
    if args.compressed:
        cp = Path(args.compressed)
        if not cp.is_file():
            raise CLIError(f"compressed file {cp} does not exist")
        data = cp.read_bytes()
        if args.cameras:
            where += " (held out if the .pgms was compressed from the other cameras only)"
    else:
        if scene.num_gaussians <= KEEP_FREED_MEMORY_MAX_GAUSSIANS:
            keep_freed_memory()
        t = time.perf_counter()
        data = _compress(args, scene, cameras=train).data
        encode_s = time.perf_counter() - t
    t = time.perf_counter()
    dec = decompress(data, max_memory=args.max_memory)
    decode_s = time.perf_counter() - t
    try:
        rep = evaluate_decoded(scene, dec, eval_cams, enc_cams, seen_views=args.seen_views, seen_from=orbit)
    except HeldoutError as exc:
        raise CLIError(str(exc)) from None
    ref_bytes = reference_ply_bytes(scene.num_gaussians, scene.sh_degree)
    result = {
        "bytes": len(data), "reference_bytes": ref_bytes, "ratio": round(ref_bytes / len(data), 3),
        "psnr_db": round(rep.heldout.psnr, 3), "ssim": round(rep.heldout.ssim, 5),
        "gaussians": scene.num_gaussians, "primitives": dec.num_gaussians,
        "encode_s": None if encode_s is None else round(encode_s, 3), "decode_s": round(decode_s, 3),
        "views": f"{where} at {args.eval_size}x{args.eval_size}",
        "seen": None if rep.seen is None else {"psnr_db": round(rep.seen.psnr, 3), "ssim": round(rep.seen.ssim, 5),
                                               "views": rep.seen.label},
        "min_pose_distance": round(rep.separation, 4),
    }
    if args.json:
        print(json.dumps(result))
    else:
        enc = "" if encode_s is None else f", encode {encode_s:.1f} s"
        print(f"{result['bytes']} bytes, {result['ratio']:.2f}x vs float32 .ply; held-out PSNR {result['psnr_db']:.2f} dB, "
              f"SSIM {result['ssim']:.4f} ({result['views']}); {dec.num_gaussians} primitives"
              f"{enc}, decode {decode_s:.2f} s")
        if rep.seen is not None:
            print(f"  seen by the encoder (not held out): PSNR {rep.seen.psnr:.2f} dB, SSIM {rep.seen.ssim:.4f} "
                  f"({rep.seen.label})")
    return 0


# ----------------------------------------------------------------------------- info


def add_info_parser(subparsers) -> None:
    p = subparsers.add_parser("info", help="header and sections of .pgms files",
                              description="Print each .pgms file's header fields and section sizes (checks every checksum).")
    p.add_argument("input", nargs="+", help="input .pgms files")
    p.add_argument("--json", action="store_true", help="print JSON (one object per line per file; printed with -q too)")
    p.set_defaults(func=cmd_info)


def cmd_info(args) -> int:
    from ..pgms.decode import info

    inputs = [Path(p) for p in args.input]
    for inp in inputs:
        if not inp.is_file():
            raise CLIError(f"input file {inp} does not exist")
    for inp in inputs:
        meta = info(inp)
        if args.json:
            print(json.dumps(meta if len(inputs) == 1 else {"file": str(inp), **meta}))
            continue
        print(f"{inp}: PGMS {meta['version']}, {meta['bytes']} bytes"
              + (f", {meta['ratio']:.2f}x vs float32 .ply" if meta["ratio"] else ""))
        print(f"  {meta['nodes']} coded nodes in {meta['levels']} levels from {meta['source_gaussians']} Gaussians, "
              f"SH degree {meta['sh_degree']}")
        print(f"  prototypes: scale-rotation {meta['shape_codebook']}, appearance {meta['sh_codebook']} "
              f"(degree {meta['sh_codebook_degree']})")
        q = meta["quantizer"]
        print(f"  quantiser: pos_rel {q['pos_rel']:.3g}, dc_step {q['dc_step']:.3g}, ls_step {q['ls_step']:.3g}, "
              f"opacity {q['op_bits']} bits, rotation {q['rot_bits']} bits")
        fr = meta["frame"]
        print("  frame: as given" if fr is None else
              f"  frame: canonical, mapped back by scale {fr['scale']:.6g}, rotation (wxyz) "
              f"{', '.join(f'{v:.4f}' for v in fr['quat'])}, translation {', '.join(f'{v:.6g}' for v in fr['translation'])}")
        for s in meta["sections"]:
            where = "" if s["level"] is None else f" level {s['level']}"
            print(f"  section {s['tag']}{where}: {s['bytes']} bytes")
    return 0


PGMS_SUBCOMMANDS = [add_compress_parser, add_decompress_parser, add_eval_parser, add_info_parser]
