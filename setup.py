"""Build visionmoe and its one compiled extension, visionmoe._C.

C++ kernels (OpenMP) are always built. CUDA kernels are added when nvcc and a CUDA build
of torch are present; force with VISIONMOE_WITH_CUDA=1 (fail if impossible) or =0 (skip).
torch is imported here, so install with `pip install --no-build-isolation -e .`.
"""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import torch
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


def _locate_cuda_home() -> None:
    """torch guesses CUDA_HOME from `which nvcc`; a wrapper script there (e.g. in
    /usr/local/bin) hides the toolkit's lib64. Point at a real toolkit when we can."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    guess = os.path.dirname(os.path.dirname(nvcc)) if nvcc else None
    if guess and os.path.isdir(os.path.join(guess, "lib64")):
        return
    for candidate in ("/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)):
        if os.path.exists(os.path.join(candidate, "bin", "nvcc")):
            os.environ["CUDA_HOME"] = candidate
            return


_locate_cuda_home()

from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))


def want_cuda() -> bool:
    flag = os.environ.get("VISIONMOE_WITH_CUDA", "auto").strip().lower()
    possible = CUDA_HOME is not None and torch.version.cuda is not None
    if flag in ("1", "true", "yes", "on"):
        if not possible:
            sys.exit(
                "VISIONMOE_WITH_CUDA=1 but CUDA cannot be built: "
                f"nvcc home={CUDA_HOME!r}, torch CUDA version={torch.version.cuda!r}. "
                "Install the CUDA toolkit and a CUDA build of torch, or set VISIONMOE_WITH_CUDA=0."
            )
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    return possible


def extension():
    sources = sorted(glob.glob("csrc/ext.cpp") + glob.glob("csrc/*/*_cpu.cpp"))
    include_dirs = [os.path.join(HERE, "csrc")]
    cxx = ["-O3", "-std=c++20", "-fopenmp"]
    define_macros = []
    if not want_cuda():
        return CppExtension(
            "visionmoe._C", sources, include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"],
        )
    # Without a visible GPU torch cannot pick archs; default to Ampere and Hopper.
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0"
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "native")
    # ATen/cuda headers need cuBLAS/cuSPARSE headers, which the torch wheels ship here.
    site = os.path.dirname(os.path.dirname(torch.__file__))
    include_dirs += [d for d in glob.glob(os.path.join(site, "nvidia", "*", "include")) if os.path.isdir(d)]
    define_macros += [("WITH_CUDA", None), ("VISIONMOE_CUDA_ARCHS", f'"{archs}"')]
    return CUDAExtension(
        "visionmoe._C",
        sources + sorted(glob.glob("csrc/*/*.cu")),
        include_dirs=include_dirs,
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "-std=c++20", "--use_fast_math", "-lineinfo"]},
        extra_link_args=["-fopenmp"],
    )


# The viewer site is package data of visionmoe.splat.viewer (site/, git-ignored) and a build
# product: web/tools/bundle.mjs (esbuild) bundles the page (web/viewer, the decoder in web/src,
# three, Spark, fzstd) and the screenshot tool (puppeteer-core) from web/'s npm packages, so that
# an installed package serves it with no Node, npm or checkout. It is built in the source tree
# when its inputs changed (site/bundle.json holds their hash) and copied into a wheel: an
# editable install, `make build` and the wheel serve the same files.
VIEWER_SITE = os.path.join("visionmoe", "splat", "viewer", "site")
WEB = os.path.join(HERE, "web")
BUNDLE_INPUTS = ("viewer", "src", "tools", "package.json", "package-lock.json")


def viewer_inputs_hash() -> str:
    digest = hashlib.sha256()
    for name in BUNDLE_INPUTS:
        top = os.path.join(WEB, name)
        files = [top] if os.path.isfile(top) else sorted(glob.glob(os.path.join(top, "**", "*"), recursive=True))
        for path in files:
            if os.path.isfile(path) and not path.endswith(".pgms"):
                digest.update(os.path.relpath(path, WEB).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read() + b"\0")
    return digest.hexdigest()


def _run_web(cmd: list, what: str) -> None:
    res = subprocess.run(cmd, cwd=WEB, capture_output=True, text=True)
    if res.returncode != 0:
        lines = [ln for ln in (res.stderr or res.stdout).strip().splitlines() if ln.strip()]
        sys.exit(f"{what} failed in web/: {lines[-1] if lines else f'exit status {res.returncode}'}")


def build_viewer_site() -> str | None:
    """Bring ``visionmoe/splat/viewer/site`` up to date with web/; -> its path (None: no web/, no site)."""
    site = os.path.join(HERE, VIEWER_SITE)
    built = os.path.isfile(os.path.join(site, "viewer", "index.html"))
    if not os.path.isdir(os.path.join(WEB, "viewer")):  # an sdist without web/: a site built before, if any
        if not built:
            print("warning: web/ is missing, so this build has no viewer page (`visionmoe-splat view` will say so)",
                  file=sys.stderr)
        return site if built else None
    stamp = viewer_inputs_hash()
    try:
        with open(os.path.join(site, "bundle.json")) as f:
            if built and json.load(f).get("stamp") == stamp:
                return site
    except (OSError, ValueError):
        pass
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        sys.exit("building the viewer bundle (package data) needs Node.js 20+ and npm: install them "
                 "(e.g. apt-get install nodejs npm, or `make web-deps`) and build again")
    lock = os.path.join(WEB, "node_modules", ".package-lock.json")
    if not os.path.isfile(lock) or os.path.getmtime(lock) < os.path.getmtime(os.path.join(WEB, "package-lock.json")):
        _run_web([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], "npm ci")
    _run_web([node, os.path.join("tools", "bundle.mjs"), "--out", site, "--stamp", stamp], "the viewer bundle")
    return site


class BuildPy(build_py):
    """build_py that also brings the viewer site up to date and puts it into the package (see above)."""

    def run(self):
        super().run()
        site = build_viewer_site()
        if site is not None and not getattr(self, "editable_mode", False):
            target = os.path.join(self.build_lib, VIEWER_SITE)
            shutil.rmtree(target, ignore_errors=True)  # no file of an older site stays behind
            shutil.copytree(site, target)


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    """build_ext; ``--inplace`` (the Makefile's build) also brings the viewer site up to date."""

    def run(self):
        super().run()
        if self.inplace:
            build_viewer_site()


# VISIONMOE_SKIP_EXT=1: install the Python package only (the Makefile builds _C in place
# with `setup.py build_ext --inplace`, so the editable install need not compile it twice).
SKIP_EXT = os.environ.get("VISIONMOE_SKIP_EXT", "0") == "1"

setup(
    packages=find_packages(include=["visionmoe", "visionmoe.*"]),
    ext_modules=[] if SKIP_EXT else [extension()],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
)
