"""Small synthetic scenes and file builders shared by the PGMS tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from visionmoe.splat.io import GaussianScene

ASSET = Path(__file__).resolve().parents[2] / "assets" / "fruit_drops_minimal.ply"


def random_scene(n: int = 64, degree: int = 1, seed: int = 0) -> GaussianScene:
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2 - 1
    return GaussianScene(
        means=torch.randn(n, 3, generator=g),
        quats=torch.randn(n, 4, generator=g),
        log_scales=torch.randn(n, 3, generator=g) * 0.3 - 3.0,
        opacity_logits=torch.randn(n, generator=g),
        sh_dc=torch.randn(n, 3, generator=g) * 0.5,
        sh_rest=torch.randn(n, k, 3, generator=g) * 0.1,
    )


def inria_names(k_rest: int, normals: bool = True) -> list[str]:
    return (["x", "y", "z"] + (["nx", "ny", "nz"] if normals else []) + ["f_dc_0", "f_dc_1", "f_dc_2"]
            + [f"f_rest_{i}" for i in range(k_rest)]
            + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])


def scene_columns(scene: GaussianScene) -> dict[str, np.ndarray]:
    n, k = scene.num_gaussians, scene.sh_rest.shape[1]
    rest = scene.sh_rest.numpy().transpose(0, 2, 1).reshape(n, 3 * k)
    cols = {"x": scene.means[:, 0], "y": scene.means[:, 1], "z": scene.means[:, 2],
            "f_dc_0": scene.sh_dc[:, 0], "f_dc_1": scene.sh_dc[:, 1], "f_dc_2": scene.sh_dc[:, 2],
            "opacity": scene.opacity_logits}
    cols = {key: v.numpy() for key, v in cols.items()}
    for i in range(3 * k):
        cols[f"f_rest_{i}"] = rest[:, i]
    for i in range(3):
        cols[f"scale_{i}"] = scene.log_scales[:, i].numpy()
    for i in range(4):
        cols[f"rot_{i}"] = scene.quats[:, i].numpy()
    return cols
