"""PlayCanvas SOG (version 2): Gaussians as lossless WebP textures plus a ``meta.json``.

Two forms hold the same files: a ``.sog`` is a zip of them (the bundled form), and a folder
whose ``meta.json`` names the textures beside it (the unbundled form). Texel ``i`` of every
texture (row-major, RGBA) belongs to Gaussian ``i``; textures are ``ceil(sqrt(n) / 4) * 4``
texels wide (splat-transform's rule). Each encode rule sits next to its decode rule below:

| texture | channels | meta.json |
|---|---|---|
| ``means_l``, ``means_u`` | low and high byte of x, y, z: ``log(|p| + 1)`` with p's sign, in 16 bits over its range | ``means.mins/maxs`` (of the transformed values) |
| ``quats`` | the three smallest components of the unit quaternion (largest made positive) times sqrt(2), in 8 bits; alpha = 252 + index of the largest | |
| ``scales`` | index of each log-scale in a 256-entry codebook | ``scales.codebook`` |
| ``sh0`` | index of each DC coefficient in a 256-entry codebook; alpha = ``sigmoid(opacity)`` | ``sh0.codebook`` |
| ``shN_labels`` | 16-bit palette entry of the Gaussian's SH bands above 0 (r low, g high) | ``shN.count``, ``shN.bands`` |
| ``shN_centroids`` | the palette: 64 entries a row, one texel per coefficient, r/g/b = codebook index | ``shN.codebook`` |

The writer orders Gaussians along splat-transform's Morton curve, fits the 256-entry codebooks
by optimal 1-D quantisation (a dynamic programme over a 1024-bin histogram), and the SH palette
by k-means (one entry per Gaussian up to 1024, then splat-transform's size rule; from 32768
entries on, a seeded sample of the Gaussians' own SH); the reader decodes as splat-transform
does. Version 1 files (no ``version`` in meta.json) are refused with a clear error.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

from ...common.files import atomic_write_bytes
from ..io import GaussianScene, SceneError
from ._common import morton_order

logger = logging.getLogger(__name__)

__all__ = ["MAX_GAUSSIANS", "is_sog_meta", "read_sog", "sog_bytes", "sog_files", "write_sog"]

MAX_GAUSSIANS = 1 << 26  # far past what one SOG file is used for (WebP itself stops at 16383 x 16383 texels)
MAX_ENTRY_BYTES = 1 << 30  # refuse zip entries that would inflate past this
CODEBOOK = 256
PALETTE_TRAIN = 32768  # rows the SH palette's k-means trains on (a sample of larger scenes)
SH_REST = (0, 3, 8, 15)
_SQRT2 = math.sqrt(2.0)
_OPACITY_EPS = 1e-6
_FILES = {"means": ["means_l.webp", "means_u.webp"], "scales": ["scales.webp"], "quats": ["quats.webp"],
          "sh0": ["sh0.webp"], "shN": ["shN_centroids.webp", "shN_labels.webp"]}


def is_sog_meta(path: str | os.PathLike) -> bool:
    """A file name of the unbundled form: ``meta.json`` or ``*.meta.json`` (not ``lod-meta.json``)."""
    name = Path(path).name.lower()
    return name == "meta.json" or (name.endswith(".meta.json") and not name.endswith("lod-meta.json"))


def texture_size(n: int) -> tuple[int, int]:
    """(width, height) of the per-Gaussian textures: splat-transform's rule."""
    width = max(4, math.ceil(math.sqrt(n) / 4) * 4)
    return width, max(4, math.ceil(n / width / 4) * 4)


# ----------------------------------------------------------------------------- WebP images

