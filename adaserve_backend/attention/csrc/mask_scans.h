// Scans of a token tree's visibility mask for csrc/paged_attention.cpp (one bool per query and key of
// the uncommitted region): where the visible run ends, where the last visible key is, the largest
// visible score. A byte at a time they cost a prefill about a tenth of its attention; with AVX2 they
// take 32 mask bytes (or 8 scores) a step.
#pragma once

#include "cpu_math.h"

#include <algorithm>
#include <cstdint>

namespace adaserve {

// The first j < n with !vis[j], else n.
inline int64_t first_hidden(const bool* vis, int64_t n) {
  int64_t j = 0;
#if defined(ADASERVE_AVX2)
  for (; j + 32 <= n; j += 32) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vis + j));
    const uint32_t hidden = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(b, _mm256_setzero_si256())));
    if (hidden) return j + __builtin_ctz(hidden);
  }
#endif
  for (; j < n; ++j)
    if (!vis[j]) return j;
  return n;
}

// One past the last j in [from, n) with vis[j], else from.
inline int64_t last_visible(const bool* vis, int64_t from, int64_t n) {
  int64_t j = n;
#if defined(ADASERVE_AVX2)
  for (; j - 32 >= from; j -= 32) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vis + j - 32));
    const uint32_t hidden = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(b, _mm256_setzero_si256())));
    if (hidden != 0xFFFFFFFFu) return j - __builtin_clz(~hidden);
  }
#endif
  for (; j > from; --j)
    if (vis[j - 1]) return j;
  return from;
}

// The largest row[prefix + j] over j < n with vis[j], at least mx.
inline float visible_max(const float* row, const bool* vis, int64_t n, float mx) {
  int64_t j = 0;
#if defined(ADASERVE_AVX2)
  __m256 vmx = _mm256_set1_ps(mx);
  const __m256 low = _mm256_set1_ps(-3.0e38f);
  for (; j + 8 <= n; j += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(vis + j));
    const __m256i seen = _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(b), _mm256_setzero_si256());
    vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(low, _mm256_loadu_ps(row + j), _mm256_castsi256_ps(seen)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmx);
  for (int i = 0; i < 8; ++i) mx = std::max(mx, lanes[i]);
#endif
  for (; j < n; ++j)
    if (vis[j]) mx = std::max(mx, row[j]);
  return mx;
}

}  // namespace adaserve
