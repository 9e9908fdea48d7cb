// The inner loops of paged_attention.cpp's bfloat16 path (AVX512-BF16), with every size a template
// argument: head dim = 32 * H, R query rows at a time. With sizes known at compile time the accumulators
// stay in registers; with runtime loop bounds (the earlier version) they lived on the stack, and a tree
// of 8 queries over 300 keys cost 153 us per layer, ~12 GFLOP/s, where decode steps were memory-bound.
#pragma once

#include "attention_tiles.h"
#include "cpu_math.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace adaserve {

// Loops over compile-time sizes are unrolled before GCC splits arrays into registers: without it, GCC 12
// kept every accumulator array in memory as well and stored each register back after every FMA
// (24 stores per value row in p.V, which then ran at about half speed).
#define UNROLLED _Pragma("GCC unroll 64")

// In place: r[j] (16 x 32-bit lanes) becomes column j of the 16 x 16 matrix whose rows were r.
inline void transpose16x16(__m512i* r) {
  __m512i t[16];
  UNROLLED for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  UNROLLED for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // r[4g + e], 128-bit lane k: element 4k + e of rows 4g..4g+3
  UNROLLED for (int e = 0; e < 4; ++e) {
    t[e] = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x88);
    t[4 + e] = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xdd);
    t[8 + e] = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x88);
    t[12 + e] = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xdd);
  }
  UNROLLED for (int e = 0; e < 4; ++e) {
    r[e] = _mm512_shuffle_i32x4(t[e], t[8 + e], 0x88);
    r[4 + e] = _mm512_shuffle_i32x4(t[4 + e], t[12 + e], 0x88);
    r[8 + e] = _mm512_shuffle_i32x4(t[e], t[8 + e], 0xdd);
    r[12 + e] = _mm512_shuffle_i32x4(t[4 + e], t[12 + e], 0xdd);
  }
}

// kt[c * 16 + j]: the c-th bfloat16 pair of key j (n <= 16 keys; lanes past n are zero). Transposed once
// per 16 keys so each query row then takes one VDPBF16PS per pair for all 16 scores, with no
// horizontal sums.
template <int H>
inline void transpose_keys(const c10::BFloat16* const* keys, int64_t n, uint32_t* kt) {
  UNROLLED for (int h = 0; h < H; ++h) {
    __m512i r[16];
    UNROLLED for (int j = 0; j < 16; ++j) r[j] = j < n ? _mm512_loadu_si512(keys[j] + 32 * h) : _mm512_setzero_si512();
    transpose16x16(r);
    UNROLLED for (int c = 0; c < 16; ++c) _mm512_store_si512(kt + (16 * h + c) * 16, r[c]);
  }
}

// scores[r * stride + j] = scale * q[r] . key j for R query rows and the n keys of a transposed tile.
template <int H, int R>
inline void tile_scores_bf16(const c10::BFloat16* const* q, const uint32_t* kt, int64_t n, float scale, float* scores,
                             int64_t stride) {
  __m512 acc[R];
  UNROLLED for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  UNROLLED for (int c = 0; c < 16 * H; ++c) {
    const __m512bh k = (__m512bh)_mm512_load_si512(kt + 16 * c);
    UNROLLED for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, q[r] + 2 * c, sizeof pair);
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(static_cast<int>(pair)), k);
    }
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << n) - 1);
  UNROLLED for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(scores + r * stride, keep, _mm512_mul_ps(acc[r], _mm512_set1_ps(scale)));
}

// out[r] = (sum_pos p[r * stride + pos] * value[pos]) * inv[r], rounded to bfloat16, for R query rows
// over kv_len value rows (C = dim / 16 float32 registers per row).
template <int C, int R>
inline void rows_times_values(const float* p, int64_t stride, const c10::BFloat16* const* values, int64_t kv_len,
                              const float* inv, c10::BFloat16* const* out) {
  __m512 acc[R][C];
  UNROLLED for (int r = 0; r < R; ++r)
    UNROLLED for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t p0 = 0; p0 < kv_len; p0 += 16) {
    prefetch_rows(values, kv_len, p0 + kPrefetchAhead, 16, 32 * C);  // a value row is 32 * C bytes of a page
    const int64_t end = std::min(p0 + 16, kv_len);
    for (int64_t pos = p0; pos < end; ++pos) {
      __m512 val[C];
      UNROLLED for (int c = 0; c < C; ++c) val[c] = load16(values[pos] + 16 * c);
      UNROLLED for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(p[r * stride + pos]);
        UNROLLED for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(w, val[c], acc[r][c]);
      }
    }
  }
  UNROLLED for (int r = 0; r < R; ++r) {
    const __m512 s = _mm512_set1_ps(inv[r]);
    UNROLLED for (int c = 0; c < C; ++c) store16_bf16(out[r] + 16 * c, round16_bf16(_mm512_mul_ps(acc[r][c], s)));
  }
}

// The same loops for a runtime row count 1..R (the last block of a task): one instantiation per count.
template <int H, int R>
inline void tile_scores_upto(int64_t rows, const c10::BFloat16* const* q, const uint32_t* kt, int64_t n, float scale,
                             float* scores, int64_t stride) {
  if constexpr (R > 1)
    if (rows < R) return tile_scores_upto<H, R - 1>(rows, q, kt, n, scale, scores, stride);
  tile_scores_bf16<H, R>(q, kt, n, scale, scores, stride);
}

template <int C, int R>
inline void rows_times_values_upto(int64_t rows, const float* p, int64_t stride, const c10::BFloat16* const* values,
                                   int64_t kv_len, const float* inv, c10::BFloat16* const* out) {
  if constexpr (R > 1)
    if (rows < R) return rows_times_values_upto<C, R - 1>(rows, p, stride, values, kv_len, inv, out);
  rows_times_values<C, R>(p, stride, values, kv_len, inv, out);
}

}  // namespace adaserve
#endif
