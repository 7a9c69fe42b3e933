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

// The decoder's rotation of a child, R_parent R_relative, as a unit wxyz quaternion [N, 4] (numpy's
// compose: each input normalised, their Hamilton product normalised).
at::Tensor compose_quats(const at::Tensor& parent_quats /* [N, 4] f64 */,
                         const at::Tensor& relative_quats /* [N, 4] f64 */);

// Each row's vector turned by its quaternion's rotation: R v, or R^T v with ``transpose`` (numpy's
// from_parent_frame / to_parent_frame) [N, 3].
at::Tensor rotate_by_quats(const at::Tensor& quats /* [N, 4] f64 */, const at::Tensor& vectors /* [N, 3] f64 */,
                           bool transpose);

}  // namespace cpu
}  // namespace visionmoe
