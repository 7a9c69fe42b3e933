"""``visionmoe-splat view``: a .pgms in the browser, refined level by level as it streams."""

from __future__ import annotations

from pathlib import Path

from ...common.cli import CLIError
from ...common.validators import nonnegative_int, positive_int
from ._common import plan_outputs

__all__ = ["add_view_parser", "cmd_view"]


def add_view_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "view", help="view a .pgms in the browser as it streams (or save a screenshot)",
        description="Serve a .pgms and the progressive viewer page on 127.0.0.1 and open the browser; "
                    "the page shows the coarsest level as soon as it has arrived and refines level by level. "
                    "Only this machine's browser is answered (Host 127.0.0.1, localhost or [::1]). "
                    "With --screenshot, render in headless Chromium with the camera of `render --views 1` instead: "
                    "that needs Node.js 20+ (apt-get install nodejs), Chromium (apt-get install chromium, or "
                    "CHROMIUM=/path/to/it) and the npm packages of a source checkout's web/ (npm ci).")
    p.add_argument("input", help="input .pgms")
    p.add_argument("--port", type=nonnegative_int, default=0, help="port on 127.0.0.1 (default: any free one)")
    p.add_argument("--no-browser", action="store_true", help="only serve; print the address")
    p.add_argument("--screenshot", metavar="OUT.png",
                   help="save a headless-Chromium picture and exit (needs Node.js and Chromium)")
    p.add_argument("-w", "--overwrite", action="store_true", help="with --screenshot: replace an existing OUT.png")
    p.add_argument("--level", type=nonnegative_int, default=None, help="with --screenshot: pyramid level (default: finest)")
    p.add_argument("--width", type=positive_int, default=512, help="with --screenshot: width in pixels (default 512)")
    p.add_argument("--height", type=positive_int, default=512, help="with --screenshot: height in pixels (default 512)")
    p.set_defaults(func=cmd_view)


def cmd_view(args) -> int:
    from ..pgms.bitstream import read_container
    from ..viewer.server import ViewerError, as_format4, screenshot, serve

    inp = Path(args.input)
    # the output's rules first, before anything is read or started: a regular file or nothing,
    # not the input, not replaced without -w, in a folder that accepts a new file
    out = plan_outputs([str(inp)], args.screenshot, ".png", args.overwrite)[0][1] if args.screenshot else None
    if not inp.is_file():
        raise CLIError(f"input file {inp} does not exist")
    data = inp.read_bytes()
    header = read_container(data)[0]  # a bad file fails here, with the decoder's message
    if args.level is not None and args.level >= header.num_levels:
        raise CLIError(f"--level {args.level}: {inp} has levels 0-{header.num_levels - 1}")
    try:
        data = as_format4(data)  # format 3 files: recoded in memory for the browser decoder
        if out is not None:
            report = screenshot(data, out, level=args.level, width=args.width, height=args.height)
            last = report["shown"][-1]
            if not getattr(args, "quiet", False):
                print(f"wrote {out} ({args.width}x{args.height}, level {last['level']} of 0-{header.num_levels - 1}, "
                      f"{last['count']} splats)")
            return 0
        srv = serve(data, port=args.port)
    except ViewerError as exc:
        raise CLIError(str(exc)) from None
    _serve_until_interrupted(srv, inp, len(data), header.num_levels, args.no_browser)
    return 0


def _serve_until_interrupted(srv, inp: Path, size: int, levels: int, no_browser: bool) -> None:
    url = srv.page_url()
    print(f"serving {inp} ({size} bytes, {levels} levels) at {url}  (Ctrl-C stops)", flush=True)
    if not no_browser:
        import webbrowser

        webbrowser.open(url)
    try:
        srv.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        srv.close()
