// The zstd literals check (zstd_check.h): walk the frame's blocks, read the literals section of
// each compressed block (Huffman tree description, jump table) and decode every Huffman stream
// backwards from its padding bit, requiring exactly its regenerated size to end at its first
// bit. Only the code lengths of the literals are needed, never their values. Every read is
// bounds-checked: the frame may be anything.
#include <cstring>
#include <vector>

#include "../include/checks.h"
#include "zstd_check.h"

namespace visionmoe {
namespace cpu {

namespace {
constexpr int64_t kBlockMax = int64_t{1} << 17;  // literals of one block: at most 128 KiB
constexpr int64_t kMinLiterals4Streams = 6;
constexpr int kMaxWeight = 11;    // RFC 8878 4.2.1: at most 11 bits per code
constexpr int kMaxTableLog = 12;  // libzstd's decoding table limit
constexpr int kFseWeightLog = 6;  // accuracy log limit of the FSE-coded weights

struct Result {
  int64_t code;
  int64_t at;
};
constexpr Result kValid{kZstdValid, 0};

// Code length of every index of a Huffman decoding table of 2^log entries.
struct Huffman {
  int log = 0;
  std::vector<uint8_t> nbits;
};

int bit_length(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

// Bits of s[0, n) from bit q upwards (little-endian; at least 25 of them), reading 0 outside the
// bytes (q < 0: the bits below the first, at most 32 of them).
uint64_t bits_at(const uint8_t* s, int64_t n, int64_t q) {
  if (q < 0) return bits_at(s, n, 0) << (-q);
  const int64_t byte = q >> 3;
  uint64_t w = 0;
  if (byte + 4 <= n) {
    w = uint64_t{s[byte]} | uint64_t{s[byte + 1]} << 8 | uint64_t{s[byte + 2]} << 16 | uint64_t{s[byte + 3]} << 24;
  } else {
    for (int64_t k = 0; k < 4 && byte + k < n; ++k) w |= uint64_t{s[byte + k]} << (8 * k);
  }
  return w >> (q & 7);
}

int64_t frame_header_size(const uint8_t* b, int64_t n) {
  if (n < 5 || b[0] != 0x28 || b[1] != 0xb5 || b[2] != 0x2f || b[3] != 0xfd || (b[4] & 0x08)) return 0;
  const int fhd = b[4], single = (fhd >> 5) & 1;
  static const int kDictBytes[4] = {0, 1, 2, 4};
  const int fcs_bytes[4] = {single, 2, 4, 8};
  const int64_t size = 5 + (single ? 0 : 1) + kDictBytes[fhd & 3] + fcs_bytes[fhd >> 6];
  return size <= n ? size : 0;
}

// The prefix code of the weights (the last symbol's weight implied); false if there is none.
bool decoding_table(std::vector<int> weights, Huffman& out) {
  uint32_t total = 0;
  for (int w : weights) {
    if (w > kMaxWeight) return false;
    total += (uint32_t{1} << w) >> 1;
  }
  if (total == 0) return false;
  const int log = bit_length(total);
  const uint32_t rest = (uint32_t{1} << log) - total;
  if (log > kMaxTableLog || (rest & (rest - 1))) return false;
  weights.push_back(bit_length(rest));
  int count[kMaxTableLog + 2] = {0};
  for (int w : weights) ++count[w];
  if (count[1] < 2 || (count[1] & 1)) return false;
  out.log = log;
  out.nbits.clear();
  for (int w = 1; w <= log; ++w) {  // weight 1 (the longest codes) first
    out.nbits.insert(out.nbits.end(), static_cast<size_t>(count[w]) << (w - 1), static_cast<uint8_t>(log + 1 - w));
  }
  return true;
}

// FSE table description (RFC 8878 4.1.1) -> accuracy log, normalized counts, bytes used.
bool read_ncount(const uint8_t* s, int64_t n, int max_log, int& log, std::vector<int>& counts, int64_t& used) {
  log = static_cast<int>(bits_at(s, n, 0) & 15) + 5;
  if (log > max_log) return false;
  int64_t at = 4;
  int remaining = (1 << log) + 1, threshold = 1 << log, nb = log + 1;
  bool previous0 = false;
  counts.clear();
  for (;;) {
    if (previous0) {
      for (;;) {
        const int repeat = static_cast<int>(bits_at(s, n, at) & 3);
        at += 2;
        counts.insert(counts.end(), repeat, 0);
        if (repeat < 3) break;
        if (counts.size() > 256) break;  // the check below refuses it
      }
      if (counts.size() >= 256) break;
    }
    const int most = 2 * threshold - 1 - remaining;
    int value = static_cast<int>(bits_at(s, n, at) & static_cast<uint64_t>(threshold - 1));
    if (value < most) {
      at += nb - 1;
    } else {
      value = static_cast<int>(bits_at(s, n, at) & static_cast<uint64_t>(2 * threshold - 1));
      if (value >= threshold) value -= most;
      at += nb;
    }
    const int count = value - 1;
    remaining -= count < 0 ? -count : count;
    counts.push_back(count);
    previous0 = count == 0;
    if (remaining < threshold) {
      if (remaining <= 1) break;
      nb = bit_length(static_cast<uint64_t>(remaining));
      threshold = 1 << (nb - 1);
    }
    if (counts.size() >= 256) break;
  }
  used = (at + 7) >> 3;
  return remaining == 1 && counts.size() <= 256 && used <= n;
}

struct FseEntry {
  int symbol, nbits, base;
};

bool fse_table(int log, const std::vector<int>& counts, std::vector<FseEntry>& table) {
  const int size = 1 << log;
  table.assign(size, FseEntry{0, 0, 0});
  std::vector<int> following(counts.size());
  int high = size - 1;
  for (size_t s = 0; s < counts.size(); ++s) {
    if (counts[s] == -1) {
      if (high < 0) return false;
      table[high--].symbol = static_cast<int>(s);
      following[s] = 1;
    } else {
      following[s] = counts[s];
    }
  }
  const int step = (size >> 1) + (size >> 3) + 3;
  int position = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    for (int i = 0; i < counts[s]; ++i) {
      table[position].symbol = static_cast<int>(s);
      position = (position + step) & (size - 1);
      while (position > high) position = (position + step) & (size - 1);
    }
  }
  if (position != 0) return false;
  for (int u = 0; u < size; ++u) {
    const int next = following[table[u].symbol]++;
    const int nb = log - (bit_length(static_cast<uint64_t>(next)) - 1);
    table[u].nbits = nb;
    table[u].base = (next << nb) - size;
  }
  return true;
}

// The Huffman weights FSE-coded in s[0, n): a table description, then two interleaved states
// read backwards; the stream is used up when a state update reads below its first bit.
bool fse_weights(const uint8_t* s, int64_t n, std::vector<int>& weights) {
  if (n < 2) return false;
  int log = 0;
  int64_t used = 0;
  std::vector<int> counts;
  std::vector<FseEntry> table;
  if (!read_ncount(s, n, kFseWeightLog, log, counts, used) || !fse_table(log, counts, table)) return false;
  const uint8_t* st = s + used;
  const int64_t len = n - used;
  if (len < 1 || st[len - 1] == 0) return false;
  int64_t pos = 8 * (len - 1) + bit_length(st[len - 1]) - 1;
  auto read = [&](int nb) {
    pos -= nb;
    return static_cast<int>(bits_at(st, len, pos) & ((uint64_t{1} << nb) - 1));
  };
  int state[2];
  state[0] = read(log);
  state[1] = read(log);
  weights.clear();
  for (;;) {
    for (int k = 0; k < 2; ++k) {
      if (weights.size() > 253) return false;
      const FseEntry& e = table[state[k]];
      weights.push_back(e.symbol);
      state[k] = e.base + read(e.nbits);
      if (pos < 0) {
        weights.push_back(table[state[1 - k]].symbol);
        return true;
      }
    }
  }
}

// Huffman tree description at b[pos, stop) -> the table and the bytes it takes.
bool huffman_table(const uint8_t* b, int64_t pos, int64_t stop, Huffman& out, int64_t& used) {
  if (pos >= stop) return false;
  const int hb = b[pos];
  std::vector<int> weights;
  if (hb >= 128) {
    const int n = hb - 127;
    used = 1 + (n + 1) / 2;
    if (pos + used > stop) return false;
    for (int i = 0; i < n; ++i) weights.push_back((b[pos + 1 + i / 2] >> ((i & 1) ? 0 : 4)) & 15);
  } else {
    used = 1 + hb;
    if (pos + used > stop || !fse_weights(b + pos + 1, hb, weights)) return false;
  }
  return decoding_table(std::move(weights), out);
}

// One Huffman stream b[lo, hi): `count` codes read backwards from the padding bit must end
// exactly at the stream's first bit.
Result stream(const uint8_t* b, int64_t lo, int64_t hi, int64_t count, const Huffman& t) {
  if (hi <= lo || b[hi - 1] == 0) return {kZstdNoEndMark, lo};
  const uint8_t* s = b + lo;
  const int64_t n = hi - lo;
  int64_t p = 8 * (n - 1) + bit_length(s[n - 1]) - 1;  // bits left
  const int log = t.log;
  const uint64_t mask = (uint64_t{1} << log) - 1;
  const uint8_t* nbits = t.nbits.data();
  int64_t i = 0;
  // bulk: a 64-bit window of the bits [base, base + 64) that holds the 57 or more bits below p,
  // decoded while the next peek lies inside it (45 bits or more per window)
  while (i < count && p > 64) {
    const int64_t byte = ((p + 7) >> 3) - 8, base = 8 * byte;
    uint64_t w;
    std::memcpy(&w, s + byte, 8);  // little-endian hosts (x86-64, arm64)
    while (i < count && p - log >= base) {
      p -= nbits[(w >> (p - log - base)) & mask];
      ++i;
    }
  }
  for (; i < count; ++i) {  // the last bits, with zeros below the first
    if (p <= 0) return {kZstdInexactStream, lo};
    p -= nbits[bits_at(s, n, p - log) & mask];
  }
  return p == 0 ? kValid : Result{kZstdInexactStream, lo};
}

Result streams(const uint8_t* b, int64_t pos, int64_t stop, int64_t regen, int count, const Huffman& t) {
  if (count == 1) return stream(b, pos, stop, regen, t);
  if (stop - pos < 10) return {kZstdBadJumpTable, pos};
  int64_t sizes[4];
  for (int k = 0; k < 3; ++k) sizes[k] = b[pos + 2 * k] | b[pos + 2 * k + 1] << 8;
  sizes[3] = stop - pos - 6 - sizes[0] - sizes[1] - sizes[2];
  for (int64_t size : sizes) {
    if (size < 1) return {kZstdBadJumpTable, pos};
  }
  const int64_t segment = (regen + 3) / 4;
  int64_t at = pos + 6;
  for (int k = 0; k < 4; ++k) {
    const Result r = stream(b, at, at + sizes[k], k < 3 ? segment : regen - 3 * segment, t);
    if (r.code != kZstdValid) return r;
    at += sizes[k];
  }
  return kValid;
}

// The literals section of the compressed block b[start, end); `table` is the last Huffman table
// of the frame (has_table: there is one), which a Compressed literals block replaces.
Result literals(const uint8_t* b, int64_t start, int64_t end, Huffman& table, bool& has_table) {
  if (start >= end) return {kZstdBadLiteralsHeader, start};
  const int type = b[start] & 3, sf = (b[start] >> 2) & 3;
  if (type < 2) return kValid;  // Raw or RLE literals: no Huffman stream
  const int lh = sf < 2 ? 3 : sf + 2;
  if (start + lh > end) return {kZstdBadLiteralsHeader, start};
  uint64_t v = 0;
  for (int k = 0; k < lh; ++k) v |= uint64_t{b[start + k]} << (8 * k);
  static const int kBits[4] = {10, 10, 14, 18};
  const uint64_t mask = (uint64_t{1} << kBits[sf]) - 1;
  const int64_t regen = static_cast<int64_t>((v >> 4) & mask);
  const int64_t comp = static_cast<int64_t>((v >> (4 + kBits[sf])) & mask);
  const int count = sf == 0 ? 1 : 4;
  if (regen > kBlockMax || (count == 4 && regen < kMinLiterals4Streams) || start + lh + comp > end) {
    return {kZstdBadLiteralsHeader, start};
  }
  int64_t pos = start + lh;
  const int64_t stop = pos + comp;
  if (type == 2) {
    int64_t used = 0;
    if (!huffman_table(b, pos, stop, table, used)) {
      has_table = false;  // libzstd and fzstd stop here anyway
      return {kZstdBadHuffmanTable, pos};
    }
    has_table = true;
    pos += used;
  } else if (!has_table) {
    return {kZstdNoHuffmanTable, start};
  }
  return streams(b, pos, stop, regen, count, table);
}

Result check(const uint8_t* b, int64_t n) {
  int64_t pos = frame_header_size(b, n);
  if (pos == 0) return {kZstdBadFrameHeader, 0};
  Huffman table;
  bool has_table = false;
  for (;;) {
    if (pos + 3 > n) return {kZstdBadBlock, pos};
    const uint32_t h = b[pos] | b[pos + 1] << 8 | b[pos + 2] << 16;
    const int last = h & 1, type = (h >> 1) & 3;
    const int64_t size = h >> 3, start = pos + 3;
    const int64_t end = start + (type == 1 ? 1 : size);
    if (type == 3 || end > n) return {kZstdBadBlock, pos};
    if (type == 2) {
      const Result r = literals(b, start, end, table, has_table);
      if (r.code != kZstdValid) return r;
    }
    pos = end;
    if (last) return kValid;
  }
}
}  // namespace

std::tuple<int64_t, int64_t> zstd_literals_check(const at::Tensor& frame_in) {
  VM_CHECK_CPU(frame_in);
  VM_CHECK_DIM(frame_in, 1);
  TORCH_CHECK(frame_in.scalar_type() == at::kByte, "frame must be uint8, got ", frame_in.scalar_type());
  const at::Tensor frame = frame_in.contiguous();
  const Result r = check(frame.data_ptr<uint8_t>(), frame.size(0));
  return {r.code, r.at};
}

}  // namespace cpu
}  // namespace visionmoe
