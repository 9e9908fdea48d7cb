// bfloat16 GEMM built for the few-row products of decode, small token trees and the LM head over them:
// out[M, N] = bf16(x[M, K] W^T + bias); decoder_layer.cpp's packed_linear says for which M it serves.
//
// Why not oneDNN's prepacked op (models/linear.py): at one to a few rows the product is a read of the
// weight, and the time is how close that read runs to the memory bandwidth. oneDNN's few-row path pays
// per-call setup and reads the weight well below the bandwidth llama.cpp reaches on the same machine
// (docs/architecture.md#the-model-runtime). Here the weight is stored once as "pairs" (pack_pairs): 16 output
// columns x 2 consecutive k, 64 bytes, exactly what one VDPBF16PS multiplies against a broadcast
// (x[k], x[k+1]), so the inner loop is contiguous loads and dot products, float32 accumulation.
// Where the CPU has AVX2 and FMA but no AVX512-BF16, pair_gemm_avx2.h computes from the same layout.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "cpu_math.h"
#include "pair_gemm_avx2.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

namespace adaserve {

// W [N, K] -> [N / 16, K / 2, 16, 2]: block b, pair p holds W[16b + j, 2p + i] at [b, p, j, i].
inline at::Tensor pack_pairs(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "pack_pairs: a bfloat16 [N, K] weight");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % 16 == 0 && k % 2 == 0, "pack_pairs: N must be a multiple of 16 and K even");
  return weight.reshape({n / 16, 16, k / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

inline bool pairs_fit(const at::Tensor& pairs, int64_t k) {
  return pairs.defined() && pairs.dim() == 4 && pairs.size(1) * 2 == k;
}

#if defined(__AVX512BF16__)
// A tile's R x NB float32 sums (R rows, NB blocks of 16 columns), kept in registers for the whole k loop.
template <int R, int NB>
struct PairSums {
  __m512 acc[R][NB];

  __attribute__((always_inline)) PairSums() {
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();
  }

  // Adds each row's k pair at element `at` (x[r][at], x[r][at + 1]) times the blocks' pairs `wv`.
  __attribute__((always_inline)) void add(const c10::BFloat16* x, int64_t k, int64_t at, const __m512bh (&wv)[NB]) {
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * k + at, sizeof pair);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xv, wv[b]);
    }
  }

  // out[r, 16 b ..] = bf16(sum + bias).
  __attribute__((always_inline)) void store(const float* bias, c10::BFloat16* out, int64_t n) const {
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < NB; ++b) {
        const __m512 v = bias ? _mm512_add_ps(acc[r][b], _mm512_loadu_ps(bias + b * 16)) : acc[r][b];
        store16_bf16(out + r * n + b * 16, round16_bf16(v));
      }
  }
};

// R rows x NB column blocks of the pairs layout.
template <int R, int NB>
inline void pair_tile(const c10::BFloat16* x, int64_t k, const c10::BFloat16* w, const float* bias, c10::BFloat16* out,
                      int64_t n) {
  PairSums<R, NB> sums;
  const int64_t block = k * 16;  // elements per 16-column block
  for (int64_t p = 0; p < k / 2; ++p) {
    __m512bh wv[NB];
    for (int b = 0; b < NB; ++b) wv[b] = (__m512bh)_mm512_loadu_si512(w + b * block + p * 32);
    sums.add(x, k, 2 * p, wv);
  }
  sums.store(bias, out, n);
}

template <int R>
inline void pair_tile_rows(int nb, const c10::BFloat16* x, int64_t k, const c10::BFloat16* w, const float* bias,
                           c10::BFloat16* out, int64_t n) {
  switch (nb) {
    case 4: return pair_tile<R, 4>(x, k, w, bias, out, n);
    case 3: return pair_tile<R, 3>(x, k, w, bias, out, n);
    case 2: return pair_tile<R, 2>(x, k, w, bias, out, n);
    default: return pair_tile<R, 1>(x, k, w, bias, out, n);
  }
}

// Every row against one group of nb (<= 4) blocks, w pointing at the group's first: within the group
// every 4-row tile reuses the group's weight from cache.
inline void pair_group(int nb, const c10::BFloat16* x, int64_t m, int64_t k, const c10::BFloat16* w, const float* bias,
                       c10::BFloat16* out, int64_t n) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) pair_tile_rows<4>(nb, x + r * k, k, w, bias, out + r * n, n);
  switch (m - r) {
    case 3: pair_tile_rows<3>(nb, x + r * k, k, w, bias, out + r * n, n); break;
    case 2: pair_tile_rows<2>(nb, x + r * k, k, w, bias, out + r * n, n); break;
    case 1: pair_tile_rows<1>(nb, x + r * k, k, w, bias, out + r * n, n); break;
    default: break;
  }
}
#endif

constexpr bool kPairGemmCompiled =
#if defined(__AVX512BF16__) || (defined(__AVX2__) && defined(__FMA__))
    true;
#else
    false;
#endif

// x [M, K] contiguous bfloat16, pairs from pack_pairs, bias [N] or none.
inline at::Tensor pair_linear(const at::Tensor& x, const at::Tensor& pairs, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(kPairGemmCompiled, "pair_linear needs AVX512-BF16 or AVX2 with FMA");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "pair_linear: a bfloat16 [M, K] input");
  const at::Tensor xc = x.contiguous();
  const int64_t m = xc.size(0), k = xc.size(1), blocks = pairs.size(0), n = blocks * 16;
  TORCH_CHECK(pairs_fit(pairs, k), "pair_linear: the input's width is not the weight's");
  at::Tensor out = at::empty({m, n}, xc.options());
  at::Tensor bias32 = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
#if defined(__AVX512BF16__) || (defined(__AVX2__) && defined(__FMA__))
  if (m == 0) return out;  // an LM head asked for no logits (a prefill chunk)
#if defined(__AVX512BF16__)
  const c10::BFloat16* xp = xc.data_ptr<c10::BFloat16>();
#else
  const at::Tensor x32 = xc.to(at::kFloat);  // pair_gemm_avx2.h reads x widened
  const float* xp = x32.data_ptr<float>();
#endif
  const c10::BFloat16* wp = pairs.data_ptr<c10::BFloat16>();
  const float* bp = bias ? bias32.data_ptr<float>() : nullptr;
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  // Threads split the columns (each reads its own part of the weight once).
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; b += 4) {
      const int nb = static_cast<int>(std::min<int64_t>(4, end - b));
      pair_group(nb, xp, m, k, wp + b * k * 16, bp ? bp + b * 16 : nullptr, op + b * 16, n);
    }
  });
#endif
  return out;
}

}  // namespace adaserve
