"""The latent cache of PILA's training data: each clip encoded once with the Wan VAE (latents
normalised like the Wan pipeline: ``(z - latents_mean) / latents_std``) and its caption with
the pipeline's text encoder, into ``safetensors`` shards plus ``cache.json`` (configuration,
shards, skipped videos). Building (:func:`build_cache`) is resumable: finished shards are kept
and their clips skipped. Unreadable or too-short videos are logged, recorded in ``cache.json``
and skipped; the count is returned. :class:`LatentCache` reads it back, :func:`collate` batches it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ...common.files import atomic_path, atomic_write_text
from ..hooks._common import wan_latent_stats
from .manifest import VideoRecord, check_num_frames, label_mask
from .video import VideoDecodeError, decode_video, frames_to_tensor

logger = logging.getLogger(__name__)

CACHE_VERSION = 1


# ---------------------------------------------------------------------------------------
# encoding and the latent cache


def vae_normalization(vae) -> tuple:
    """(mean, inv_std) [1, C, 1, 1, 1] of the Wan VAE config (identity when absent)."""
    mean, std = wan_latent_stats(vae)
    return mean, 1.0 / std


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


def _open_index(cache_dir: str, config: CacheConfig) -> dict:
    """The cache's index (``cache.json``), or a new one; a cache made with other settings is refused."""
    index_path = _cache_index_path(cache_dir)
    cfg = asdict(config)
    if os.path.isfile(index_path):
        index = json.load(open(index_path))
        if index.get("version") != CACHE_VERSION or index.get("config") != cfg:
            raise ValueError(f"{cache_dir} holds a cache made with other settings {index.get('config')} "
                             f"(now {cfg}); use another cache folder or delete it")
    else:
        index = {"version": CACHE_VERSION, "config": cfg, "shards": [], "skipped": []}
    return index


def build_cache(records: Sequence[VideoRecord], pipe, cache_dir: str, config: CacheConfig, *, shard_size: int = 64,
                batch_size: int = 1, progress: bool = True,
                callback: Optional[Callable[[int, int], None]] = None) -> CacheReport:
    """Encode every record once into ``cache_dir`` (resumable). ``pipe`` provides ``vae``,
    ``text_encoder``, ``tokenizer`` (a Wan pipeline). Unreadable videos are skipped and reported."""
    from safetensors.torch import save_file

    os.makedirs(cache_dir, exist_ok=True)
    index_path = _cache_index_path(cache_dir)
    index = _open_index(cache_dir, config)
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
        with atomic_path(os.path.join(cache_dir, name), suffix=".safetensors") as tmp:
            save_file(tensors, str(tmp), metadata={"format": "pt"})
        index["shards"].append({"file": name, "keys": [m["key"] for m in meta_buf], "items": list(meta_buf)})
        atomic_write_text(index_path, json.dumps(index, indent=1))
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
                atomic_write_text(index_path, json.dumps(index, indent=1))
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
                                    f"visionmoe.video.data.cache.build_cache or scripts/train_pila.py --data ...")
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
