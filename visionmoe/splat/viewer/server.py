"""View a .pgms in the browser: a local HTTP server for the progressive viewer page and
headless-Chromium screenshots of it.

The page (``viewer/index.html`` and one ES module bundling ``web/viewer/viewer.js``, the decoder
in ``web/src/``, three, Spark and fzstd) and the screenshot tool (``tools/screenshot.mjs``, bundled
with puppeteer-core) are package data of :mod:`visionmoe.splat.viewer` (``site/``, built from
``web/`` by setup.py with ``web/tools/bundle.mjs``), so an installed package needs no checkout,
npm or download. The page fetches the file as a stream and shows each pyramid level as soon as
its section has arrived, rendered with Spark (three.js). The server answers HTTP Range requests
for the file and can throttle it (``throttle``: pause after given byte offsets), which the
browser tests use to make the levels arrive one by one.

The server is for this machine's browser only and stays small however long it runs: it answers
a request only when its Host is 127.0.0.1, localhost or [::1] with the server's port (a page of
another site rebinding its name to 127.0.0.1 gets 403), serves nothing but ``site/viewer/`` with
every link resolved inside it, closes a connection idle for ``idle_timeout`` seconds, runs at
most ``max_connections`` handler threads, keeps only the last ``REQUEST_LOG`` requests, and
reports a failed request as one log line (never a traceback).
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import mimetypes
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ...common.files import atomic_path, check_writable

logger = logging.getLogger(__name__)

__all__ = ["NPM_ROOT", "ViewerError", "ViewerServer", "site_root", "serve", "as_format4", "level_offsets",
           "default_camera", "find_chromium", "screenshot"]

# The folder whose tools/screenshot.mjs (the bundled screenshot tool) runs: the package's site/,
# next to the page (the npm packages are inside the bundles; nothing is served from node_modules).
NPM_ROOT = Path(__file__).resolve().parent / "site"
SCENE_PATH = "/scene.pgms"
# the only folder of site/ that is served: the page and its bundle
_SERVED_FOLDERS = ("viewer",)
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")  # the Host names a request may carry
NAME_MAX = 255  # bytes in one path component (longer ones: 404, as the file system would refuse them)
IDLE_TIMEOUT = 10.0  # seconds a connection may stay silent before it is closed
MAX_CONNECTIONS = 32  # connections served at once (a browser opens about 6 per host)
REQUEST_LOG = 64  # recent requests kept for tests
# where the distributions put Chromium (web/tools/browser.mjs looks in the same places)
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


class ViewerError(RuntimeError):
    """The viewer cannot run here (missing Node, npm packages or Chromium); the message says what to do."""


def site_root() -> Path:
    """The folder of the viewer page's files (package data ``visionmoe/splat/viewer/site``, the
    bundle setup.py builds from web/)."""
    site = importlib.resources.files(__package__).joinpath("site")
    try:
        site = Path(os.fspath(site))
    except TypeError:  # a package not on a file system (a zip): the server needs real files
        raise ViewerError(f"the viewer's page needs visionmoe installed as files, not from {site}") from None
    for name in ("index.html", "viewer.js"):
        if not (site / "viewer" / name).is_file():
            raise ViewerError(f"the viewer page is missing: {site / 'viewer' / name} (a source checkout builds it "
                              "with `make build`, which needs Node.js and npm)")
    return site


def check_npm_root(npm_root: Path = NPM_ROOT) -> Path:
    """``npm_root`` if it holds the screenshot tool (``tools/screenshot.mjs``), else ViewerError."""
    npm_root = Path(npm_root)
    tool = npm_root / "tools" / "screenshot.mjs"
    if not tool.is_file():
        raise ViewerError(f"the screenshot tool is missing: {tool} (a source checkout builds it with `make build`, "
                          "which needs Node.js and npm)")
    return npm_root


@dataclass
class _Config:
    pgms: bytes
    site: Path  # viewer/
    throttle: list = field(default_factory=list)  # [(byte offset, seconds to pause after it)]
    chunk: int = 1 << 16
    idle_timeout: float = IDLE_TIMEOUT
    # the last few (path, range header) pairs, for tests: a ring, so a long session keeps no history
    requests: deque = field(default_factory=lambda: deque(maxlen=REQUEST_LOG))


def _byte_range(header: str, size: int) -> tuple[int, int]:
    """An HTTP ``Range: bytes=a-b`` header -> inclusive (start, end); ValueError when unsatisfiable."""
    unit, spec = header.split("=", 1)
    a, b = spec.split("-", 1)
    start = int(a) if a else max(0, size - int(b))
    end = min(int(b), size - 1) if (a and b) else size - 1
    if unit.strip() != "bytes" or start > end or start >= size:
        raise ValueError(header)
    return start, end


def _stream(wfile, data: bytes, throttle, chunk: int) -> None:
    """Write ``data`` in chunks, pausing after each (offset, seconds) stop of ``throttle``."""
    pos = 0
    for offset, pause in [*sorted(throttle), (len(data), 0.0)]:
        offset = min(offset, len(data))
        while pos < offset:
            step = min(chunk, offset - pos)
            wfile.write(data[pos: pos + step])
            pos += step
        wfile.flush()
        if pause and pos < len(data):
            time.sleep(pause)


def _host_allowed(host: str | None, port: int) -> bool:
    """Only the loopback names with this server's port: a page of another site that rebinds its
    own name to 127.0.0.1 (DNS rebinding) sends its name and is refused."""
    host = (host or "").strip().lower()
    return host in {f"{name}:{port}" for name in LOCAL_HOSTS} or (port == 80 and host in LOCAL_HOSTS)


def _static_file(cfg: _Config, url_path: str) -> Path | None:
    """The file a static URL names, or None: only inside the served folders, after every link is
    resolved (a link may point elsewhere in its folder, never out of it)."""
    parts = Path(os.path.normpath(urllib.parse.unquote(url_path).lstrip("/"))).parts
    # normpath keeps a leading '..'
    if not parts or ".." in parts or parts[0] not in _SERVED_FOLDERS:
        return None
    if any(len(p.encode("utf-8", "surrogateescape")) > NAME_MAX for p in parts):
        logger.info("viewer server: not found: a path component over %d bytes", NAME_MAX)
        return None
    root = cfg.site / parts[0]
    try:  # the folder itself may be a link
        root = root.resolve(strict=True)
        target = root.joinpath(*parts[1:]).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a link loop, a NUL byte
        return None
    if not target.is_relative_to(root):
        logger.info("viewer server: refused %s: a link out of the served folder %s", url_path[:200], parts[0])
        return None
    return target if target.is_file() else None


class _Handler(BaseHTTPRequestHandler):
    """One connection; ``cfg`` and ``timeout`` (idle seconds before the connection is dropped)
    are set per server by :func:`_handler`."""

    protocol_version = "HTTP/1.1"
    # headers and body go out in separate writes: with Nagle's algorithm the body of every
    # request after the first on a kept-alive connection waits ~40 ms for the client's delayed ACK
    disable_nagle_algorithm = True
    cfg: _Config

    def log_message(self, fmt, *args):  # the library logs, never prints; one line per request
        logger.debug("viewer server: " + fmt, *args)

    def do_GET(self):  # noqa: N802 (http.server's name)
        if not _host_allowed(self.headers.get("Host"), self.server.server_address[1]):
            logger.warning("viewer server: refused a request for Host %r (only 127.0.0.1, localhost or [::1] "
                           "with port %d)", (self.headers.get("Host") or "")[:100], self.server.server_address[1])
            return self._send(403, b"forbidden host", "text/plain")
        url = urllib.parse.urlsplit(self.path)
        self.cfg.requests.append((url.path[:256], self.headers.get("Range")))
        if url.path in ("/", "/index.html"):
            self.send_response(302)
            self.send_header("Location", f"/viewer/index.html?file={SCENE_PATH}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if url.path == SCENE_PATH:
            return self._scene()
        return self._static(url.path)

    def _send(self, code, body: bytes, ctype: str, extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _static(self, path: str):
        target = _static_file(self.cfg, path)
        try:
            body = target.read_bytes() if target is not None else None
        except OSError as exc:
            logger.info("viewer server: cannot read %s: %s", target, exc.strerror or exc)
            body = None
        if body is None:
            return self._send(404, b"not found", "text/plain")
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if target.suffix in (".js", ".mjs"):
            ctype = "text/javascript"
        self._send(200, body, ctype)

    def _scene(self):
        data = self.cfg.pgms
        rng = self.headers.get("Range")
        if rng:
            try:
                start, end = _byte_range(rng, len(data))
            except ValueError:
                return self._send(416, b"", "application/octet-stream", [("Content-Range", f"bytes */{len(data)}")])
            return self._send(206, data[start: end + 1], "application/octet-stream",
                              [("Content-Range", f"bytes {start}-{end}/{len(data)}"), ("Accept-Ranges", "bytes")])
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        try:
            _stream(self.wfile, data, self.cfg.throttle, self.cfg.chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page stopped reading (a --level view has what it needs)


def _handler(cfg: _Config) -> type[_Handler]:
    return type("ViewerHandler", (_Handler,), {"cfg": cfg, "timeout": cfg.idle_timeout})


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once: the accept loop waits up to
    ``slot_wait`` seconds for a free one, then drops the new connection. With the handlers' idle
    timeout, a client holding connections open cannot pile up threads."""

    daemon_threads = True
    block_on_close = False  # close() does not wait for a client still reading a throttled stream

    def __init__(self, address, handler, max_connections: int, slot_wait: float):
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(max_connections)
        self.max_connections, self.slot_wait = max_connections, slot_wait

    def process_request(self, request, client_address):
        if not self.slots.acquire(timeout=self.slot_wait):
            logger.warning("viewer server: %d connections busy for %.0f s; dropped a new one",
                           self.max_connections, self.slot_wait)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except RuntimeError as exc:  # no thread could be started
            self.slots.release()
            logger.warning("viewer server: dropped a connection: %s", exc)
            self.shutdown_request(request)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):  # one log line, never a traceback on stderr
        exc = sys.exc_info()[1]
        level = logging.DEBUG if isinstance(exc, (ConnectionError, TimeoutError)) else logging.WARNING
        logger.log(level, "viewer server: %s from %s: %s", type(exc).__name__, client_address[0], exc)


