"""Dataset manifests, folders, decoding (trim, fps, resize/crop, 4k+1) and the resumable latent cache."""

import json
import os

import numpy as np
import pytest
import torch

from visionmoe.video.data.cache import CacheConfig, LatentCache, build_cache, collate, encode_videos
from visionmoe.video.data.manifest import ManifestError, VideoRecord, load_records, read_manifest, wan_num_frames
from visionmoe.video.data.video import VideoDecodeError, decode_video, frames_to_tensor
from visionmoe.video.data.synthetic import generate_clip, write_dataset, write_video


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    manifest = write_dataset(str(root), 3, seed=2, scenarios=["bounce", "smoke", "melting"], num_frames=9,
                             height=48, width=48)
    return root, manifest


@pytest.fixture(scope="module")
def pipe():
    from visionmoe.video.models.tiny import load_tiny_wan

    return load_tiny_wan()


def _write_manifest(path, rows):
    with open(path, "w") as fh:
        for r in rows:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def test_read_manifest(dataset):
    root, manifest = dataset
    recs = read_manifest(manifest)
    assert len(recs) == 3 and os.path.isabs(recs[0].video) and os.path.isfile(recs[0].video)
    assert recs[0].labels == ["elastic", "rigid"] and "bounces" in recs[0].caption
    assert recs[0].extra["scenario"] == "bounce"


@pytest.mark.parametrize("row, match", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ({"caption": "x"}, "missing 'video'"),
    ({"video": "videos/a.mp4"}, "missing 'caption'"),
    ({"video": "videos/a.mp4", "caption": "x", "labels": ["telekinesis"]}, "no PILA category"),
    ({"video": "videos/a.mp4", "caption": "x", "start": 2, "end": 1}, "must be after"),
    ({"video": "videos/a.mp4", "caption": "x", "fps": "fast"}, "must be a number"),
])
def test_bad_manifests_name_the_line(tmp_path, row, match):
    path = _write_manifest(tmp_path / "m.jsonl", [{"video": "ok.mp4", "caption": "fine"}, row])
    with pytest.raises(ManifestError, match=match) as e:
        read_manifest(path, check_files=False)
    assert "m.jsonl:2" in str(e.value)


def test_missing_files_are_listed(tmp_path, dataset):
    root, manifest = dataset
    rows = [json.loads(l) for l in open(manifest)]
    for r in rows:  # absolute paths work too
        r["video"] = os.path.join(str(root), r["video"])
    rows.append({"video": "nowhere/missing.mp4", "caption": "a ball"})
    path = _write_manifest(tmp_path / "m.jsonl", rows)
    with pytest.raises(FileNotFoundError, match="1 video\\(s\\).*line 4: nowhere/missing.mp4"):
        read_manifest(path)
    with pytest.raises(FileNotFoundError, match="manifest not found"):
        read_manifest(str(tmp_path / "none.jsonl"))
    with pytest.raises(ManifestError, match="lists no videos"):
        read_manifest(_write_manifest(tmp_path / "empty.jsonl", []))


