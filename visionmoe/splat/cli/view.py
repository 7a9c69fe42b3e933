"""``visionmoe-splat view``: a .pgms in the browser, refined level by level as it streams."""

from __future__ import annotations

from pathlib import Path

from ...common.cli import CLIError
from ...common.validators import nonnegative_int, positive_int

__all__ = ["add_view_parser", "cmd_view"]


def add_view_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "view", help="view a .pgms in the browser as it streams (or save a screenshot)",
        description="Serve a .pgms and the progressive viewer page (web/) on 127.0.0.1 and open the browser; "
                    "the page shows the coarsest level as soon as it has arrived and refines level by level. "
                    "With --screenshot, render in headless Chromium with the camera of `render --views 1` instead.")
    p.add_argument("input", help="input .pgms")
    p.add_argument("--port", type=nonnegative_int, default=0, help="port on 127.0.0.1 (default: any free one)")
    p.add_argument("--no-browser", action="store_true", help="only serve; print the address")
    p.add_argument("--screenshot", metavar="OUT.png", help="save a headless-Chromium picture and exit")
    p.add_argument("--level", type=nonnegative_int, default=None, help="with --screenshot: pyramid level (default: finest)")
    p.add_argument("--width", type=positive_int, default=512, help="with --screenshot: width in pixels (default 512)")
    p.add_argument("--height", type=positive_int, default=512, help="with --screenshot: height in pixels (default 512)")
    p.set_defaults(func=cmd_view)


def cmd_view(args) -> int:
    from ..pgms.bitstream import FormatError, read_container
    from ..viewer.server import ViewerError, as_format4, screenshot, serve

    inp = Path(args.input)
    if not inp.is_file():
        raise CLIError(f"input file {inp} does not exist")
    data = inp.read_bytes()
    header = read_container(data)[0]  # a bad file fails here, with the decoder's message
    try:
        data = as_format4(data)  # format 3 files: recoded in memory for the browser decoder
    except ViewerError as exc:
        raise CLIError(str(exc)) from None
    if args.level is not None and args.level >= header.num_levels:
        raise CLIError(f"--level {args.level}: {inp} has levels 0-{header.num_levels - 1}")
    try:
        if args.screenshot:
            out = Path(args.screenshot)
            if not out.parent.exists():
                raise CLIError(f"output folder {out.parent} does not exist")
            report = screenshot(data, out, level=args.level, width=args.width, height=args.height)
            last = report["shown"][-1]
            print(f"wrote {out} ({args.width}x{args.height}, level {last['level']} of 0-{header.num_levels - 1}, "
                  f"{last['count']} splats)")
            return 0
        srv = serve(data, port=args.port)
    except ViewerError as exc:
        raise CLIError(str(exc)) from None
    except FormatError:
        raise
    url = srv.page_url()
    print(f"serving {inp} ({len(data)} bytes, {header.num_levels} levels) at {url}  (Ctrl-C stops)", flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(url)
    try:
        srv.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        srv.close()
    return 0
