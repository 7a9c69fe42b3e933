"""Build visionmoe and its one compiled extension, visionmoe._C.

C++ kernels (OpenMP) are always built. CUDA kernels are added when nvcc and a CUDA build
of torch are present; force with VISIONMOE_WITH_CUDA=1 (fail if impossible) or =0 (skip).
torch is imported here, so install with `pip install --no-build-isolation -e .`.
"""

import glob
import os
import sys

import shutil

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


# The viewer page's files (web/viewer, and the decoder it imports from web/src) are package data
# of visionmoe.splat.viewer, in its site/ folder (git-ignored): copied there in a wheel, linked
# back into web/ by an editable or in-place build (so that an edit under web/ shows at once).
# The npm packages (web/node_modules) are not package data: the viewer takes them from web/.
VIEWER_SITE = os.path.join("visionmoe", "splat", "viewer", "site")
VIEWER_FOLDERS = ("viewer", "src")


def stage_viewer_site(dest: str, link: bool) -> None:
    os.makedirs(dest, exist_ok=True)
    for name in VIEWER_FOLDERS:
        source, target = os.path.join(HERE, "web", name), os.path.join(dest, name)
        if not os.path.isdir(source):  # not a source checkout (an sdist without web/): no page
            continue
        if os.path.islink(target) or os.path.isfile(target):
            os.unlink(target)
        elif os.path.isdir(target):
            shutil.rmtree(target)
        if link:
            os.symlink(os.path.relpath(source, dest), target)
        else:
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.pgms"))


class BuildPy(build_py):
    """build_py that also puts the viewer page into the package (see ``stage_viewer_site``)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            stage_viewer_site(os.path.join(HERE, VIEWER_SITE), link=True)
        else:
            stage_viewer_site(os.path.join(self.build_lib, VIEWER_SITE), link=False)


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    """build_ext; ``--inplace`` (the Makefile's build) also links the viewer page into the package."""

    def run(self):
        super().run()
        if self.inplace:
            stage_viewer_site(os.path.join(HERE, VIEWER_SITE), link=True)


# VISIONMOE_SKIP_EXT=1: install the Python package only (the Makefile builds _C in place
# with `setup.py build_ext --inplace`, so the editable install need not compile it twice).
SKIP_EXT = os.environ.get("VISIONMOE_SKIP_EXT", "0") == "1"

setup(
    packages=find_packages(include=["visionmoe", "visionmoe.*"]),
    ext_modules=[] if SKIP_EXT else [extension()],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
)