class ViewerServer:
    """A running local server (``url`` opens the viewer on the served file); ``close()`` stops it."""

    def __init__(self, httpd: _BoundedServer, cfg: _Config):
        self.httpd, self.cfg = httpd, cfg
        self.port = httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        self.thread.start()

    def page_url(self, **params) -> str:
        q = {"file": SCENE_PATH, **{k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in params.items()}}
        return f"{self.base}/viewer/index.html?{urllib.parse.urlencode(q)}"

    @property
    def requests(self) -> list:
        """The last requests served (path, Range header), at most ``REQUEST_LOG`` of them."""
        return list(self.cfg.requests)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve(pgms: bytes | str | os.PathLike, *, port: int = 0, throttle: list[tuple[int, float]] | None = None,
          idle_timeout: float = IDLE_TIMEOUT, max_connections: int = MAX_CONNECTIONS) -> ViewerServer:
    """Serve the viewer page (``site/viewer/``) and one .pgms on 127.0.0.1 (``port`` 0: any free
    port) to this machine's browser only: requests must name 127.0.0.1, localhost or [::1] with
    the port as their Host (403 otherwise); a connection idle for ``idle_timeout`` seconds is
    closed; at most ``max_connections`` are served at once."""
    data = pgms if isinstance(pgms, (bytes, bytearray)) else Path(pgms).read_bytes()
    cfg = _Config(bytes(data), site_root(), list(throttle or []), idle_timeout=float(idle_timeout))
    httpd = _BoundedServer(("127.0.0.1", port), _handler(cfg), int(max_connections), slot_wait=float(idle_timeout))
    return ViewerServer(httpd, cfg)


