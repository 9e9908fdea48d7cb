// Q4_1 (and the LM head's Q8_0) weights times int8 activations in integer dot products (VPDPBUSD), as
// llama.cpp multiplies its quantized weights: `dtype: q4_1_int8` (models/quantized.py has the layouts).
//
// Why: a token tree's product is bound by multiply-adds, not bytes. VDPBF16PS does 32 of them an
// instruction, VPDPBUSD 64 at the same rate, and a Q4_1 nibble is already the unsigned byte it wants, so
// the weights need no float conversion at all. The price is the activations' precision: each row's 32
// values of a weight block share one scale (d = max |x| / 127, as ggml's Q8_1), where bfloat16 keeps
// 8 significant bits per value. So this is a dtype of its own, not a faster `q4_1`.
//
// Every row is quantized on its own and its sums run in the same order whatever the row count, so a
// decode step, a tree and a prefill chunk compute the same numbers for the same row: speculation stays
// lossless against this dtype's own greedy decoding.
//
// Per 16 output columns and 32-weight block, the integer sum exact in int32, then float32:
//   Q4_1: x . w = d_w d_x sum(q_w q_x) + m_w sum(x)    (q_w unsigned nibbles, q_x signed)
//   Q8_0: x . w = d_w d_x (sum(q_w (q_x + 128)) - 128 sum(q_w))    (q_w signed; VPDPBUSD's unsigned side
//         is then the activations, offset by 128, and the packing stores 128 sum(q_w))
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "cpu_math.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

namespace adaserve {

// The layouts' bytes per 16 columns x 32 weights. Q4_1: 16 d and 16 m (float16), then four 64-byte chunks,
// chunk c's byte 4 i + t holding column i's weight k = 4 c + t (low nibble) and k = 16 + 4 c + t (high
// nibble). Q8_0: 16 d (float16), 16 int32 128 sum(q_w), then eight 64-byte chunks, chunk j's byte 4 i + t
// holding column i's weight k = 4 j + t.
constexpr int64_t kInt8Q4_1Bytes = 320, kInt8Q8_0Bytes = 608;

#if defined(__AVX512VNNI__) && defined(__AVX512BF16__)
constexpr bool kInt8GemmCompiled = true;

// x [m, k] bfloat16 -> per row and 32-value block: int8 values q (offset by 128 into unsigned bytes
// where `offset`), scale d and the values' float sum s.
inline void quantize_rows(const c10::BFloat16* x, int64_t m, int64_t k, bool offset, int8_t* q, float* d, float* s) {
  const int64_t blocks = k / 32;
  // A tree's rows take microseconds, less than waking the other threads costs; prefill chunks split.
  at::parallel_for(0, m * blocks, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const c10::BFloat16* xb = x + (i / blocks) * k + (i % blocks) * 32;
      const __m512 lo = load16(xb), hi = load16(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
      const float scale = amax / 127.0f, inverse = amax > 0 ? 127.0f / amax : 0.0f;
      const __m512 iv = _mm512_set1_ps(inverse);
      const __m128i flip = _mm_set1_epi8(offset ? static_cast<char>(0x80) : 0);  // + 128 as unsigned
      const __m128i qlo = _mm_xor_si128(_mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(lo, iv))), flip);  // nearest even
      const __m128i qhi = _mm_xor_si128(_mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(hi, iv))), flip);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * 32), qlo);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * 32 + 16), qhi);
      d[i] = scale;
      s[i] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
    }
  });
}

// The two weight formats: a block's scales and its eight 64-byte VPDPBUSD operands, then per row the
// integer sum's product and the block's term into the float sums.
struct Q4_1Int8 {
  static constexpr int64_t kBytes = kInt8Q4_1Bytes;
  static constexpr bool kOffset = false;
  __m512 dw, mw;
  __m512i wq[8];
  __attribute__((always_inline)) void load(const uint8_t* w) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
    mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32)));
    for (int c = 0; c < 4; ++c) {
      const __m512i bytes = _mm512_loadu_si512(w + 64 + c * 64);
      wq[c] = _mm512_and_si512(bytes, nibble);
      wq[c + 4] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
    }
  }
  __attribute__((always_inline)) __m512i dot(__m512i sum, int j, __m512i xq) const { return _mm512_dpbusd_epi32(sum, wq[j], xq); }
  __attribute__((always_inline)) __m512 add(__m512 acc, __m512i sum, float d, float s) const {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(d)), acc);
    return _mm512_fmadd_ps(mw, _mm512_set1_ps(s), acc);
  }
};

struct Q8_0Int8 {
  static constexpr int64_t kBytes = kInt8Q8_0Bytes;
  static constexpr bool kOffset = true;
  __m512 dw;
  __m512i offset;
  __m512i wq[8];
  __attribute__((always_inline)) void load(const uint8_t* w) {
    dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
    offset = _mm512_loadu_si512(w + 32);
    for (int j = 0; j < 8; ++j) wq[j] = _mm512_loadu_si512(w + 96 + j * 64);
  }
  __attribute__((always_inline)) __m512i dot(__m512i sum, int j, __m512i xq) const { return _mm512_dpbusd_epi32(sum, xq, wq[j]); }
  __attribute__((always_inline)) __m512 add(__m512 acc, __m512i sum, float d, float) const {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum, offset)), _mm512_mul_ps(dw, _mm512_set1_ps(d)), acc);
  }
};

