// The single pybind11 module visionmoe._C. Kernels of each device live in a submodule
// (_C.cpu, _C.cuda); visionmoe/ops/_backend.py is the one place that picks between them.
#include <torch/extension.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "codec/rans.h"
#include "codec/zstd_check.h"
#include "frames/frames.h"
#include "raster/raster.h"
#include "routing/routing.h"

#ifndef VISIONMOE_CUDA_ARCHS
#define VISIONMOE_CUDA_ARCHS ""
#endif

namespace {

// The kernels touch no Python objects: they release the GIL, so the caller's other Python
// threads (a data loader, a UI) keep running while one renders or routes.
const auto kReleaseGil = py::call_guard<py::gil_scoped_release>();

py::dict build_info() {
  py::dict info;
  info["cpu"] = true;
#ifdef WITH_CUDA
  info["cuda"] = true;
  info["cuda_archs"] = std::string(VISIONMOE_CUDA_ARCHS);
#else
  info["cuda"] = false;
  info["cuda_archs"] = std::string();
#endif
#ifdef _OPENMP
  info["openmp"] = true;
  info["openmp_threads"] = omp_get_max_threads();
#else
  info["openmp"] = false;
  info["openmp_threads"] = 1;
#endif
  info["torch_abi_version"] = std::string(TORCH_VERSION);
  return info;
}

#define VM_BIND_ROUTING(m, ns)                                         \
  m.def("topk_route_fwd", &ns::topk_route_fwd, kReleaseGil);           \
  m.def("topk_route_bwd", &ns::topk_route_bwd, kReleaseGil);           \
  m.def("routing_plan", &ns::routing_plan, kReleaseGil);               \
  m.def("dispatch_fwd", &ns::dispatch_fwd, kReleaseGil);               \
  m.def("combine_fwd", &ns::combine_fwd, kReleaseGil);                 \
  m.def("combine_bwd", &ns::combine_bwd, kReleaseGil);                 \
  m.def("nearest_center_fwd", &ns::nearest_center_fwd, kReleaseGil);   \
  m.def("segment_moments_fwd", &ns::segment_moments_fwd, kReleaseGil); \
  m.def("segment_moments_bwd", &ns::segment_moments_bwd, kReleaseGil);

#define VM_BIND_RASTER(m, ns)                              \
  m.def("project_fwd", &ns::project_fwd, kReleaseGil);     \
  m.def("project_bwd", &ns::project_bwd, kReleaseGil);     \
  m.def("sh_fwd", &ns::sh_fwd, kReleaseGil);               \
  m.def("sh_bwd", &ns::sh_bwd, kReleaseGil);               \
  m.def("rasterize_fwd", &ns::rasterize_fwd, kReleaseGil); \
  m.def("rasterize_bwd", &ns::rasterize_bwd, kReleaseGil);

// CPU only: the .pgms entropy coder (one sequential chain per lane), the strict check of a
// zstd frame's Huffman literal streams, the rANS table writer and the parent-frame rotations.
#define VM_BIND_CODEC(m, ns)                                             \
  m.def("rans_encode", &ns::rans_encode, kReleaseGil);                   \
  m.def("rans_decode", &ns::rans_decode, kReleaseGil);                   \
  m.def("zstd_literals_check", &ns::zstd_literals_check, kReleaseGil); \
  m.def("rans_table_varints", &ns::rans_table_varints, kReleaseGil); \
  m.def("relabel_to_parent", &ns::relabel_to_parent, kReleaseGil);   \
  m.def("compose_quats", &ns::compose_quats, kReleaseGil);           \
  m.def("rotate_by_quats", &ns::rotate_by_quats, kReleaseGil);

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "visionmoe compiled ops (routing, rasterisation, the .pgms rANS coder)";
  m.def("build_info", &build_info, "What this extension was compiled with.");
  auto cpu = m.def_submodule("cpu", "OpenMP CPU kernels");
  VM_BIND_ROUTING(cpu, visionmoe::cpu)
  VM_BIND_RASTER(cpu, visionmoe::cpu)
  VM_BIND_CODEC(cpu, visionmoe::cpu)
#ifdef WITH_CUDA
  auto cuda = m.def_submodule("cuda", "CUDA kernels");
  VM_BIND_ROUTING(cuda, visionmoe::cuda)
  VM_BIND_RASTER(cuda, visionmoe::cuda)
#endif
}
