// GGUF weights as shipped (Q4_1, Q8_0), multiplied by bfloat16 rows (models/quantized.py has the layouts).
//
// A decode step is a read of the weights: Q4_1 blocks are 5 bits a weight, Q8_0 8.5, bfloat16 16. The
// blocks become bfloat16 pairs in registers, rounded exactly as the loader's dequantization and torch's
// bfloat16 cast round them, and meet the rows in VDPBF16PS in the pair kernel's order: the same pairs,
// summed in the same order, as the bfloat16 path's, so every packing computes the same numbers. Up to 4
// rows use each pair straight from registers; more rows first dequantize a group of blocks into a
// scratch in L2 that every row tile then reads.
//
// Both layouts take 16 output columns and one 32-weight block at a time, and store each k pair's
// weights so that they widen straight into the lane order VDPBF16PS wants: the low half's float lane
// i holds column i / 2's weight k = 2p + i % 2, the high half's column 8 + i / 2's.
#pragma once

#include "pair_gemm.h"

#include <vector>

namespace adaserve {

#if defined(__AVX512BF16__)
inline __m512 load_half16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// 16 columns' float16 scales, each spread over the two lanes its column's pair takes in either half.
inline __m512 spread_low(__m512 v) {
  return _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), v);
}
inline __m512 spread_high(__m512 v) {
  return _mm512_permutexvar_ps(_mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8), v);
}

// Q4_1: 16 d, 16 m (float16), then per k pair 16 bytes, byte i holding the low half's lane i (low
// nibble) and the high half's (high nibble). w = d * q + m in one FMA rounds as the loader's d * q,
// then + m: d (11 significant bits) times q (4 bits) is exact in float32.
struct Q4_1 {
  static constexpr int64_t kBytes = 320;
  __m512 d_lo, d_hi, m_lo, m_hi;
  __attribute__((always_inline)) void load(const uint8_t* block) {
    const __m512 d = load_half16(block), m = load_half16(block + 32);
    d_lo = spread_low(d), d_hi = spread_high(d), m_lo = spread_low(m), m_hi = spread_high(m);
  }
  __attribute__((always_inline)) __m512bh pair(const uint8_t* block, int p) const {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 64 + p * 16)));
    const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F))), d_lo, m_lo);
    const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4)), d_hi, m_hi);
    return _mm512_cvtne2ps_pbh(hi, lo);  // nearest even, as torch
  }
};

// Q8_0: 16 d (float16), then per k pair 32 signed bytes, the low half's 16 lanes then the high half's.
// w = d * q: 11 significant bits times 8, exact in float32, as gguf-py's dequantization computes it.
struct Q8_0 {
  static constexpr int64_t kBytes = 544;
  __m512 d_lo, d_hi;
  __attribute__((always_inline)) void load(const uint8_t* block) {
    const __m512 d = load_half16(block);
    d_lo = spread_low(d), d_hi = spread_high(d);
  }
  __attribute__((always_inline)) __m512bh pair(const uint8_t* block, int p) const {
    const uint8_t* q = block + 32 + p * 32;
    const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))), d_lo);
    const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)))), d_hi);
    return _mm512_cvtne2ps_pbh(hi, lo);
  }
};

// One 16-column block, all of k: q [k / 32, F::kBytes] -> out [k / 2, 32] bfloat16 pairs.
template <class F>
inline void dequantize_column_block(const uint8_t* q, int64_t k, c10::BFloat16* out) {
  for (int64_t kb = 0; kb < k / 32; ++kb, q += F::kBytes) {
    F scales;
    scales.load(q);
    for (int p = 0; p < 16; ++p) _mm512_storeu_si512(out + (kb * 16 + p) * 32, (__m512i)scales.pair(q, p));
  }
}

// R (<= 4) rows x NB column blocks straight from the blocks, nothing stored: for few rows, where each
// weight is used R times and a scratch copy would cost more than it saves.
template <class F, int R, int NB>
inline void block_tile(const c10::BFloat16* x, int64_t k, const uint8_t* q, const float* bias, c10::BFloat16* out, int64_t n) {
  PairSums<R, NB> sums;
  const int64_t column_block = (k / 32) * F::kBytes;
  for (int64_t kb = 0; kb < k / 32; ++kb) {
    F scales[NB];
    for (int b = 0; b < NB; ++b) scales[b].load(q + b * column_block + kb * F::kBytes);
    for (int p = 0; p < 16; ++p) {
      __m512bh wv[NB];
      for (int b = 0; b < NB; ++b) wv[b] = scales[b].pair(q + b * column_block + kb * F::kBytes, p);
      sums.add(x, k, kb * 32 + 2 * p, wv);
    }
  }
  sums.store(bias, out, n);
}

