// The .pgms format's interleaved rANS (coder 4, docs/FORMAT.md "Coder 4: interleaved rANS"):
// the bytes are defined by the format, so these loops must write and accept exactly what the
// numpy reference in visionmoe/splat/pgms/rans.py does. CPU only: a stream is one sequential chain
// per lane, and the encoder codes hundreds of small streams per file.
#pragma once
#include <ATen/ATen.h>
#include <tuple>

namespace visionmoe {
namespace cpu {

// -> lane states [lanes] int64 (each in [2^16, 2^32)), words [W] int32 (each in [0, 2^16)),
//    in the order the decoder reads them. symbols [n] int64, each with freqs[s] > 0.
std::tuple<at::Tensor, at::Tensor> rans_encode(const at::Tensor& symbols, /* [n] int64 */
                                               const at::Tensor& freqs,   /* [A] int64, sum 2^precision */
                                               int64_t precision, int64_t lanes);

// -> symbols [n] int64 and a status [2] int64: (0, 0) decoded; (1, i) the words ran out at
//    symbol i; (2, k) k words were left unused; (3, j) lane j did not end in 2^16.
std::tuple<at::Tensor, at::Tensor> rans_decode(const at::Tensor& states, /* [lanes] int64 */
                                               const at::Tensor& words,  /* [W] int32 */
                                               const at::Tensor& freqs,  /* [A] int64, sum 2^precision */
                                               int64_t precision, int64_t n);

// The format's frequency table before its optional zstd: each run of zero frequencies as the
// varints 0, run - 1, every other frequency as itself, unsigned LEB128 -> bytes [B] uint8.
at::Tensor rans_table_varints(const at::Tensor& freqs /* [A] int64, >= 0 */);

}  // namespace cpu
}  // namespace visionmoe
