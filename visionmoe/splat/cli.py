"""``visionmoe-splat``: command line of visionmoe.splat (also ``python -m visionmoe.splat``).

A thin layer over the library. Each subcommand is one ``add_<name>_parser(subparsers)``
function (registered in ``SUBCOMMANDS``) that sets ``func`` to a ``cmd_<name>(args) -> int``.
Bad input gives one ``visionmoe-splat <command>: error: ...`` line on stderr and exit status 2,
never a traceback; files are written atomically (temporary file + rename).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

EXIT_USAGE = 2


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _rgb(text: str):
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three numbers like 0,0,0 or 1,1,1, got {text!r}") from None
    if len(values) != 3 or not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected three numbers in [0, 1] like 1,1,1, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


# ----------------------------------------------------------------------------- render


def add_render_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "render",
        help="render a .ply scene to PNG images",
        description="Render a 3DGS .ply scene from orbit views (or the cameras of an INRIA cameras.json) to PNGs.",
    )
    p.add_argument("scene", help="input scene, INRIA-layout .ply")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--views", type=_positive_int, default=8, help="number of orbit views (default 8)")
    p.add_argument("--width", type=_positive_int, default=512, help="image width in pixels (default 512)")
    p.add_argument("--height", type=_positive_int, default=512, help="image height in pixels (default 512)")
    p.add_argument("--cameras", help="INRIA cameras.json to render instead of orbit views")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda", "gsplat"), default="auto")
    p.add_argument("--device", default="cpu", help="device to load the scene on (cpu, cuda; default cpu)")
    p.add_argument("--background", type=_rgb, default=None, help="background colour r,g,b in [0,1] (default black)")
    p.add_argument("--sh-degree", type=int, default=None, help="SH degree to use (default: the scene's)")
    p.add_argument("--fov", type=float, default=50.0, help="orbit horizontal field of view in degrees (default 50)")
    p.add_argument("--elevation", type=float, default=20.0, help="orbit elevation in degrees (default 20)")
    p.add_argument("--up", default="-y", help="world up axis for orbits: +x,-x,+y,-y,+z,-z (default -y)")
    p.set_defaults(func=cmd_render)


def cmd_render(args) -> int:
    import imageio.v3 as iio
    import torch

    from .cameras import load_cameras_json, orbit_cameras
    from .io import read_ply
    from .render import render, resolve_device

    scene_path = Path(args.scene)
    if not scene_path.is_file():
        raise CLIError(f"scene file {scene_path} does not exist")
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise CLIError(f"--out {out_dir} exists and is not a folder")
    device = resolve_device(args.device)  # before the scene is read
    scene = read_ply(scene_path).to(device)
    if args.cameras:
        cameras = load_cameras_json(args.cameras, width=args.width, height=args.height)
    else:
        cameras = orbit_cameras(
            scene, args.views, args.width, args.height, fov_deg=args.fov, elevation_deg=args.elevation, up=args.up
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    for i in range(len(cameras)):
        with torch.no_grad():
            out = render(scene, cameras[i], backend=args.backend, background=args.background, sh_degree=args.sh_degree)
        image = (out.colors[0].clamp(0, 1) * 255 + 0.5).to(torch.uint8).cpu().numpy()
        path = atomic_write_bytes(out_dir / f"view_{i:03d}.png", iio.imwrite("<bytes>", image, extension=".png"))
        print(f"wrote {path} ({cameras.width}x{cameras.height}, {scene.num_gaussians} Gaussians)")
    return 0


# ----------------------------------------------------------------------------- entry point

# Subcommand registrars, in the order `--help` lists them.
SUBCOMMANDS = [add_render_parser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="visionmoe-splat", description="PGMS tools for 3D Gaussian splatting scenes (visionmoe.splat)."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from .cli_pgms import PGMS_SUBCOMMANDS  # compress, decompress, eval, info (imports this module)

    for register in [*SUBCOMMANDS, *PGMS_SUBCOMMANDS]:
        register(subparsers)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    from ..ops import ExtensionNotBuiltError
    from .cameras import CameraError
    from .io import SceneError
    from .render import RenderError

    return (CLIError, SceneError, CameraError, RenderError, ExtensionNotBuiltError, ValueError, OSError)


# Scenes up to this size are encoded with ``keep_freed_memory``: the 2M-Gaussian SH3 synthetic
# scene at 20x peaked at 7.89 GB with it (budget 8 GB) and 6.81 GB without, in the same time.
KEEP_FREED_MEMORY_MAX_GAUSSIANS = 1_000_000


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to serve large blocks from the heap and keep freed memory for reuse
    (``M_MMAP_MAX`` 0, ``M_TRIM_THRESHOLD`` 2 GB) instead of mapping fresh, zeroed pages for
    every large array: the encoder allocates and frees arrays of the scene's size thousands of
    times. Playbot at 20x in a fresh process: 1.3M page faults -> 0.45M, 27 -> 22 s of encoding
    (peak RSS +10-30%). Process-wide, so only the command line (and the benchmarks, to time what
    it does) call it. -> whether it applied."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 success, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors: argparse prints one line and exits 2
    try:
        return int(args.func(args) or 0)
    except _user_errors() as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"visionmoe-splat {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"visionmoe-splat {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
