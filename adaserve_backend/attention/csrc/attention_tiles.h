// The inner loops of csrc/paged_attention.cpp (its generic float32 path and shared helpers): horizontal
// sums, softmax numerators, prefetching, widening and the float32 score and value tiles.
#pragma once

#include "cpu_math.h"
#include "mask_scans.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif


namespace adaserve {

constexpr int64_t kPrefetchAhead = 32;  // key/value rows requested ahead of use

#if defined(__AVX512F__)
// Sixteen horizontal sums at once: lane j of the result is the sum of v[j]'s lanes. One horizontal
// reduction per dot product (what a plain loop compiles to) cost ~12 cycles per key and query here.
inline __m512 sum16(const __m512* v) {
  __m512 c[4];
  for (int g = 0; g < 4; ++g) {
    const __m512* x = v + 4 * g;
    const __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
    const __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
    c[g] = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
  }
  const __m512 e01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x44), _mm512_shuffle_f32x4(c[0], c[1], 0xEE));
  const __m512 e23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x44), _mm512_shuffle_f32x4(c[2], c[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, 0x88), _mm512_shuffle_f32x4(e01, e23, 0xDD));
}
#endif

// Softmax numerators of a score row in place: exp(x - mx) (all visible x <= mx), 0 for the hidden keys
// (key prefix + j is visible iff vis[j]; vis null: all visible); returns their sum.
// The sum is the same bits for the same query however its keys were laid out: the k-th visible key
// lands in partial sum k % 16 (in key order), as it would with the query's context contiguous. So a
// decode step, a token tree (hidden siblings between a node's ancestors), a prefill chunk and a
// prefix-cache hit all give one request the same output; with partial sums by slot, they did not (a
// repeated greedy request could change its answer).
inline float exp_row(float* row, int64_t n, float mx, int64_t prefix = 0, const bool* vis = nullptr) {
  // keys [0, lead) are all visible: summed in place
  const int64_t lead = vis == nullptr || n <= prefix ? n : prefix + first_hidden(vis, n - prefix);
#if defined(__AVX512F__)
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t pos = 0; pos < n; pos += 16) {
    const __mmask16 m = pos + 16 <= n ? __mmask16(0xFFFF) : __mmask16((1u << (n - pos)) - 1);
    const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + pos), vmx));
    _mm512_mask_storeu_ps(row + pos, m, e);
    const __mmask16 in = pos + 16 <= lead ? m : pos < lead ? __mmask16((1u << (lead - pos)) - 1) : __mmask16(0);
    vsum = _mm512_mask_add_ps(vsum, in, vsum, e);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, vsum);
  for (int64_t pos = lead, k = lead; pos < n; ++pos) {
    if (!vis[pos - prefix]) {
      row[pos] = 0.f;
    } else {
      lanes[k % 16] += row[pos];
      ++k;
    }
  }
  return _mm512_reduce_add_ps(_mm512_load_ps(lanes));
#elif defined(ADASERVE_AVX2)
  // As above on eight lanes: the k-th visible key lands in partial sum k % 8.
  const __m256 vmx = _mm256_set1_ps(mx);
  const __m256i step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t pos = 0; pos < n; pos += 8) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(pos)), step);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n)), idx);
    const __m256 e = exp8_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(row + pos, m), vmx));
    _mm256_maskstore_ps(row + pos, m, e);
    const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(lead)), idx);
    vsum = _mm256_add_ps(vsum, _mm256_and_ps(e, _mm256_castsi256_ps(in)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vsum);
  for (int64_t pos = lead, k = lead; pos < n; ++pos) {
    if (!vis[pos - prefix]) {
      row[pos] = 0.f;
    } else {
      lanes[k % 8] += row[pos];
      ++k;
    }
  }
  float sum = 0.f;
  for (int j = 0; j < 8; ++j) sum += lanes[j];
  return sum;
#else
  float sum = 0.f;
  for (int64_t pos = 0; pos < n; ++pos) {
    row[pos] = pos >= lead && !vis[pos - prefix] ? 0.f : exp_nonpositive(row[pos] - mx);
    sum += row[pos];
  }
  return sum;
#endif
}

// Rows `ahead` positions on are requested now: each row is a few cache lines of a page, so the
// hardware prefetcher alone leaves the loads waiting on memory (measured: over half the kernel's time).
// rows: `count` row pointers.
template <typename T>
inline void prefetch_rows(const T* const* rows, int64_t count, int64_t from, int64_t n, int64_t bytes) {
#if defined(__AVX512F__) || defined(ADASERVE_AVX2)
  const int64_t end = std::min<int64_t>(from + n, count);
  for (int64_t i = from; i < end; ++i)
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(rows[i]) + b, _MM_HINT_T0);
#endif
}

