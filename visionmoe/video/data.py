"""Training data for PILA: manifests, video decoding, and a cache of VAE latents and text embeddings.

Sources (:func:`load_records`):

- a JSONL manifest, one object per line::

      {"video": "clips/0001.mp4", "caption": "a ball falls and bounces",
       "labels": ["rigid", "elastic"], "fps": 16, "start": 0.5, "end": 3.0}

  ``video`` (alias ``path``) is resolved relative to the manifest's folder; ``caption``
  (alias ``prompt``/``text``) is required; ``labels`` (a list or a comma-separated string
  of our categories or WISA / PhyGenBench / VideoPhy-2 names) is optional (missing labels
  come from the caption's lexicon classifier); ``fps`` resamples the clip in time,
  ``start``/``end`` (seconds) trim it.
- a folder of videos with a caption file of the same stem (``clip.mp4`` + ``clip.txt``),
  and optionally ``clip.labels`` (comma-separated labels).

Decoding (:func:`decode_video`): imageio (ffmpeg), optional trim and fps resampling, the
first ``num_frames`` frames (Wan's 4k+1 rule), shorter-side resize and centre crop.

Cache (:func:`build_cache`, :class:`LatentCache`): encodes each clip once with the Wan VAE
(latents normalised like the Wan pipeline: ``(z - latents_mean) / latents_std``) and its
caption with the pipeline's text encoder, into ``safetensors`` shards plus
``cache.json`` (configuration, shards, skipped videos). Building is resumable: finished
shards are kept and their clips skipped. Unreadable or too-short videos are logged,
recorded in ``cache.json`` and skipped; the count is returned.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

logger = logging.getLogger(__name__)

VIDEO_EXTENSIONS = (".mp4", ".webm", ".avi", ".mov", ".mkv", ".gif")
CACHE_VERSION = 1


class ManifestError(ValueError):
    """A dataset manifest or folder that cannot be used (says where and what to fix)."""


class VideoDecodeError(RuntimeError):
    """A video that cannot be decoded, or is too short for the requested frames."""


@dataclass
class VideoRecord:
    video: str  # absolute path
    caption: str
    labels: List[str] = field(default_factory=list)  # our category names (empty: classify the caption)
    fps: Optional[float] = None
    start: Optional[float] = None
    end: Optional[float] = None
    extra: Dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.video}|{self.start}|{self.end}|{self.fps}"


def wan_num_frames(n: int) -> int:
    """Largest 4k+1 frame count not above ``n`` (Wan's temporal VAE rule); 0 if ``n < 1``."""
    return 0 if n < 1 else ((n - 1) // 4) * 4 + 1


def check_num_frames(n: int) -> None:
    if n < 1 or (n - 1) % 4 != 0:
        raise ValueError(f"num_frames must be 4k+1 (Wan's temporal VAE rule), e.g. 17, 33, 81; got {n}")


def normalize_labels(labels, where: str = "") -> List[str]:
    """Labels (list or comma string; ours or benchmark names) -> sorted unique category names."""
    from .taxonomy import map_external

    if labels is None:
        return []
    if isinstance(labels, str):
        labels = [s for s in labels.replace("+", ",").split(",") if s.strip()]
    if not isinstance(labels, (list, tuple)):
        raise ManifestError(f"{where}labels must be a list or a comma-separated string, got {type(labels).__name__}")
    out = set()
    for lab in labels:
        try:
            out.update(map_external(str(lab)))
        except ValueError as e:
            raise ManifestError(f"{where}{e}") from None
    return sorted(out)


def label_mask(labels: Sequence[str], caption: str) -> torch.Tensor:
    """Multi-hot [num_categories] of the labels, or of the caption's lexicon prior when no labels."""
    from .labels import classify_prompt
    from .taxonomy import CATEGORY_NAMES

    if labels:
        return torch.tensor([float(n in labels) for n in CATEGORY_NAMES])
    return classify_prompt(caption).mask.float()


def _opt_float(rec, key, where):
    v = rec.get(key)
    if v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise ManifestError(f"{where}'{key}' must be a number, got {v!r}") from None
    if v < 0 or (key == "fps" and v == 0):
        raise ManifestError(f"{where}'{key}' must be positive, got {v}")
    return v


def read_manifest(path: str, *, check_files: bool = True) -> List[VideoRecord]:
    """Read a JSONL manifest (see the module docstring). Raises :class:`ManifestError` naming the
    line for malformed entries and, with ``check_files``, ``FileNotFoundError`` listing missing videos."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"manifest not found: {path}")
    root = os.path.dirname(os.path.abspath(path))
    records, missing = [], []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{i}: "
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ManifestError(f"{where}not valid JSON ({e.msg}); each line must be one JSON object") from None
            if not isinstance(rec, dict):
                raise ManifestError(f"{where}expected a JSON object, got {type(rec).__name__}")
            video = rec.get("video", rec.get("path"))
            if not video or not isinstance(video, str):
                raise ManifestError(f"{where}missing 'video' (path of the clip); fields present: {sorted(rec)}")
            caption = rec.get("caption", rec.get("prompt", rec.get("text")))
            if caption is not None and not isinstance(caption, str):
                raise ManifestError(f"{where}'caption' must be text, got {type(caption).__name__} {caption!r}")
            if not caption or not caption.strip():
                raise ManifestError(f"{where}missing 'caption' (non-empty text); fields present: {sorted(rec)}")
            vpath = video if os.path.isabs(video) else os.path.join(root, video)
            start, end = _opt_float(rec, "start", where), _opt_float(rec, "end", where)
            if start is not None and end is not None and end <= start:
                raise ManifestError(f"{where}'end' ({end}) must be after 'start' ({start})")
            records.append(VideoRecord(
                video=os.path.normpath(vpath), caption=caption.strip(),
                labels=normalize_labels(rec.get("labels"), where), fps=_opt_float(rec, "fps", where),
                start=start, end=end,
                extra={k: v for k, v in rec.items() if k not in ("video", "path", "caption", "prompt", "text", "labels", "fps", "start", "end")},
            ))
            if check_files and not os.path.isfile(vpath):
                missing.append(f"line {i}: {video}")
    if not records:
        raise ManifestError(f"{path}: the manifest lists no videos")
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise FileNotFoundError(f"{len(missing)} video(s) of {path} not found: {'; '.join(missing[:5])}{more}")
    return records


def scan_folder(folder: str) -> List[VideoRecord]:
    """Videos of a folder with same-stem ``.txt`` captions (and optional ``.labels``)."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"dataset folder not found: {folder}")
    names = sorted(f for f in os.listdir(folder) if f.lower().endswith(VIDEO_EXTENSIONS))
    if not names:
        raise ManifestError(f"{folder}: no videos ({', '.join(VIDEO_EXTENSIONS)})")
    records, uncaptioned = [], []
    for name in names:
        stem = os.path.splitext(os.path.join(folder, name))[0]
        if not os.path.isfile(stem + ".txt"):
            uncaptioned.append(name)
            continue
        caption = open(stem + ".txt", encoding="utf-8").read().strip()
        if not caption:
            uncaptioned.append(name)
            continue
        labels = open(stem + ".labels", encoding="utf-8").read().strip() if os.path.isfile(stem + ".labels") else None
        records.append(VideoRecord(os.path.abspath(os.path.join(folder, name)), caption,
                                   normalize_labels(labels, f"{stem}.labels: ")))
    if uncaptioned:
        raise ManifestError(f"{folder}: {len(uncaptioned)} video(s) without a caption file (same name, .txt): "
                            f"{', '.join(uncaptioned[:5])}")
    return records


def load_records(source: str) -> List[VideoRecord]:
    """A manifest (``.jsonl``/``.json`` file) or a folder of captioned videos."""
    if os.path.isdir(source):
        return scan_folder(source)
    return read_manifest(source)


# ---------------------------------------------------------------------------------------
# decoding


def _resize_crop(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    import cv2

    h, w = frame.shape[:2]
    s = max(height / h, width / w)
    nh, nw = max(height, round(h * s)), max(width, round(w * s))
    interp = cv2.INTER_AREA if s < 1 else cv2.INTER_CUBIC
    frame = cv2.resize(frame, (nw, nh), interpolation=interp)
    y0, x0 = (nh - height) // 2, (nw - width) // 2
    return frame[y0:y0 + height, x0:x0 + width]


def decode_video(path: str, num_frames: int, height: int, width: int, *, fps: Optional[float] = None,
                 start: Optional[float] = None, end: Optional[float] = None) -> np.ndarray:
    """Decode ``num_frames`` frames (uint8 ``[F, H, W, 3]``) of a video, trimmed, resampled to
    ``fps`` (if given), resized on the shorter side and centre-cropped to ``height x width``.
    Raises :class:`VideoDecodeError` for unreadable or too short videos."""
    import imageio.v2 as imageio

    check_num_frames(num_frames)
    try:
        reader = imageio.get_reader(path, format="FFMPEG")
        try:
            src_fps = float(reader.get_meta_data().get("fps") or 0) or None
            frames = [np.asarray(f) for f in reader]
        finally:
            reader.close()
    except Exception as e:
        first = next((l.strip() for l in str(e).splitlines() if l.strip()), "")  # not ffmpeg's whole log
        raise VideoDecodeError(f"cannot decode {path}: {type(e).__name__}: {first}") from None
    if not frames:
        raise VideoDecodeError(f"cannot decode {path}: no frames")
    if (start is not None or end is not None or fps is not None) and src_fps is None:
        raise VideoDecodeError(f"{path}: no frame rate in the file, cannot apply start/end/fps")
    times = np.arange(len(frames)) / (src_fps or 1.0)
    idx = np.arange(len(frames))
    if start is not None or end is not None:
        lo, hi = start or 0.0, end if end is not None else np.inf
        idx = idx[(times >= lo - 1e-6) & (times < hi - 1e-6)]
    if fps is not None and src_fps is not None and len(idx):
        t0 = times[idx[0]]
        want = t0 + np.arange(int(np.floor((times[idx[-1]] - t0) * fps + 1e-6)) + 1) / fps
        idx = np.clip(np.searchsorted(times, want - 0.5 / src_fps), idx[0], idx[-1])
    if len(idx) < num_frames:
        raise VideoDecodeError(f"{path}: {len(idx)} frames after trim/resampling, need {num_frames}")
    out = []
    for i in idx[:num_frames]:
        f = frames[i]
        if f.ndim == 2:
            f = np.repeat(f[..., None], 3, -1)
        out.append(_resize_crop(f[..., :3], height, width))
    return np.stack(out)


def frames_to_tensor(frames: np.ndarray) -> torch.Tensor:
    """uint8 [F, H, W, 3] -> float [3, F, H, W] in [-1, 1] (the Wan VAE input)."""
    return torch.from_numpy(frames).permute(3, 0, 1, 2).float().div(127.5).sub(1.0)


# ---------------------------------------------------------------------------------------
# encoding and the latent cache


def vae_normalization(vae) -> tuple:
    """(mean, inv_std) [1, C, 1, 1, 1] of the Wan VAE config (identity when absent)."""
    C = vae.config.z_dim
    mean = getattr(vae.config, "latents_mean", None)
    std = getattr(vae.config, "latents_std", None)
    mean = torch.tensor(mean).view(1, C, 1, 1, 1) if mean is not None else torch.zeros(1, C, 1, 1, 1)
    inv = 1.0 / torch.tensor(std).view(1, C, 1, 1, 1) if std is not None else torch.ones(1, C, 1, 1, 1)
    return mean, inv


@torch.no_grad()
def encode_videos(vae, pixels: torch.Tensor) -> torch.Tensor:
    """[B, 3, F, H, W] in [-1, 1] -> normalised latents [B, C, f, h, w] (posterior mean)."""
    p = next(vae.parameters())
    z = vae.encode(pixels.to(p.device, p.dtype)).latent_dist.mode()
    mean, inv = vae_normalization(vae)
    return ((z.float() - mean.to(z.device)) * inv.to(z.device)).cpu()


@torch.no_grad()
def encode_captions(pipe, captions: Sequence[str], max_sequence_length: int) -> List[torch.Tensor]:
    """Captions -> list of [n_i, D] text embeddings (Wan's prompt encoding, padding removed)."""
    emb = pipe._get_t5_prompt_embeds(list(captions), max_sequence_length=max_sequence_length,
                                     device=next(pipe.text_encoder.parameters()).device)
    out = []
    for e in emb.float().cpu():
        n = int((e.abs().sum(-1) > 0).sum().item())
        out.append(e[: max(n, 1)].clone())
    return out


@dataclass
class CacheConfig:
    num_frames: int = 17
    height: int = 64
    width: int = 64
    max_sequence_length: int = 512  # WanPipeline pads prompts to 512 tokens: train as inference runs
    model: str = ""  # identifies the VAE / text encoder the cache was made with

    def __post_init__(self):
        check_num_frames(self.num_frames)
        if self.height < 16 or self.width < 16 or self.height % 16 or self.width % 16:
            raise ValueError(f"height and width must be positive multiples of 16; got {self.height}x{self.width}")
        if self.max_sequence_length < 1:
            raise ValueError(f"max_sequence_length must be >= 1; got {self.max_sequence_length}")


@dataclass
class CacheReport:
    cached: int
    skipped: int
    already_cached: int
    skipped_videos: List[Dict]
    path: str


def _cache_index_path(cache_dir):
    return os.path.join(cache_dir, "cache.json")


def _write_json_atomic(path, obj):
    tmp = path + ".part"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)


def build_cache(records: Sequence[VideoRecord], pipe, cache_dir: str, config: CacheConfig, *, shard_size: int = 64,
                batch_size: int = 1, progress: bool = True,
                callback: Optional[Callable[[int, int], None]] = None) -> CacheReport:
    """Encode every record once into ``cache_dir`` (resumable). ``pipe`` provides ``vae``,
    ``text_encoder``, ``tokenizer`` (a Wan pipeline). Unreadable videos are skipped and reported."""
    from safetensors.torch import save_file

    os.makedirs(cache_dir, exist_ok=True)
    index_path = _cache_index_path(cache_dir)
    cfg = asdict(config)
    if os.path.isfile(index_path):
        index = json.load(open(index_path))
        if index.get("version") != CACHE_VERSION or index.get("config") != cfg:
            raise ValueError(f"{cache_dir} holds a cache made with other settings {index.get('config')} "
                             f"(now {cfg}); use another cache folder or delete it")
    else:
        index = {"version": CACHE_VERSION, "config": cfg, "shards": [], "skipped": []}
    done = {k for s in index["shards"] for k in s["keys"]}
    done |= {s["key"] for s in index["skipped"]}
    todo = [r for r in records if r.key not in done]
    already = len(records) - len(todo)
    it = todo
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="caching latents", unit="clip")
    lat_buf, txt_buf, meta_buf = [], [], []
    n_cached = 0
    n_skipped_before = len(index["skipped"])

    def flush():
        if not lat_buf:
            return
        sid = len(index["shards"])
        name = f"shard_{sid:05d}.safetensors"
        tensors = {}
        for j, (lat, txt) in enumerate(zip(lat_buf, txt_buf)):
            tensors[f"{j}.latents"] = lat.contiguous()
            tensors[f"{j}.text"] = txt.contiguous()
        tmp = os.path.join(cache_dir, name + ".part")
        save_file(tensors, tmp, metadata={"format": "pt"})
        os.replace(tmp, os.path.join(cache_dir, name))
        index["shards"].append({"file": name, "keys": [m["key"] for m in meta_buf], "items": list(meta_buf)})
        _write_json_atomic(index_path, index)
        lat_buf.clear(), txt_buf.clear(), meta_buf.clear()

    i = 0
    while i < len(it):
        batch = []
        while len(batch) < batch_size and i < len(it):
            r = it[i]
            i += 1
            try:
                fr = decode_video(r.video, config.num_frames, config.height, config.width, fps=r.fps, start=r.start, end=r.end)
                batch.append((r, frames_to_tensor(fr)))
            except (VideoDecodeError, OSError) as e:
                logger.warning("skipping %s: %s", r.video, e)
                index["skipped"].append({"key": r.key, "video": r.video, "error": str(e)})
                _write_json_atomic(index_path, index)
                if bar is not None:
                    bar.update(1)
        if not batch:
            continue
        lats = encode_videos(pipe.vae, torch.stack([b[1] for b in batch]))
        txts = encode_captions(pipe, [b[0].caption for b in batch], config.max_sequence_length)
        for (r, _), lat, txt in zip(batch, lats, txts):
            lat_buf.append(lat)
            txt_buf.append(txt)
            meta_buf.append({"key": r.key, "video": r.video, "caption": r.caption, "labels": r.labels,
                             "label_mask": label_mask(r.labels, r.caption).tolist()})
            n_cached += 1
            if len(lat_buf) >= shard_size:
                flush()
        if bar is not None:
            bar.update(len(batch))
        if callback is not None:
            callback(already + n_cached + len(index["skipped"]) - n_skipped_before, len(records))
    flush()
    if bar is not None:
        bar.close()
    skipped_now = index["skipped"][n_skipped_before:]
    if skipped_now:
        logger.warning("%d video(s) could not be read and were skipped (listed in %s)", len(skipped_now), index_path)
    return CacheReport(n_cached, len(skipped_now), already, skipped_now, cache_dir)


class LatentCache(torch.utils.data.Dataset):
    """The cached dataset: item ``i`` is a dict with ``latents`` [C, f, h, w], ``text`` [n, D],
    ``labels`` [num_categories] (multi-hot) and ``caption``."""

    def __init__(self, cache_dir: str):
        index_path = _cache_index_path(cache_dir)
        if not os.path.isfile(index_path):
            raise FileNotFoundError(f"no latent cache in {cache_dir} (missing cache.json); build it with "
                                    f"visionmoe.video.data.build_cache or scripts/train_pila.py --data ...")
        self.dir = cache_dir
        self.index = json.load(open(index_path))
        self.config = self.index["config"]
        self.items = [(s["file"], j, m) for s in self.index["shards"] for j, m in enumerate(s["items"])]
        if not self.items:
            raise ValueError(f"the latent cache in {cache_dir} is empty ({len(self.index['skipped'])} video(s) skipped)")
        self._open: Dict[str, object] = {}

    def __len__(self):
        return len(self.items)

    def _shard(self, name):
        from safetensors import safe_open

        if name not in self._open:
            self._open[name] = safe_open(os.path.join(self.dir, name), framework="pt")
        return self._open[name]

    def __getitem__(self, i):
        name, j, meta = self.items[i]
        f = self._shard(name)
        return {"latents": f.get_tensor(f"{j}.latents"), "text": f.get_tensor(f"{j}.text"),
                "labels": torch.tensor(meta["label_mask"], dtype=torch.float32), "caption": meta["caption"], "index": i}

    def __getstate__(self):  # picklable for DataLoader workers
        d = dict(self.__dict__)
        d["_open"] = {}
        return d


def collate(items: List[Dict], text_length: Optional[int] = None) -> Dict:
    """Stack latents/labels; zero-pad text embeddings to ``text_length`` tokens (WanPipeline pads
    every prompt to ``max_sequence_length``, and the padded positions take part in the
    transformer's cross-attention, so training must see the same length as inference), or to
    the longest in the batch when None."""
    n = max(it["text"].shape[0] for it in items)
    n = max(n, text_length or 0)
    text = torch.stack([torch.cat([it["text"], it["text"].new_zeros(n - it["text"].shape[0], it["text"].shape[1])])
                        for it in items])
    return {"latents": torch.stack([it["latents"] for it in items]), "text": text,
            "labels": torch.stack([it["labels"] for it in items]), "caption": [it["caption"] for it in items],
            "index": torch.tensor([it["index"] for it in items])}
