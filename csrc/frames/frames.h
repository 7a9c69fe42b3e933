// Parent-frame relabelling of Gaussian rotations (the .pgms encoder's format-3 frames): of the
// proper signed axis permutations of a child's frame, the one closest to its parent's (largest
// trace of the relative rotation), and the relative rotation as a unit quaternion. The loops
// repeat the numpy reference visionmoe/ops/frames.py operation for operation in float64 (no
// fused multiply-adds: frames_cpu.cpp turns contraction off), so both give the same bits and
// the encoder writes the same bytes with or without the extension.
#pragma once
#include <ATen/ATen.h>
#include <tuple>

namespace visionmoe {
namespace cpu {

// -> (relative rotations [N, 4] float64 wxyz with w >= 0, source axis of each relabelled axis
// [N, 3] int64). perms [P, 3, 3] float64: the candidate signed permutation matrices, in the
// reference's order (the first of equal traces wins, as numpy's argmax).
std::tuple<at::Tensor, at::Tensor> relabel_to_parent(const at::Tensor& parent_quats /* [N, 4] f64 */,
                                                     const at::Tensor& quats /* [N, 4] f64 */,
                                                     const at::Tensor& perms /* [P, 3, 3] f64 */);

}  // namespace cpu
}  // namespace visionmoe