def test_folder_with_captions(tmp_path):
    clip = generate_clip("free_fall", 0, num_frames=9, height=48, width=48)
    write_video(str(tmp_path / "a.mp4"), clip.frames)
    (tmp_path / "a.txt").write_text(clip.caption)
    (tmp_path / "a.labels").write_text("gravity, rigid")  # PhyGenBench law + ours
    recs = load_records(str(tmp_path))
    assert len(recs) == 1 and recs[0].caption == clip.caption and recs[0].labels == ["rigid"]
    write_video(str(tmp_path / "b.mp4"), clip.frames)
    with pytest.raises(ManifestError, match="without a caption file.*b.mp4"):
        load_records(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        load_records(str(tmp_path / "nope"))


def test_decode_resize_trim_fps(tmp_path):
    clip = generate_clip("projectile", 1, num_frames=17, height=64, width=96)
    path = str(tmp_path / "c.mp4")
    write_video(path, clip.frames, fps=8)
    fr = decode_video(path, 9, 32, 32)
    assert fr.shape == (9, 32, 32, 3) and fr.dtype == np.uint8
    full = decode_video(path, 17, 64, 96)
    assert np.abs(full.astype(float) - clip.frames).mean() < 2.0
    half = decode_video(path, 9, 64, 96, fps=4)  # every other frame
    assert np.abs(half.astype(float) - clip.frames[::2]).mean() < 2.0
    trim = decode_video(path, 5, 64, 96, start=1.0)  # from frame 8 on
    assert np.abs(trim.astype(float) - clip.frames[8:13]).mean() < 2.0
    with pytest.raises(VideoDecodeError, match="need 17"):
        decode_video(path, 17, 64, 96, start=1.0)
    with pytest.raises(ValueError, match="4k\\+1"):
        decode_video(path, 8, 64, 96)
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video at all")
    with pytest.raises(VideoDecodeError, match="cannot decode"):
        decode_video(str(bad), 9, 32, 32)
    assert [wan_num_frames(n) for n in (0, 1, 4, 5, 16, 17, 80, 81)] == [0, 1, 1, 5, 13, 17, 77, 81]


def test_cache_skips_corrupt_and_resumes(tmp_path, dataset, pipe):
    root, manifest = dataset
    recs = read_manifest(manifest)
    bad = tmp_path / "corrupt.mp4"
    bad.write_bytes(b"\x00\x01garbage")
    recs.insert(1, VideoRecord(str(bad), "a corrupt clip"))
    cfg = CacheConfig(num_frames=9, height=48, width=48, max_sequence_length=32, model="tiny")
    cache = str(tmp_path / "cache")
    r1 = build_cache(recs[:2], pipe, cache, cfg, shard_size=2, progress=False)  # "interrupted" run
    assert (r1.cached, r1.skipped) == (1, 1)
    r2 = build_cache(recs, pipe, cache, cfg, shard_size=2, progress=False)  # resumed: only the rest
    assert (r2.cached, r2.skipped, r2.already_cached) == (2, 0, 2)
    index = json.load(open(os.path.join(cache, "cache.json")))
    assert [s["file"] for s in index["shards"]] == ["shard_00000.safetensors", "shard_00001.safetensors"]
    assert index["skipped"][0]["video"] == str(bad)
    ds = LatentCache(cache)
    assert len(ds) == 3
    item = ds[2]
    assert item["latents"].shape == (16, 3, 6, 6) and item["text"].shape[-1] == 32
    assert item["labels"].tolist() == [0, 0, 1, 0, 1, 0]  # melting: liquid + thermal
    batch = collate([ds[0], ds[1]])
    assert batch["latents"].shape == (2, 16, 3, 6, 6) and batch["text"].shape[0] == 2
    # padded to the pipeline's prompt length, the batch's text is exactly what WanPipeline feeds
    # the transformer at inference (zero rows included: they take part in cross-attention)
    padded = collate([ds[0], ds[1]], text_length=40)
    assert padded["text"].shape[:2] == (2, 40)
    emb = pipe._get_t5_prompt_embeds([ds[0]["caption"]], max_sequence_length=40, device="cpu")
    torch.testing.assert_close(padded["text"][0], emb[0].float())
    # the cached latents are the VAE encoding of the decoded clip
    fr = decode_video(recs[0].video, 9, 48, 48)
    z = encode_videos(pipe.vae, frames_to_tensor(fr)[None])[0]
    torch.testing.assert_close(ds[0]["latents"], z)
    with pytest.raises(ValueError, match="other settings"):
        build_cache(recs, pipe, cache, CacheConfig(num_frames=5, height=48, width=48, model="tiny"), progress=False)
    with pytest.raises(FileNotFoundError, match="no latent cache"):
        LatentCache(str(tmp_path / "nothing"))
