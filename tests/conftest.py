"""Shared test set-up: offline hub, seeded RNGs, CUDA skip marker, device/dtype grids."""

import importlib.util
import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from visionmoe.ops import build_info  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and build_info().get("cuda", False)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU"))]


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU and a CUDA build of visionmoe")
    for item in items:
        if item.get_closest_marker("cuda") is not None and not HAS_CUDA:  # the marker, not a test id
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture
def load_script():
    """``load_script("name")``: the module of ``scripts/name.py`` (scripts are not a package)."""

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