def as_format4(data: bytes) -> bytes:
    """A .pgms the browser decoder reads: 4.x and 5.x as they are; 3.x recoded stream by stream with the 4.0
    coders (the same symbols; only the prototype rows decode by 4.0's exact rule, a float32 ulp or
    so apart); 1.x-2.x (other level semantics) raise :class:`ViewerError`."""
    from ..pgms import bitstream as bs

    major, _ = bs.read_preamble(data)
    if major >= 4:
        return bytes(data)
    if major < 3:
        raise ViewerError(f"format {major}.x files cannot be shown in the browser: decompress and compress them again")
    out = [bs.MAGIC + struct.pack("<HH", *bs.VERSION)]
    for sec in bs.iter_sections(data):
        if sec.tag in ("HEAD", "SHQP", "END0"):
            out.append(bs.pack_section(sec.tag, sec.payload, sec.level))
            continue
        parts, pos, p = [], 0, sec.payload
        while pos < len(p):
            kind, _coder, _width, _pad, _n, _alphabet, size = bs.STREAM_HEAD.unpack_from(p, pos)
            chunk = p[pos: pos + bs.STREAM_HEAD.size + size]
            parts.append(bs.encode_ints(bs.StreamReader(chunk, sec.tag).ints("stream")) if kind == bs.KIND_INT else chunk)
            pos += len(chunk)
        out.append(bs.pack_section(sec.tag, b"".join(parts), sec.level))
    return b"".join(out)


