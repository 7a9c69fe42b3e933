// Strict check of the Huffman-coded literals of one zstd frame (RFC 8878 3.1.1.3.1 and 4.2):
// every Huffman literal stream must decode exactly its regenerated size and end exactly at its
// first bit. libzstd's 64-bit fast Huffman loops do not check the end of a stream; its portable
// path and fzstd (the browser decoder's zstd) do, so the .pgms decoders run this after libzstd.
// The loops mirror the pure-Python reference visionmoe/ops/_zstd_literals_ref.py, code for code.
#pragma once
#include <ATen/ATen.h>
#include <tuple>

namespace visionmoe {
namespace cpu {

// Result codes (the reference's constants).
enum ZstdLiteralsCode : int64_t {
  kZstdValid = 0,
  kZstdBadFrameHeader = 1,     // no magic, a reserved frame header bit, a truncated frame header
  kZstdBadBlock = 2,           // a block header or body past the end, or block type 3
  kZstdBadLiteralsHeader = 3,  // a literals header or section that does not fit its block
  kZstdBadHuffmanTable = 4,    // a Huffman tree description that gives no valid prefix code
  kZstdNoHuffmanTable = 5,     // Treeless literals with no earlier table in the frame
  kZstdBadJumpTable = 6,       // the 4-stream jump table leaves a stream empty
  kZstdNoEndMark = 7,          // a stream whose last byte is 0
  kZstdInexactStream = 8,      // a stream that does not decode exactly its size to its first bit
};

// -> (code, byte offset in the frame of the structure that has the problem; 0 when valid).
// frame [n] uint8: one zstd frame at its start (bytes after the frame are not looked at).
std::tuple<int64_t, int64_t> zstd_literals_check(const at::Tensor& frame /* [n] uint8 */);

}  // namespace cpu
}  // namespace visionmoe
