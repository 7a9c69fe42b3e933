"""``visionmoe-splat render``: a .ply scene to PNG images."""

from __future__ import annotations

from pathlib import Path

from ...common.cli import CLIError
from ...common.validators import positive_int, rgb
from ._common import add_output_options, read_scene

__all__ = ["add_render_parser", "cmd_render"]


def add_render_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "render",
        help="render a scene (.ply, .compressed.ply, .splat, .spz, .sog, .ksplat, .pgms) to PNG images",
        description="Render a 3DGS scene (INRIA .ply, PlayCanvas .compressed.ply, .splat, .spz, .sog or meta.json, .ksplat, "
                    ".pgms) from orbit views "
                    "(or the cameras of an INRIA cameras.json) to PNGs.",
    )
    p.add_argument("scene", help="input scene (.ply, .compressed.ply, .splat, .spz, .sog, meta.json, .ksplat, .pgms)")
    add_output_options(p, "output folder (created if missing); view_NNN.png in it")
    p.add_argument("--views", type=positive_int, default=8, help="number of orbit views (default 8)")
    p.add_argument("--width", type=positive_int, default=512, help="image width in pixels (default 512)")
    p.add_argument("--height", type=positive_int, default=512, help="image height in pixels (default 512)")
    p.add_argument("--cameras", help="INRIA cameras.json to render instead of orbit views")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda", "gsplat"), default="auto")
    p.add_argument("--device", default="cpu", help="device to load the scene on (cpu, cuda; default cpu)")
    p.add_argument("--background", type=rgb, default=None, help="background colour r,g,b in [0,1] (default black)")
    p.add_argument("--sh-degree", type=int, default=None, help="SH degree to use (default: the scene's)")
    p.add_argument("--fov", type=float, default=50.0, help="orbit horizontal field of view in degrees (default 50)")
    p.add_argument("--elevation", type=float, default=20.0, help="orbit elevation in degrees (default 20)")
    p.add_argument("--up", default="-y", help="world up axis for orbits: +x,-x,+y,-y,+z,-z (default -y)")
    p.add_argument("--drop-nonfinite", action="store_true",
                   help="skip Gaussians whose values are NaN/Inf (or overflow float32) instead of failing")
    p.set_defaults(func=cmd_render)


def cmd_render(args) -> int:
    import imageio.v3 as iio
    import torch

    from ...common.files import atomic_write_bytes
    from ..cameras import load_cameras_json, orbit_cameras
    from ..render import render, resolve_device

    scene_path = Path(args.scene)
    if not scene_path.is_file():
        raise CLIError(f"scene file {scene_path} does not exist")
    out_dir = Path(args.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise CLIError(f"-o {out_dir} exists and is not a folder")
    existing = sorted(out_dir.glob("view_*.png")) if out_dir.is_dir() else []  # what this command writes
    if existing and not args.overwrite:
        raise CLIError(f"{out_dir} already holds {existing[0].name}; use -w/--overwrite to replace the views")
    device = resolve_device(args.device)  # before the scene is read
    scene = read_scene(scene_path, args.drop_nonfinite).to(device)
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
