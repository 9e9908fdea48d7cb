// The pair kernel (pair_gemm.h) for a CPU with AVX2 and FMA but no AVX512-BF16, where it serves every
// row count: oneDNN packs no bfloat16 weight there and torch's bfloat16 GEMM widens element by element,
// several times slower than float32 (docs/architecture.md#the-model-runtime).
//
// A bfloat16 is the top half of a float32, so each 32-byte half of a pair row (8 columns x 2 k) widens
// in registers: the even k by a shift, the odd by a mask. Few rows meet those widened halves directly
// (the product is a read of the weight). From kWidenRows rows on, each 16-column block is first widened
// once into a float32 [K, 16] buffer and 6-row tiles run the classic 6 x 16 float32 kernel over it (12
// sums in registers, one broadcast per two FMAs), which the in-register widening's extra broadcasts
// and shifts kept well below. Both paths add each row's products in the same order (k ascending) into
// the same float32 sums, so a row's result does not depend on how many rows share its product.
#pragma once

#include <torch/extension.h>

#include "cpu_math.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512BF16__)
#include <immintrin.h>

namespace adaserve {

constexpr int64_t kWidenRows = 6;

// The 32-byte half of a pair row at p (8 columns x 2 k) as float32: even k, odd k.
__attribute__((always_inline)) inline void widen_pairs(const c10::BFloat16* p, __m256& even, __m256& odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
}

// R rows x NB blocks of 16 columns straight from the pairs, x widened to float32.
template <int R, int NB>
inline void pair_tile(const float* x, int64_t k, const c10::BFloat16* w, const float* bias, c10::BFloat16* out,
                      int64_t n) {
  __m256 acc[R][NB][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) acc[r][b][0] = acc[r][b][1] = _mm256_setzero_ps();
  const int64_t block = k * 16;  // elements per 16-column block
  for (int64_t p = 0; p < k / 2; ++p) {
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256 even, odd;
        widen_pairs(w + b * block + p * 32 + h * 16, even, odd);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          acc[r][b][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + r * k + 2 * p + 1), odd,
                                         _mm256_fmadd_ps(_mm256_broadcast_ss(x + r * k + 2 * p), even, acc[r][b][h]));
      }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int64_t col = b * 16 + h * 8;
        store8_bf16(out + r * n + col, round8_bf16(bias ? _mm256_add_ps(acc[r][b][h], _mm256_loadu_ps(bias + col)) : acc[r][b][h]));
      }
}

// One block's pairs [K / 2, 16, 2] as float32 [K, 16].
inline void widen_block(const c10::BFloat16* w, int64_t k, float* wide) {
  for (int64_t p = 0; p < k / 2; ++p)
    for (int h = 0; h < 2; ++h) {
      __m256 even, odd;
      widen_pairs(w + p * 32 + h * 16, even, odd);
      _mm256_storeu_ps(wide + 2 * p * 16 + h * 8, even);
      _mm256_storeu_ps(wide + (2 * p + 1) * 16 + h * 8, odd);
    }
}

// R rows x one block of 16 columns from the widened block.
template <int R>
inline void wide_tile(const float* x, int64_t k, const float* wide, const float* bias, c10::BFloat16* out, int64_t n) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const __m256 w0 = _mm256_loadu_ps(wide + i * 16), w1 = _mm256_loadu_ps(wide + i * 16 + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * k + i);
      acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
      store8_bf16(out + r * n + h * 8, round8_bf16(bias ? _mm256_add_ps(acc[r][h], _mm256_loadu_ps(bias + h * 8)) : acc[r][h]));
}

// Every row against one group of nb (<= 4) blocks, w pointing at the group's first.
inline void pair_group(int nb, const float* x, int64_t m, int64_t k, const c10::BFloat16* w, const float* bias,
                       c10::BFloat16* out, int64_t n) {
  const int64_t block = k * 16;
  auto at = [&](int b) { return bias ? bias + b * 16 : nullptr; };
  if (m >= kWidenRows) {
    thread_local std::vector<float> wide;
    wide.resize(static_cast<size_t>(block));
    for (int b = 0; b < nb; ++b) {
      widen_block(w + b * block, k, wide.data());
      int64_t r = 0;
      for (; r + 6 <= m; r += 6) wide_tile<6>(x + r * k, k, wide.data(), at(b), out + r * n + b * 16, n);
      switch (m - r) {
        case 5: wide_tile<5>(x + r * k, k, wide.data(), at(b), out + r * n + b * 16, n); break;
        case 4: wide_tile<4>(x + r * k, k, wide.data(), at(b), out + r * n + b * 16, n); break;
        case 3: wide_tile<3>(x + r * k, k, wide.data(), at(b), out + r * n + b * 16, n); break;
        case 2: wide_tile<2>(x + r * k, k, wide.data(), at(b), out + r * n + b * 16, n); break;
        case 1: wide_tile<1>(x + r * k, k, wide.data(), at(b), out + r * n + b * 16, n); break;
        default: break;
      }
    }
    return;
  }
  // Fewer rows: a 4-row tile takes one block at a time, the last rows take blocks two or four at a time,
  // so even a single row keeps 8 independent sums in flight.
  int64_t r = 0;
  for (; r + 4 <= m; r += 4)
    for (int b = 0; b < nb; ++b) pair_tile<4, 1>(x + r * k, k, w + b * block, at(b), out + r * n + b * 16, n);
  const int64_t left = m - r;
  int b = 0;
  if (left == 1) {
    for (; b + 4 <= nb; b += 4) pair_tile<1, 4>(x + r * k, k, w + b * block, at(b), out + r * n + b * 16, n);
    for (; b + 2 <= nb; b += 2) pair_tile<1, 2>(x + r * k, k, w + b * block, at(b), out + r * n + b * 16, n);
    for (; b < nb; ++b) pair_tile<1, 1>(x + r * k, k, w + b * block, at(b), out + r * n + b * 16, n);
  } else if (left == 2) {
    for (; b + 2 <= nb; b += 2) pair_tile<2, 2>(x + r * k, k, w + b * block, at(b), out + r * n + b * 16, n);
    for (; b < nb; ++b) pair_tile<2, 1>(x + r * k, k, w + b * block, at(b), out + r * n + b * 16, n);
  } else if (left == 3) {
    for (; b < nb; ++b) pair_tile<3, 1>(x + r * k, k, w + b * block, at(b), out + r * n + b * 16, n);
  }
}

}  // namespace adaserve
#endif