// Column blocks per tile: enough independent sums that the dot products' latency stays hidden, few
// enough that the sums, scales and pairs stay in registers.
constexpr int blocks_per_tile(int rows) { return rows <= 2 ? 4 : 2; }

template <class F, int R>
inline void block_tiles(int nb, const c10::BFloat16* x, int64_t k, const uint8_t* q, const float* bias, c10::BFloat16* out,
                        int64_t n) {
  if constexpr (blocks_per_tile(R) >= 4) {
    if (nb == 4) return block_tile<F, R, 4>(x, k, q, bias, out, n);
    if (nb == 3) return block_tile<F, R, 3>(x, k, q, bias, out, n);
  }
  if (nb == 2) return block_tile<F, R, 2>(x, k, q, bias, out, n);
  block_tile<F, R, 1>(x, k, q, bias, out, n);
}

template <class F>
inline void block_gemm(const c10::BFloat16* xp, int64_t m, int64_t k, const uint8_t* qp, int64_t blocks, const float* bp,
                       c10::BFloat16* op) {
  const int64_t n = blocks * 16, column_block = (k / 32) * F::kBytes;
  if (m <= 4) {  // straight from the blocks
    const int step = blocks_per_tile(m);
    at::parallel_for(0, blocks, step, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; b += step) {
        const int nb = static_cast<int>(std::min<int64_t>(step, end - b));
        const uint8_t* qb = qp + b * column_block;
        const float* bb = bp ? bp + b * 16 : nullptr;
        switch (m) {
          case 4: block_tiles<F, 4>(nb, xp, k, qb, bb, op + b * 16, n); break;
          case 3: block_tiles<F, 3>(nb, xp, k, qb, bb, op + b * 16, n); break;
          case 2: block_tiles<F, 2>(nb, xp, k, qb, bb, op + b * 16, n); break;
          default: block_tiles<F, 1>(nb, xp, k, qb, bb, op + b * 16, n); break;
        }
      }
    });
    return;
  }
  // More rows: each group of four column blocks dequantized once into a scratch that stays in L2, every
  // row tile reading it from there.
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    thread_local std::vector<c10::BFloat16> scratch;
    scratch.resize(static_cast<size_t>(4 * k * 16));
    for (int64_t b = begin; b < end; b += 4) {
      const int nb = static_cast<int>(std::min<int64_t>(4, end - b));
      for (int j = 0; j < nb; ++j) dequantize_column_block<F>(qp + (b + j) * column_block, k, scratch.data() + j * k * 16);
      pair_group(nb, xp, m, k, scratch.data(), bp ? bp + b * 16 : nullptr, op + b * 16, n);
    }
  });
}
#endif

constexpr bool kBlockGemmCompiled =
#if defined(__AVX512BF16__)
    true;
#else
    false;
#endif

// x [M, K] bfloat16, q [N / 16, K / 32, bytes] uint8 (quantized.pack_q4_1 or pack_q8_0: the block size
// tells them apart), bias [N] or none.
inline at::Tensor block_linear(const at::Tensor& x, const at::Tensor& q, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(kBlockGemmCompiled, "block_linear needs AVX512-BF16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "block_linear: a bfloat16 [M, K] input");
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kByte && q.is_contiguous(),
              "block_linear: packed GGUF blocks [N / 16, K / 32, bytes]");
  const int64_t bytes = q.size(2);
  TORCH_CHECK(bytes == 320 || bytes == 544, "block_linear: blocks of 320 (Q4_1) or 544 (Q8_0) bytes, got ", bytes);
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), blocks = q.size(0);
  TORCH_CHECK(q.size(1) * 32 == k, "block_linear: the input's width is not the weight's");
  at::Tensor out = at::empty({m, blocks * 16}, xc.options());
  at::Tensor bias32 = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
#if defined(__AVX512BF16__)
  if (m == 0) return out;  // an LM head asked for no logits (a prefill chunk)
  const c10::BFloat16* xp = xc.data_ptr<c10::BFloat16>();
  const float* bp = bias ? bias32.data_ptr<float>() : nullptr;
  if (bytes == Q4_1::kBytes)
    block_gemm<Q4_1>(xp, m, k, q.data_ptr<uint8_t>(), blocks, bp, out.data_ptr<c10::BFloat16>());
  else
    block_gemm<Q8_0>(xp, m, k, q.data_ptr<uint8_t>(), blocks, bp, out.data_ptr<c10::BFloat16>());
#endif
  return out;
}

}  // namespace adaserve