template <typename T>
inline void prefetch_rows(const std::vector<const T*>& rows, int64_t from, int64_t n, int64_t bytes) {
  prefetch_rows(rows.data(), static_cast<int64_t>(rows.size()), from, n, bytes);
}

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
#if defined(__AVX512F__)
  if (n % 16 == 0) {
    for (int64_t d = 0; d < n; d += 16) _mm512_storeu_ps(dst + d, load16(src + d));
    return;
  }
#elif defined(ADASERVE_AVX2)
  if (n % 8 == 0) {
    for (int64_t d = 0; d < n; d += 8) _mm256_storeu_ps(dst + d, load8(src + d));
    return;
  }
#endif
  for (int64_t d = 0; d < n; ++d) dst[d] = widen(src[d]);
}

// scores[r * stride + j] = q[r] . keys[j] for j < n (keys: n rows of dim floats, n <= 16).
inline void tile_scores(const float* q, int64_t rows, const float* keys, int64_t n, int64_t dim, float* scores,
                        int64_t stride) {
#if defined(__AVX512F__)
  if (dim % 16 == 0) {
    const __mmask16 keep = static_cast<__mmask16>((1u << n) - 1);
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * dim;
      __m512 acc[16];
      for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t d = 0; d < dim; d += 16) {
        const __m512 qv = _mm512_loadu_ps(qr + d);
        for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(keys + j * dim + d), acc[j]);
      }
      _mm512_mask_storeu_ps(scores + r * stride, keep, sum16(acc));
    }
    return;
  }
#elif defined(ADASERVE_AVX2)
  if (dim % 8 == 0) {
    alignas(32) float out[8];
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * dim;
      for (int64_t j0 = 0; j0 < n; j0 += 8) {  // eight keys at a time: eight sums in registers
        const float* kj = keys + j0 * dim;  // keys beyond n are rows of the tile buffer: read, not stored
        __m256 acc[8];
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
        for (int64_t d = 0; d < dim; d += 8) {
          const __m256 qv = _mm256_loadu_ps(qr + d);
          for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kj + j * dim + d), acc[j]);
        }
        _mm256_store_ps(out, sum8(acc));
        for (int64_t j = 0; j < std::min<int64_t>(8, n - j0); ++j) scores[r * stride + j0 + j] = out[j];
      }
    }
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      float dot = 0.f;
      for (int64_t d = 0; d < dim; ++d) dot += q[r * dim + d] * keys[j * dim + d];
      scores[r * stride + j] = dot;
    }
}

#if defined(ADASERVE_AVX2)
// tile_accumulate for dim = 8 C.
template <int C>
inline void tile_accumulate8(float* acc, int64_t rows, const float* p, int64_t stride, const float* values, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * stride;
    float* ar = acc + r * 8 * C;
    __m256 a[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) a[c] = _mm256_loadu_ps(ar + 8 * c);
    for (int64_t j = 0; j < n; ++j) {
      if (pr[j] == 0.f) continue;  // keys this query does not see (other tree branches)
      const __m256 w = _mm256_set1_ps(pr[j]);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) a[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values + j * 8 * C + 8 * c), a[c]);
    }
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(ar + 8 * c, a[c]);
  }
}
#endif

// acc[r] += sum_j p[r * stride + j] * values[j] for every row (values: n rows of dim floats, n <= 16).
inline void tile_accumulate(float* acc, int64_t rows, const float* p, int64_t stride, const float* values, int64_t n,
                            int64_t dim) {
#if defined(__AVX512F__)
  if (dim % 16 == 0 && dim <= 128) {  // a[8] below
    for (int64_t r = 0; r < rows; ++r) {
      const float* pr = p + r * stride;
      float* ar = acc + r * dim;
      __m512 a[8];
      const int64_t chunks = dim / 16;
      for (int64_t c = 0; c < chunks; ++c) a[c] = _mm512_loadu_ps(ar + 16 * c);
      for (int64_t j = 0; j < n; ++j) {
        if (pr[j] == 0.f) continue;  // keys this query does not see (other tree branches)
        const __m512 w = _mm512_set1_ps(pr[j]);
        for (int64_t c = 0; c < chunks; ++c) a[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(values + j * dim + 16 * c), a[c]);
      }
      for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(ar + 16 * c, a[c]);
    }
    return;
  }
#elif defined(ADASERVE_AVX2)
  switch (dim) {  // the row's sums stay in registers over the tile's keys
    case 32: return tile_accumulate8<4>(acc, rows, p, stride, values, n);
    case 64: return tile_accumulate8<8>(acc, rows, p, stride, values, n);
    case 96: return tile_accumulate8<12>(acc, rows, p, stride, values, n);
    default: break;
  }
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const float w = p[r * stride + j];
      for (int64_t d = 0; d < dim; ++d) acc[r * dim + d] += w * values[j * dim + d];
    }
}

}  // namespace adaserve
