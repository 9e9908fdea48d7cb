// Q4_1 weights as shipped, multiplied by bfloat16 rows (models/quantized.py has the layout).
//
// A decode step is a read of the weights: 4-bit blocks are 5 bits a weight where bfloat16 is 16. The
// blocks become bfloat16 pairs in registers (d * q, then + m, each rounded as float32 as the loader's
// dequantization rounds, then to bfloat16 as torch does) and meet the rows in VDPBF16PS in the pair
// kernel's order: the same pairs, summed in the same order, as the bfloat16 path's, so both compute
// the same numbers. Up to 4 rows use each pair straight from registers; more rows first dequantize a
// group of blocks into a scratch in L2 that every row tile then reads.
#pragma once

#include "pair_gemm.h"

#include <vector>

namespace adaserve {

constexpr int64_t kQ4BlockBytes = 320;  // 16 d, 16 m (float16), 16 pairs x 16 columns of nibbles

#if defined(__AVX512BF16__)
// The bfloat16 pairs of one k pair of a 16-column block: `nibbles` holds each column's q_2p (low) and
// q_2p+1 (high). d * q, then + m, each rounded as float32 (the _round_ forms are never contracted into
// an FMA), then both to bfloat16 (nearest even, as torch) and interleaved: lane j = (even_j, odd_j).
inline __m512bh dequantize_q4_pair(const uint8_t* nibbles, __m512 d, __m512 m) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(nibbles)));
  const __m512 even = _mm512_add_round_ps(_mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F))), d, kRound), m, kRound);
  const __m512 odd = _mm512_add_round_ps(_mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4)), d, kRound), m, kRound);
  const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(odd, even);  // even_0..15, then odd_0..15
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                              20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return (__m512bh)_mm512_permutexvar_epi16(interleave, halves);
}

inline __m512 load_half16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// One 16-column block, all of k: q [k / 32, 320] bytes -> out [k / 2, 32] bfloat16 pairs.
inline void dequantize_q4_block(const uint8_t* q, int64_t k, c10::BFloat16* out) {
  for (int64_t kb = 0; kb < k / 32; ++kb, q += kQ4BlockBytes) {
    const __m512 d = load_half16(q), m = load_half16(q + 32);
    for (int p = 0; p < 16; ++p) _mm512_storeu_si512(out + (kb * 16 + p) * 32, (__m512i)dequantize_q4_pair(q + 64 + p * 16, d, m));
  }
}

// R (<= 4) rows x NB column blocks straight from the 4-bit blocks, nothing stored: for few rows, where
// each weight is used R times and a scratch copy would cost more than it saves.
template <int R, int NB>
inline void q4_tile(const c10::BFloat16* x, int64_t k, const uint8_t* q, const float* bias, c10::BFloat16* out, int64_t n) {
  PairSums<R, NB> sums;
  const int64_t block = (k / 32) * kQ4BlockBytes;
  for (int64_t kb = 0; kb < k / 32; ++kb) {
    __m512 d[NB], m[NB];
    for (int b = 0; b < NB; ++b) {
      d[b] = load_half16(q + b * block + kb * kQ4BlockBytes);
      m[b] = load_half16(q + b * block + kb * kQ4BlockBytes + 32);
    }
    for (int p = 0; p < 16; ++p) {
      __m512bh wv[NB];
      for (int b = 0; b < NB; ++b) wv[b] = dequantize_q4_pair(q + b * block + kb * kQ4BlockBytes + 64 + p * 16, d[b], m[b]);
      sums.add(x, k, kb * 32 + 2 * p, wv);
    }
  }
  sums.store(bias, out, n);
}

// Blocks per tile: enough independent sums that the dot products' latency stays hidden, few enough
// that the sums, scales and pairs stay in registers.
constexpr int q4_blocks(int rows) { return rows <= 2 ? 4 : 2; }

template <int R>
inline void q4_tile_blocks(int nb, const c10::BFloat16* x, int64_t k, const uint8_t* q, const float* bias, c10::BFloat16* out,
                           int64_t n) {
  if constexpr (q4_blocks(R) >= 4) {
    if (nb == 4) return q4_tile<R, 4>(x, k, q, bias, out, n);
    if (nb == 3) return q4_tile<R, 3>(x, k, q, bias, out, n);
  }
  if (nb == 2) return q4_tile<R, 2>(x, k, q, bias, out, n);
  q4_tile<R, 1>(x, k, q, bias, out, n);
}
#endif

// x [M, K] bfloat16, q [N / 16, K / 32, 320] uint8 (quantized.pack_q4_1), bias [N] or none.
inline at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& q, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(kPairGemmCompiled, "q4_linear needs AVX512-BF16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "q4_linear: a bfloat16 [M, K] input");
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kByte && q.size(2) == kQ4BlockBytes && q.is_contiguous(),
              "q4_linear: a packed Q4_1 weight [N / 16, K / 32, 320]");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), blocks = q.size(0), n = blocks * 16;
  TORCH_CHECK(q.size(1) * 32 == k, "q4_linear: the input's width is not the weight's");
  at::Tensor out = at::empty({m, n}, xc.options());
  at::Tensor bias32 = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
#if defined(__AVX512BF16__)
  const c10::BFloat16* xp = xc.data_ptr<c10::BFloat16>();
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const float* bp = bias ? bias32.data_ptr<float>() : nullptr;
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  if (m <= 4) {  // straight from the blocks
    const int step = q4_blocks(m);
    at::parallel_for(0, blocks, step, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; b += step) {
        const int nb = static_cast<int>(std::min<int64_t>(step, end - b));
        const uint8_t* qb = qp + b * (k / 32) * kQ4BlockBytes;
        const float* bb = bp ? bp + b * 16 : nullptr;
        switch (m) {
          case 4: q4_tile_blocks<4>(nb, xp, k, qb, bb, op + b * 16, n); break;
          case 3: q4_tile_blocks<3>(nb, xp, k, qb, bb, op + b * 16, n); break;
          case 2: q4_tile_blocks<2>(nb, xp, k, qb, bb, op + b * 16, n); break;
          default: q4_tile_blocks<1>(nb, xp, k, qb, bb, op + b * 16, n); break;
        }
      }
    });
    return out;
  }
  // More rows: each group of four blocks dequantized once into a scratch that stays in L2, every
  // row tile reading it from there.
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    thread_local std::vector<c10::BFloat16> scratch;
    scratch.resize(static_cast<size_t>(4 * k * 16));
    for (int64_t b = begin; b < end; b += 4) {
      const int nb = static_cast<int>(std::min<int64_t>(4, end - b));
      for (int j = 0; j < nb; ++j) dequantize_q4_block(qp + (b + j) * (k / 32) * kQ4BlockBytes, k, scratch.data() + j * k * 16);
      pair_group(nb, xp, m, k, scratch.data(), bp ? bp + b * 16 : nullptr, op + b * 16, n);
    }
  });
#endif
  return out;
}

}  // namespace adaserve