def _encode_webp(rgba: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    # exact: keep the RGB of transparent texels (an opacity of 0 is a texel with alpha 0)
    Image.fromarray(np.ascontiguousarray(rgba)).save(buf, "WEBP", lossless=True, exact=True, quality=75, method=4)
    return buf.getvalue()


def _decode_webp(data: bytes, name: str) -> np.ndarray:
    """[H, W, 4] uint8."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format != "WEBP":
                raise SceneError(f"{name}: expected a WebP image, found {im.format}")
            return np.asarray(im.convert("RGBA"))
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise SceneError(f"{name}: not a readable WebP image ({exc})") from None


def _texels(image: np.ndarray, n: int, name: str) -> np.ndarray:
    """The first ``n`` texels [n, 4] of a texture, row-major."""
    flat = image.reshape(-1, 4)
    if len(flat) < n:
        raise SceneError(f"{name}: {image.shape[1]}x{image.shape[0]} texels, too few for {n} Gaussians")
    return flat[:n]


def _texture(columns: list[np.ndarray], n: int, alpha: np.ndarray | None = None) -> np.ndarray:
    """RGBA texture [h, w, 4] holding ``columns`` (3 or 4 uint8 [n]) in its first ``n`` texels;
    alpha is 255 unless a fourth column or ``alpha`` gives it."""
    w, h = texture_size(n)
    out = np.zeros((w * h, 4), np.uint8)
    out[:, 3] = 255
    for c, col in enumerate(columns):
        out[:n, c] = col
    if alpha is not None:
        out[:n, 3] = alpha
    return out.reshape(h, w, 4)


# ----------------------------------------------------------------------------- positions

def _log_transform(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def _inv_log_transform(t: np.ndarray) -> np.ndarray:
    return np.sign(t) * np.expm1(np.abs(t))


def _pack_means(means: np.ndarray) -> tuple[np.ndarray, list[float], list[float]]:
    """uint16 [n, 3] and the per-axis mins/maxs of the log-transformed positions."""
    t = _log_transform(means.astype(np.float64))
    lo, hi = t.min(0), t.max(0)
    span = hi - lo
    q = np.where(span > 0, (t - lo) / np.where(span > 0, span, 1.0), 0.0)
    return np.clip(np.round(q * 65535.0), 0, 65535).astype(np.uint16), lo.tolist(), hi.tolist()


def _unpack_means(lo_tex: np.ndarray, hi_tex: np.ndarray, mins, maxs) -> np.ndarray:
    v = lo_tex[:, :3].astype(np.float64) + 256.0 * hi_tex[:, :3].astype(np.float64)
    mins, maxs = np.asarray(mins, np.float64), np.asarray(maxs, np.float64)
    span = np.where(maxs - mins != 0, maxs - mins, 1.0)  # splat-transform: `maxs - mins || 1`
    return _inv_log_transform(mins + span * (v / 65535.0)).astype(np.float32)


# ----------------------------------------------------------------------------- rotations

_OTHERS = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])  # components stored, by largest (w, x, y, z)


def _pack_quats(quats: np.ndarray) -> np.ndarray:
    """uint8 [n, 4]: the three smaller components of the unit w, x, y, z quaternion (largest
    made positive) times sqrt(2) in 8 bits, then 252 + index of the largest."""
    q = quats.astype(np.float64)
    norm = np.linalg.norm(q, axis=1, keepdims=True)
    q = np.where(norm > 0, q / np.where(norm > 0, norm, 1.0), np.array([1.0, 0, 0, 0]))
    largest = np.argmax(np.abs(q), axis=1)
    rows = np.arange(len(q))
    q = q * np.where(q[rows, largest] < 0, -_SQRT2, _SQRT2)[:, None]
    three = np.take_along_axis(q, _OTHERS[largest], axis=1)
    out = np.empty((len(q), 4), np.uint8)
    out[:, :3] = np.clip(np.round(255.0 * (three * 0.5 + 0.5)), 0, 255)
    out[:, 3] = 252 + largest
    return out


def _unpack_quats(texels: np.ndarray) -> np.ndarray:
    tag = texels[:, 3].astype(np.int64)
    valid = (tag >= 252) & (tag <= 255)
    largest = np.where(valid, tag - 252, 0)
    three = (texels[:, :3].astype(np.float64) / 255.0 * 2.0 - 1.0) / _SQRT2
    q = np.zeros((len(texels), 4))
    np.put_along_axis(q, _OTHERS[largest], three, axis=1)
    q[np.arange(len(q)), largest] = np.sqrt(np.maximum(0.0, 1.0 - (three * three).sum(1)))
    q[~valid] = (1.0, 0.0, 0.0, 0.0)  # splat-transform: an unknown tag reads as no rotation
    return q.astype(np.float32)


# ----------------------------------------------------------------------------- codebooks

def _histogram(x: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(centre, count) of at most ``bins`` bins over x's distinct values, placed half by rank and
    half by value so that both the dense middle and the tails get bins."""
    u, cnt = np.unique(x, return_counts=True)
    cnt = cnt.astype(np.float64)
    if len(u) <= bins:
        return u, cnt
    rank = (np.cumsum(cnt) - cnt) / cnt.sum()
    pos = 0.5 * rank + 0.5 * (u - u[0]) / (u[-1] - u[0])
    b = np.minimum((pos * bins).astype(np.int64), bins - 1)
    count = np.bincount(b, cnt, bins)
    keep = count > 0
    return np.bincount(b, cnt * u, bins)[keep] / count[keep], count[keep]


def _optimal_centres(x: np.ndarray, k: int = CODEBOOK, bins: int = 1024) -> np.ndarray:
    """Ascending centres of the optimal k-segment partition of x's histogram (dynamic programming
    over contiguous bin ranges, squared error weighted by sqrt(count): outliers keep entries)."""
    centre, count = _histogram(x.astype(np.float64), bins)
    w = np.sqrt(count)
    h, k = len(centre), min(k, len(centre))
    pw, px, pxx = (np.concatenate([[0.0], np.cumsum(v)]) for v in (w, w * centre, w * centre * centre))
    a, b = np.arange(h)[:, None], np.arange(h)[None, :]
    sw, sx = pw[b + 1] - pw[a], px[b + 1] - px[a]
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = np.where(b >= a, pxx[b + 1] - pxx[a] - sx * sx / np.where(sw > 0, sw, 1.0), np.inf)  # bins a..b
    cost = np.maximum(cost, 0.0).astype(np.float32)  # float32 halves the memory traffic; argmin is all we need
    best, split = cost[0].copy(), np.zeros((k, h), np.int64)
    for m in range(1, k):  # best[j]: bins 0..j in m + 1 segments; split[m][j]: the last bin of the first m
        total = best[m - 1:-1, None] + cost[m:, m:]  # first m segments end at s (>= m - 1), the last is s+1..j
        i = np.argmin(total, axis=0)
        best = np.full(h, np.inf, np.float32)
        best[m:] = total[i, np.arange(h - m)]
        split[m, m:] = i + m - 1
    out, j = [], h - 1
    for m in range(k - 1, -1, -1):
        s = split[m][j] if m else -1
        out.append((px[j + 1] - px[s + 1]) / (pw[j + 1] - pw[s + 1]))
        j = s
    return np.array(out[::-1])


def _fit_codebook(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """256-entry codebook (ascending, float32, padded with its last entry) and each value's
    index of its nearest entry; 256 or fewer distinct values are kept exactly."""
    x = values.astype(np.float32).reshape(-1)
    centres = np.unique(_optimal_centres(x).astype(np.float32))
    book = np.concatenate([centres, np.full(CODEBOOK - len(centres), centres[-1], np.float32)])
    label = _nearest_in_sorted(centres.astype(np.float64), x.astype(np.float64))
    return book, label.astype(np.uint8).reshape(values.shape)


def _nearest_in_sorted(sorted_book: np.ndarray, x: np.ndarray) -> np.ndarray:
    i = np.clip(np.searchsorted(sorted_book, x), 1, len(sorted_book) - 1) if len(sorted_book) > 1 else \
        np.zeros(len(x), np.int64)
    if len(sorted_book) == 1:
        return i
    left = sorted_book[i - 1]
    return np.where(np.abs(x - left) <= np.abs(sorted_book[i] - x), i - 1, i)


def _lookup(codebook: np.ndarray, labels: np.ndarray, name: str, what: str) -> np.ndarray:
    if labels.size and int(labels.max()) >= len(codebook):
        raise SceneError(f"{name}: {what} index {int(labels.max())} past its {len(codebook)}-entry codebook")
    return codebook[labels]


# ----------------------------------------------------------------------------- opacity

def _pack_opacity(logits: np.ndarray) -> np.ndarray:
    return np.clip(np.round(255.0 / (1.0 + np.exp(-logits.astype(np.float64)))), 0, 255).astype(np.uint8)


def _unpack_opacity(a: np.ndarray) -> np.ndarray:
    p = np.clip(a.astype(np.float64) / 255.0, _OPACITY_EPS, 1 - _OPACITY_EPS)
    return np.log(p / (1 - p)).astype(np.float32)


# ----------------------------------------------------------------------------- SH palette

def palette_size(n: int) -> int:
    """Entries of the SH palette: one per Gaussian up to 1024, then splat-transform's rule (the
    writer keeps at most :data:`PALETTE_TRAIN`: past that, a seeded sample of the Gaussians' own SH)."""
    if n <= 1024:
        return n
    return min(64, 2 ** int(math.floor(math.log2(n / 1024)))) * 1024


def _pack_sh_rest(rest: np.ndarray, iterations: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """rest [n, K, 3] -> (labels uint16 [n], centroid texture [rows, 64 K, 4], codebook [256], entries)."""
    n, k = rest.shape[0], rest.shape[1]
    flat = torch.from_numpy(rest.transpose(0, 2, 1).reshape(n, 3 * k).astype(np.float32))  # channel-major rows
    size = palette_size(n)
    if size >= n:
        centroids, labels = flat.numpy(), np.arange(n)
    else:
        from ..encoder.kmeans import build_codebook
        from ..pgms.prototypes import assign

        if size >= PALETTE_TRAIN:  # k-means on a sample no larger than the palette moves nothing: keep the sample
            pick = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:PALETTE_TRAIN]
            cb = flat[pick]
        else:
            cb = build_codebook(flat, torch.ones(n), size, iters=iterations, max_train=PALETTE_TRAIN, seed=seed)
        labels = assign(flat, cb).numpy()
        centroids = cb.numpy()
    book, idx = _fit_codebook(centroids)  # [m, 3K] codebook indices
    m = len(centroids)
    tex = np.zeros((math.ceil(m / 64) * 64, k, 4), np.uint8)
    tex[..., 3] = 255
    tex[:m, :, :3] = idx.reshape(m, 3, k).transpose(0, 2, 1)
    return labels.astype(np.uint16), tex.reshape(-1, 64 * k, 4), book, m


def _unpack_sh_rest(labels_tex: np.ndarray, centroids: np.ndarray, codebook: np.ndarray, count: int, k: int,
                    name: str) -> np.ndarray:
    if centroids.shape[1] != 64 * k:
        raise SceneError(f"{name}: the shN centroid texture is {centroids.shape[1]} texels wide, "
                         f"expected {64 * k} for {k} coefficients")
    palette = centroids.reshape(-1, k, 4)[:, :, :3]  # [rows * 64, K, 3]
    label = labels_tex[:, 0].astype(np.int64) | (labels_tex[:, 1].astype(np.int64) << 8)
    ok = label < min(count, len(palette))  # splat-transform: a label past the palette reads as no SH
    rest = np.zeros((len(label), k, 3), np.float32)
    rest[ok] = _lookup(codebook, palette[label[ok]], name, "shN")
    return rest


# ----------------------------------------------------------------------------- scene -> files

def sog_files(scene: GaussianScene, *, iterations: int = 10, seed: int = 0, generator: str = "visionmoe") -> dict[str, bytes]:
    """The SOG files of a scene, name -> bytes, ``meta.json`` last."""
    s = scene.to("cpu")
    n = s.num_gaussians
    if n == 0:
        raise SceneError("cannot write SOG: the scene has no Gaussians")
    if n > MAX_GAUSSIANS:
        raise SceneError(f"cannot write SOG: {n} Gaussians, more than the {MAX_GAUSSIANS} a SOG file holds")
    order = torch.from_numpy(morton_order(s.means.detach().numpy()))
    s = s.subset(order)
    f32 = lambda t: t.detach().to(torch.float32).numpy()  # noqa: E731
    means16, mins, maxs = _pack_means(f32(s.means))
    scale_book, scale_idx = _fit_codebook(f32(s.log_scales))
    dc_book, dc_idx = _fit_codebook(f32(s.sh_dc))
    files = {
        "means_l.webp": _encode_webp(_texture([(means16[:, i] & 0xFF).astype(np.uint8) for i in range(3)], n)),
        "means_u.webp": _encode_webp(_texture([(means16[:, i] >> 8).astype(np.uint8) for i in range(3)], n)),
        "quats.webp": _encode_webp(_texture(list(_pack_quats(f32(s.quats)).T), n)),
        "scales.webp": _encode_webp(_texture(list(scale_idx.T), n)),
        "sh0.webp": _encode_webp(_texture(list(dc_idx.T), n, alpha=_pack_opacity(f32(s.opacity_logits)))),
    }
    meta = {"version": 2, "asset": {"generator": generator}, "count": n,
            "means": {"mins": mins, "maxs": maxs, "files": _FILES["means"]},
            "scales": {"codebook": scale_book.tolist(), "files": _FILES["scales"]},
            "quats": {"files": _FILES["quats"]},
            "sh0": {"codebook": dc_book.tolist(), "files": _FILES["sh0"]}}
    if s.sh_degree:
        labels, centroids, book, entries = _pack_sh_rest(f32(s.sh_rest), iterations, seed)
        files["shN_centroids.webp"] = _encode_webp(centroids)
        files["shN_labels.webp"] = _encode_webp(_texture([(labels & 0xFF).astype(np.uint8),
                                                          (labels >> 8).astype(np.uint8), np.zeros(n, np.uint8)], n))
        meta["shN"] = {"count": entries, "bands": s.sh_degree, "codebook": book.tolist(), "files": _FILES["shN"]}
    try:
        files["meta.json"] = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        raise SceneError("cannot write SOG: the scene has NaN/Inf values") from None
    return files


def sog_bytes(scene: GaussianScene, **options) -> bytes:
    """The bundled ``.sog`` (a zip of :func:`sog_files`, entries stored: WebP is already compressed)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in sog_files(scene, **options).items():
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


def write_sog(scene: GaussianScene, path: str | os.PathLike, **options) -> Path:
    """Write ``scene`` as SOG: a ``.sog`` zip, or, for a path named ``meta.json``, the unbundled
    form (the textures beside it, then ``meta.json``); each file written atomically."""
    path = Path(path)
    if not is_sog_meta(path):
        return atomic_write_bytes(path, sog_bytes(scene, **options))
    files = sog_files(scene, **options)
    meta = files.pop("meta.json")
    for name, data in files.items():
        atomic_write_bytes(path.parent / name, data)
    return atomic_write_bytes(path, meta)


# ----------------------------------------------------------------------------- files -> scene

def _bundle_reader(path: Path):
    """name -> bytes over a ``.sog`` zip (entries looked up by name, never extracted)."""
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SceneError(f"{path}: not a SOG bundle (not a readable zip: {exc})") from None
    names = set(z.namelist())
    if "meta.json" not in names:
        z.close()
        raise SceneError(f"{path}: the zip holds no meta.json; not a SOG bundle")

    def get(name: str) -> bytes:
        if name not in names:
            raise SceneError(f"{path}: meta.json names {name!r}, which the bundle does not hold")
        info = z.getinfo(name)
        if info.file_size > MAX_ENTRY_BYTES:
            raise SceneError(f"{path}: {name} inflates to {info.file_size} bytes, more than this reader accepts")
        try:
            return z.read(info)
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
            raise SceneError(f"{path}: {name} is corrupt in the bundle ({exc})") from None

    return get, z.close


def _folder_reader(meta_path: Path):
    """name -> bytes over the files beside ``meta.json`` (plain names only: no way out of the folder)."""
    folder = meta_path.parent

    def get(name: str) -> bytes:
        if name == "meta.json":
            return meta_path.read_bytes()
        if not name or Path(name).name != name or name in (".", ".."):
            raise SceneError(f"{meta_path}: texture name {name!r} is not a plain file name")
        file = folder / name
        if not file.is_file():
            raise SceneError(f"{meta_path}: names {name!r}, which is not in {folder}")
        return file.read_bytes()

    return get, lambda: None


def _field(meta: dict, name: str, *keys: str, kind=list, length: int | None = None):
    v = meta
    for k in keys:
        if not isinstance(v, dict) or k not in v:
            raise SceneError(f"{name}: meta.json lacks {'.'.join(keys)}")
        v = v[k]
    if not isinstance(v, kind) or isinstance(v, bool) or (length is not None and len(v) < length):
        want = f"a list of at least {length}" if length else kind.__name__
        raise SceneError(f"{name}: meta.json {'.'.join(keys)} must be {want}, found {str(v)[:60]!r}")
    return v


def _numbers(values: list, name: str, what: str) -> np.ndarray:
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise SceneError(f"{name}: meta.json {what} must hold numbers") from None
    if out.ndim != 1:
        raise SceneError(f"{name}: meta.json {what} must be a flat list of numbers")
    return out.astype(np.float32) if "codebook" in what else out


def _parse_meta(raw: bytes, name: str) -> dict:
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SceneError(f"{name}: meta.json is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise SceneError(f"{name}: meta.json must hold an object")
    version = meta.get("version")
    if version is None:
        raise SceneError(f"{name}: a version 1 SOG (meta.json without 'version') is not supported; "
                         "convert it with splat-transform to the current version")
    if version != 2:
        raise SceneError(f"{name}: SOG version {version!r} is not supported (expected 2)")
    return meta


def _decode(meta: dict, get, name: str) -> GaussianScene:
    n = _field(meta, name, "count", kind=int)
    if not 0 < n <= MAX_GAUSSIANS:
        raise SceneError(f"{name}: meta.json count {n}; expected 1 to {MAX_GAUSSIANS} Gaussians")

    def tex(*keys: str, index: int = 0) -> np.ndarray:
        file = _field(meta, name, *keys, "files", length=index + 1)[index]
        if not isinstance(file, str):
            raise SceneError(f"{name}: meta.json {'.'.join(keys)}.files must hold file names")
        return _decode_webp(get(file), f"{name}: {file}")

    mins = _numbers(_field(meta, name, "means", "mins", length=3)[:3], name, "means.mins")
    maxs = _numbers(_field(meta, name, "means", "maxs", length=3)[:3], name, "means.maxs")
    means = _unpack_means(_texels(tex("means"), n, name), _texels(tex("means", index=1), n, name), mins, maxs)
    quats = _unpack_quats(_texels(tex("quats"), n, name))
    scales = _texels(tex("scales"), n, name)
    log_scales = _lookup(_numbers(_field(meta, name, "scales", "codebook"), name, "scales.codebook"),
                         scales[:, :3], name, "scales")
    sh0 = _texels(tex("sh0"), n, name)
    dc = _lookup(_numbers(_field(meta, name, "sh0", "codebook"), name, "sh0.codebook"), sh0[:, :3], name, "sh0")
    rest = np.zeros((n, 0, 3), np.float32)
    bands = meta["shN"].get("bands", 0) if isinstance(meta.get("shN"), dict) else 0
    if bands:
        if bands not in (1, 2, 3):
            raise SceneError(f"{name}: meta.json shN.bands {bands!r}; expected 1, 2 or 3")
        count = _field(meta, name, "shN", "count", kind=int)
        book = _numbers(_field(meta, name, "shN", "codebook"), name, "shN.codebook")
        rest = _unpack_sh_rest(_texels(tex("shN", index=1), n, name), tex("shN"), book, count, SH_REST[bands], name)
    t = torch.from_numpy
    return GaussianScene(means=t(means), quats=t(quats), log_scales=t(np.ascontiguousarray(log_scales)),
                         opacity_logits=t(_unpack_opacity(sh0[:, 3])), sh_dc=t(np.ascontiguousarray(dc)),
                         sh_rest=t(rest))


def read_sog(path: str | os.PathLike) -> GaussianScene:
    """Read a PlayCanvas SOG scene: a ``.sog`` bundle or an unbundled ``meta.json`` (version 2).

    Values decode as splat-transform decodes them. Raises :class:`SceneError` on a file that is
    not a zip, a zip without ``meta.json``, a version other than 2, missing or malformed fields,
    missing or unreadable textures, or textures too small for the count.
    """
    path = Path(path)
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    get, close = _folder_reader(path) if is_sog_meta(path) else _bundle_reader(path)
    try:
        return _decode(_parse_meta(get("meta.json"), str(path)), get, str(path))
    finally:
        close()