def level_offsets(data: bytes) -> list[int]:
    """Byte offset of the end of each LEVL section (a prefix that long decodes that level)."""
    from ..pgms.bitstream import iter_sections

    return [s.offset + 16 + len(s.payload) for s in iter_sections(data) if s.tag == "LEVL"]


def default_camera(data: bytes, level: int | None = None, width: int = 512, height: int = 512) -> dict:
    """The camera of ``visionmoe-splat render --views 1`` for the decoded scene at ``level``, as the
    page's ``camera`` parameter: world-to-camera matrix (row-major, OpenCV axes), fovx, target."""
    from .. import decompress
    from ..cameras import orbit_cameras

    scene = decompress(data, level=level)
    cam = orbit_cameras(scene, 1, width, height)
    return {"viewmat": cam.viewmats[0].double().reshape(-1).tolist(), "fovx": 50.0}


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise ViewerError("screenshots need Node.js (node, version 20 or later) and none was found: install it "
                          "(apt-get install nodejs)")
    return node


def find_chromium() -> str:
    """The Chromium the screenshot tool drives: ``$CHROMIUM``, else the distribution's (never a
    downloaded one)."""
    for cand in (os.environ.get("CHROMIUM"), *CHROMIUM_PATHS, *filter(None, map(shutil.which, CHROMIUM_NAMES))):
        if cand and Path(cand).is_file():
            return str(cand)
    raise ViewerError("screenshots need Chromium and none was found: install it (apt-get install chromium) "
                      "or set CHROMIUM to its path")


def _same_file(a, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except (OSError, TypeError):
        return False


def _run_tool(cmd: list[str], shot: Path, chromium: str, timeout: float, cwd: Path) -> dict:
    """Run the screenshot tool (it writes ``shot``) -> the viewer's report; ViewerError when it fails."""
    env = {**os.environ, "CHROMIUM": chromium}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        raise ViewerError(f"headless Chromium did not finish within {timeout:.0f} s") from None
    if res.returncode != 0:
        lines = [ln for ln in (res.stderr or res.stdout).strip().splitlines() if ln.strip()]
        raise ViewerError(f"screenshot failed: {lines[-1] if lines else f'exit status {res.returncode}'}")
    if shot.stat().st_size == 0:
        raise ViewerError("screenshot failed: headless Chromium wrote no picture")
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ViewerError(f"screenshot failed: the viewer reported {res.stdout.strip()[-200:]!r}") from None


def screenshot(pgms: bytes | str | os.PathLike, out: str | os.PathLike, *, level: int | None = None,
               width: int = 512, height: int = 512, timeout: float = 300.0, npm_root: Path = NPM_ROOT) -> dict:
    """Render the .pgms (levels 0..``level``, default all) in headless Chromium with the default
    camera of ``visionmoe-splat render --views 1`` and write a PNG to ``out`` -> the viewer's
    report (levels shown, bytes, milliseconds).

    ``out`` follows the output rules of :mod:`visionmoe.common.files`, checked before anything
    starts: a regular file or nothing (never a FIFO, link or device), never the input file; the
    tool writes a temporary file in ``out``'s folder that is renamed over ``out`` once complete,
    so the umask sets its permissions and a failure leaves ``out`` as it was."""
    out = check_writable(out)
    if not isinstance(pgms, (bytes, bytearray)) and _same_file(pgms, out):
        raise ViewerError(f"output {out} is the input file; choose another path")
    npm_root = check_npm_root(npm_root)
    node, chromium = _node(), find_chromium()
    data = pgms if isinstance(pgms, (bytes, bytearray)) else Path(pgms).read_bytes()
    cam = default_camera(data, level, width, height)
    params = {"hud": 0, "width": width, "height": height, "camera": cam}
    if level is not None:
        params["level"] = level
    with serve(data) as srv, atomic_path(out, suffix=".png") as shot:
        # the bundled tool runs in its own folder: it gets an absolute path (`out` may be relative)
        cmd = [node, str(npm_root / "tools" / "screenshot.mjs"), "--url", srv.page_url(**params),
               "--out", str(shot.absolute()), "--width", str(width), "--height", str(height),
               "--timeout", str(int(timeout * 1000))]
        return _run_tool(cmd, shot, chromium, timeout, npm_root)