// R rows x one 16-column block, all of k; w points at the column block's first weight block.
template <class F, int R>
inline void int8_tile(const int8_t* q, const float* d, const float* s, int64_t k, const uint8_t* w, const float* bias,
                      c10::BFloat16* out, int64_t n) {
  const int64_t blocks = k / 32;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < blocks; ++kb, w += F::kBytes) {
    F block;
    block.load(w);
    // Each k quad against every row before the next: R independent sums hide VPDPBUSD's latency.
    __m512i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j)
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        std::memcpy(&quad, q + r * k + kb * 32 + 4 * j, sizeof quad);
        sum[r] = block.dot(sum[r], j, _mm512_set1_epi32(quad));
      }
    for (int r = 0; r < R; ++r) acc[r] = block.add(acc[r], sum[r], d[r * blocks + kb], s[r * blocks + kb]);
  }
  for (int r = 0; r < R; ++r) {
    const __m512 v = bias ? _mm512_add_ps(acc[r], _mm512_loadu_ps(bias)) : acc[r];
    store16_bf16(out + r * n, round16_bf16(v));
  }
}

// Rows in tiles of up to 8 (the sums, the accumulators and the block's operands fill the registers), the
// column block's weights (a few kB) reread from L1 by each tile.
template <class F, int R = 8>
inline void int8_rows(int64_t m, const int8_t* q, const float* d, const float* s, int64_t k, const uint8_t* w,
                      const float* bias, c10::BFloat16* out, int64_t n) {
  if constexpr (R > 0) {
    const int64_t blocks = k / 32;
    for (; m >= R; m -= R, q += R * k, d += R * blocks, s += R * blocks, out += R * n)
      int8_tile<F, R>(q, d, s, k, w, bias, out, n);
    if (m > 0) int8_rows<F, R - 1>(m, q, d, s, k, w, bias, out, n);
  }
}

template <class F>
inline void int8_gemm(const c10::BFloat16* x, int64_t m, int64_t k, const uint8_t* w, int64_t columns, const float* bias,
                      c10::BFloat16* out) {
  at::Tensor q = at::empty({m, k}, at::kChar);
  at::Tensor ds = at::empty({2, m, k / 32}, at::kFloat);
  int8_t* qp = q.data_ptr<int8_t>();
  float *dp = ds.data_ptr<float>(), *sp = dp + m * (k / 32);
  quantize_rows(x, m, k, F::kOffset, qp, dp, sp);
  const int64_t column_bytes = (k / 32) * F::kBytes, n = columns * 16;
  // Threads split the columns, each reading its part of the weight once.
  at::parallel_for(0, columns, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      int8_rows<F>(m, qp, dp, sp, k, w + c * column_bytes, bias ? bias + c * 16 : nullptr, out + c * 16, n);
  });
}
#else
constexpr bool kInt8GemmCompiled = false;
#endif

// x [M, K] bfloat16, w [N / 16, K / 32, 320 or 608] int8 from quantized.pack_q4_1_int8 or pack_q8_0_int8 (the
// block size tells them apart), bias [N] or none.
inline at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(kInt8GemmCompiled, "int8_linear needs AVX512-VNNI and AVX512-BF16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "int8_linear: a bfloat16 [M, K] input");
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == at::kChar && w.is_contiguous() &&
                  (w.size(2) == kInt8Q4_1Bytes || w.size(2) == kInt8Q8_0Bytes),
              "int8_linear: packed blocks [N / 16, K / 32, 320 (Q4_1) or 608 (Q8_0)] (int8)");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), columns = w.size(0);
  TORCH_CHECK(w.size(1) * 32 == k, "int8_linear: the input's width is not the weight's");
  at::Tensor out = at::empty({m, columns * 16}, xc.options());
  at::Tensor bias32 = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
#if defined(__AVX512VNNI__) && defined(__AVX512BF16__)
  if (m == 0) return out;  // an LM head asked for no logits (a prefill chunk)
  const c10::BFloat16* xp = xc.data_ptr<c10::BFloat16>();
  const uint8_t* wp = reinterpret_cast<const uint8_t*>(w.data_ptr<int8_t>());
  const float* bp = bias ? bias32.data_ptr<float>() : nullptr;
  if (w.size(2) == kInt8Q4_1Bytes)
    int8_gemm<Q4_1Int8>(xp, m, k, wp, columns, bp, out.data_ptr<c10::BFloat16>());
  else
    int8_gemm<Q8_0Int8>(xp, m, k, wp, columns, bp, out.data_ptr<c10::BFloat16>());
#endif
  return out;
}

}  // namespace adaserve
