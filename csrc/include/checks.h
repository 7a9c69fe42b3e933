// Argument checks shared by every kernel file. The Python layer validates first and
// gives the friendly message; these are the last line of defence for direct _C callers.
#pragma once
#include <ATen/ATen.h>

#define VM_CHECK_CPU(x) TORCH_CHECK(!(x).is_cuda(), #x " must be a CPU tensor")
#define VM_CHECK_CUDA(x) TORCH_CHECK((x).is_cuda(), #x " must be a CUDA tensor")
#define VM_CHECK_DIM(x, d) \
  TORCH_CHECK((x).dim() == (d), #x " must have ", (d), " dimensions, got shape ", (x).sizes())
#define VM_CHECK_LONG(x) \
  TORCH_CHECK((x).scalar_type() == at::kLong, #x " must be int64, got ", (x).scalar_type())

// Floating types every kernel accepts: float32, float64, float16, bfloat16.
#define VM_DISPATCH_FLOATING(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, TYPE, NAME, __VA_ARGS__)
