// Interleaved rANS of the .pgms format (coder 4): symbol i belongs to lane i mod lanes, every
// lane's state lives in [2^16, 2^32) and renormalises by one 16-bit word, and the lanes share
// one word stream in symbol order. Encoding runs backwards over the symbols, so the words it
// emits come out in reverse decoder order and are reversed at the end.
#include <algorithm>
#include <vector>

#include "../include/checks.h"
#include "rans.h"

namespace visionmoe {
namespace cpu {

namespace {
constexpr uint64_t kStateLow = uint64_t{1} << 16;

void check_table(const at::Tensor& freqs, int64_t precision) {
  VM_CHECK_CPU(freqs);
  VM_CHECK_DIM(freqs, 1);
  VM_CHECK_LONG(freqs);
  TORCH_CHECK(precision >= 1 && precision <= 16, "precision must lie in [1, 16], got ", precision);
  TORCH_CHECK(freqs.is_contiguous(), "freqs must be contiguous");
  const int64_t* f = freqs.data_ptr<int64_t>();
  int64_t sum = 0;
  for (int64_t s = 0; s < freqs.size(0); ++s) {
    TORCH_CHECK(f[s] >= 0, "frequencies must be non-negative");
    sum += f[s];
  }
  TORCH_CHECK(sum == (int64_t{1} << precision), "frequencies must sum to 2^precision");
}

std::vector<uint64_t> cumulative(const int64_t* f, int64_t alphabet) {
  std::vector<uint64_t> cum(alphabet);
  uint64_t acc = 0;
  for (int64_t s = 0; s < alphabet; ++s) {
    cum[s] = acc;
    acc += static_cast<uint64_t>(f[s]);
  }
  return cum;
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> rans_encode(const at::Tensor& symbols_in, const at::Tensor& freqs,
                                               int64_t precision, int64_t lanes) {
  VM_CHECK_CPU(symbols_in);
  VM_CHECK_DIM(symbols_in, 1);
  VM_CHECK_LONG(symbols_in);
  check_table(freqs, precision);
  const at::Tensor symbols = symbols_in.contiguous();
  const int64_t n = symbols.size(0), alphabet = freqs.size(0);
  TORCH_CHECK(lanes >= 1 && lanes <= std::max<int64_t>(n, 1), "lanes must lie in [1, max(n, 1)], got ", lanes);
  const int64_t* u = symbols.data_ptr<int64_t>();
  const int64_t* f = freqs.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(u[i] >= 0 && u[i] < alphabet && f[u[i]] > 0, "symbol ", u[i], " at ", i,
                " lies outside the alphabet or has frequency 0");
  }
  const std::vector<uint64_t> cum = cumulative(f, alphabet);
  const uint64_t m = static_cast<uint64_t>(precision);
  const int shift = 32 - static_cast<int>(precision);
  std::vector<uint64_t> x(lanes, kStateLow);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t j = i % lanes;
    const int64_t s = u[i];
    const uint64_t fs = static_cast<uint64_t>(f[s]);
    uint64_t xs = x[j];
    if (xs >= (fs << shift)) {  // one word out keeps the state below 2^32 after coding s
      out.push_back(static_cast<int32_t>(xs & 0xFFFF));
      xs >>= 16;
    }
    x[j] = ((xs / fs) << m) + xs % fs + cum[s];
  }
  std::reverse(out.begin(), out.end());
  at::Tensor states = at::empty({lanes}, symbols.options());
  int64_t* st = states.data_ptr<int64_t>();
  for (int64_t j = 0; j < lanes; ++j) st[j] = static_cast<int64_t>(x[j]);
  at::Tensor words = at::empty({static_cast<int64_t>(out.size())}, symbols.options().dtype(at::kInt));
  std::copy(out.begin(), out.end(), words.data_ptr<int32_t>());
  return {states, words};
}

std::tuple<at::Tensor, at::Tensor> rans_decode(const at::Tensor& states_in, const at::Tensor& words_in,
                                               const at::Tensor& freqs, int64_t precision, int64_t n) {
  VM_CHECK_CPU(states_in);
  VM_CHECK_DIM(states_in, 1);
  VM_CHECK_LONG(states_in);
  VM_CHECK_CPU(words_in);
  VM_CHECK_DIM(words_in, 1);
  TORCH_CHECK(words_in.scalar_type() == at::kInt, "words must be int32, got ", words_in.scalar_type());
  check_table(freqs, precision);
  TORCH_CHECK(n >= 0, "n must be non-negative");
  const at::Tensor states = states_in.contiguous(), words = words_in.contiguous();
  const int64_t lanes = states.size(0), nw = words.size(0), alphabet = freqs.size(0);
  TORCH_CHECK(lanes >= 1 || n == 0, "a stream with symbols needs at least one lane");
  const int64_t* f = freqs.data_ptr<int64_t>();
  const int64_t* st = states.data_ptr<int64_t>();
  const int32_t* w = words.data_ptr<int32_t>();
  for (int64_t j = 0; j < lanes; ++j) {
    TORCH_CHECK(st[j] >= static_cast<int64_t>(kStateLow) && st[j] < (int64_t{1} << 32), "lane state out of range");
  }
  const std::vector<uint64_t> cum = cumulative(f, alphabet);
  const uint64_t mask = (uint64_t{1} << precision) - 1, m = static_cast<uint64_t>(precision);
  std::vector<int32_t> slot_symbol(size_t{1} << precision);
  for (int64_t s = 0; s < alphabet; ++s) {
    std::fill_n(slot_symbol.begin() + static_cast<int64_t>(cum[s]), f[s], static_cast<int32_t>(s));
  }
  std::vector<uint64_t> x(st, st + lanes);
  at::Tensor symbols = at::zeros({n}, states.options());
  at::Tensor status = at::zeros({2}, states.options());
  int64_t* out = symbols.data_ptr<int64_t>();
  int64_t* stat = status.data_ptr<int64_t>();
  int64_t ptr = 0, j = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v = x[j];
    const uint64_t slot = v & mask;
    const int32_t s = slot_symbol[slot];
    out[i] = s;
    v = static_cast<uint64_t>(f[s]) * (v >> m) + slot - cum[s];
    if (v < kStateLow) {
      if (ptr >= nw) {
        stat[0] = 1;
        stat[1] = i;
        return {symbols, status};
      }
      v = (v << 16) | static_cast<uint64_t>(static_cast<uint16_t>(w[ptr++]));
    }
    x[j] = v;
    if (++j == lanes) j = 0;
  }
  if (ptr != nw) {
    stat[0] = 2;
    stat[1] = nw - ptr;
    return {symbols, status};
  }
  for (int64_t k = 0; k < lanes; ++k) {
    if (x[k] != kStateLow) {
      stat[0] = 3;
      stat[1] = k;
      return {symbols, status};
    }
  }
  return {symbols, status};
}

at::Tensor rans_table_varints(const at::Tensor& freqs_in) {
  VM_CHECK_CPU(freqs_in);
  VM_CHECK_DIM(freqs_in, 1);
  VM_CHECK_LONG(freqs_in);
  const at::Tensor freqs = freqs_in.contiguous();
  const int64_t* f = freqs.data_ptr<int64_t>();
  const int64_t alphabet = freqs.size(0);
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(2 * alphabet));
  auto put = [&out](uint64_t v) {  // unsigned LEB128
    for (; v >= 0x80; v >>= 7) out.push_back(static_cast<uint8_t>((v & 0x7F) | 0x80));
    out.push_back(static_cast<uint8_t>(v));
  };
  for (int64_t s = 0; s < alphabet;) {
    TORCH_CHECK(f[s] >= 0, "frequencies must be non-negative");
    if (f[s] > 0) {
      put(static_cast<uint64_t>(f[s++]));
      continue;
    }
    int64_t end = s;
    while (end < alphabet && f[end] == 0) ++end;
    put(0);
    put(static_cast<uint64_t>(end - s - 1));
    s = end;
  }
  at::Tensor bytes = at::empty({static_cast<int64_t>(out.size())}, freqs.options().dtype(at::kByte));
  std::copy(out.begin(), out.end(), bytes.data_ptr<uint8_t>());
  return bytes;
}

}  // namespace cpu
}  // namespace visionmoe
