// Math shared by the project's CPU kernels (attention/csrc, models/csrc): exp without libm calls so it
// vectorizes, bfloat16 widening and rounding (round to nearest even, as torch rounds).
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// A CPU with AVX2 and FMA but not AVX-512: the kernels' eight-lane paths (without them their scalar
// sums do not vectorize, being ordered, and ran several times below the work's share).
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define ADASERVE_AVX2 1
#endif

namespace adaserve {

// exp for x <= 0: 2^(x log2 e) split into integer and fractional parts, the fraction by a degree-6
// polynomial (relative error ~2e-7, below float32's rounding of what follows); x below -87 gives 0.
// kExpPoly: its coefficients, highest degree first (scalar and AVX-512).
constexpr float kExpPoly[7] = {1.5403530393381606e-4f, 1.3333558146428443e-3f, 9.6181291076284772e-3f,
                               5.5504108664821580e-2f, 2.4022650695910071e-1f, 6.9314718055994531e-1f, 1.0f};
constexpr float kExpMin = -87.0f, kLog2e = 1.4426950408889634f;

inline float exp_nonpositive(float x) {
  const float t = std::max(x, kExpMin) * kLog2e;
  const float fi = std::floor(t);
  const float f = t - fi;
  float p = kExpPoly[0];
  for (int i = 1; i < 7; ++i) p = p * f + kExpPoly[i];
  const int32_t e = static_cast<int32_t>(fi) + 127;
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// exp to about one float32 ulp, any argument (e^x rounds to 0 below -103, to inf above 88.7): Cody-Waite
// range reduction x = n ln2 + r, |r| <= ln2 / 2, and e^r by its Taylor series to r^7 (truncation error
// below 6e-9). For SiLU, whose result is rounded to bfloat16 next: an exp ulps away from libm's moves
// that rounding often enough to matter (measured: 19 of 153600 activations of a real layer).
constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187045e-6f;
constexpr float kTaylor[8] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};

inline float exp_accurate(float x) {
  x = std::min(std::max(x, -104.f), 89.f);
  const float n = std::nearbyint(x * kLog2e);
  const float r = std::fma(n, -kLn2Lo, std::fma(n, -kLn2Hi, x));
  float p = kTaylor[0];
  for (int i = 1; i < 8; ++i) p = std::fma(p, r, kTaylor[i]);
  return std::ldexp(p, static_cast<int>(n));
}

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline c10::BFloat16 round_bf16(float x) { return c10::BFloat16(x); }

#if defined(__AVX512F__)
inline __m512 exp16_nonpositive(__m512 x) {
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kLog2e));
  const __m512 fi = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, fi);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExpPoly[i]));
  return _mm512_scalef_ps(p, fi);
}

inline __m512 exp16_accurate(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.f)), _mm512_set1_ps(89.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  __m512 p = _mm512_set1_ps(kTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kTaylor[i]));
  return _mm512_scalef_ps(p, n);
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Sixteen floats rounded to bfloat16 (nearest even; NaN stays NaN) and widened back: what a torch
// bfloat16 op stores, for the next step of a fused computation to read.
inline __m512 round16_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(r), _mm512_set1_ps(NAN));
}

inline void store16_bf16(c10::BFloat16* p, __m512 x) {  // x must already be a bfloat16 value (round16_bf16)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// 2^n for integer-valued n in [-150, 128], times p: in two exponent-bit factors so each stays a normal
// float, rounded once at the end as scalef (and ldexp) round.
inline __m256 scale8(__m256 p, __m256 n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}

// exp_accurate on eight lanes, the same bits.
inline __m256 exp8_accurate(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.f)), _mm256_set1_ps(89.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  __m256 p = _mm256_set1_ps(kTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kTaylor[i]));
  return scale8(p, n);
}

// Eight floats rounded to bfloat16 (nearest even; NaN stays NaN), as round16_bf16.
inline __m256 round8_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_set1_ps(NAN), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

inline void store8_bf16(c10::BFloat16* p, __m256 x) {  // x must already be a bfloat16 value (round8_bf16)
  const __m256i h = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

// exp_nonpositive on eight lanes (AVX2 has no scalef: 2^fi is built in the exponent bits).
inline __m256 exp8_nonpositive(__m256 x) {
  const __m256 t = _mm256_mul_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kLog2e));
  const __m256 fi = _mm256_floor_ps(t);
  const __m256 f = _mm256_sub_ps(t, fi);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExpPoly[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fi), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The sum of v's eight lanes.
inline float reduce8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Lane j of the result: the sum of v[j]'s lanes.
inline __m256 sum8(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
#endif

}  // namespace adaserve
