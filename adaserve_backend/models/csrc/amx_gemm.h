// bfloat16 GEMM on AMX tiles, one kernel for every row count: out[M, N] = bf16(x[M, K] W^T + bias).
//
// Why a kernel of our own when oneDNN has AMX paths: oneDNN picks a different algorithm by row count
// (and the pair kernel serves few rows faster than oneDNN), so a token's logits changed with how many
// other rows shared its step: identical greedy requests gave different text under load. Here each
// output element is the same sequence of TDPBF16PS accumulations over k, in the same order, whatever
// M is, because rows are independent inside a tile and M only decides how many tiles are filled.
//
// It reads the pair layout (pair_gemm.h) unchanged: a 16-column block's 16 consecutive k pairs are
// 16 rows of 64 bytes, exactly one B tile in the VNNI layout TDPBF16PS wants. Inputs are padded to whole
// 16-row tiles (rows are independent, so padding changes no real row); each thread takes groups of up
// to four column blocks and keeps the group's weight in L2 while every row tile passes over it.
// Needs K a multiple of 32 (one A tile's width); the caller falls back to the pair kernel otherwise.
#pragma once

#include "pair_gemm.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ADASERVE_AMX 1
#endif

namespace adaserve {

constexpr bool kAmxCompiled =
#if defined(ADASERVE_AMX)
    true;
#else
    false;
#endif

#if defined(ADASERVE_AMX)
// Linux gives the tile registers only to a process that asks for them (arch_prctl ARCH_REQ_XCOMP_PERM).
inline bool amx_permitted() {
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: four 16 x 16 float32 sums; 4 (5 too for a second row tile): 16 rows x 32 bfloat16 of x;
// 5-7: 16 k pairs x 16 columns of the weight.
inline void configure_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// NR (1 or 2) 16-row tiles of x (row stride k) against NB consecutive column blocks (w at the first,
// blocks k * 16 elements apart), NR * NB <= 4; sums stored as [NR * 16, NB * 16] floats. Every sum is
// the same TDPBF16PS sequence over k from zero whatever NR and NB, so the shapes give identical bits.
template <int NR, int NB>
inline void amx_tile(const c10::BFloat16* x, int64_t k, const c10::BFloat16* w, float* sums) {
  static_assert((NR == 1 && NB <= 4) || (NR == 2 && NB <= 2), "four sum tiles at most");
  const int64_t block = k * 16;
  _tile_zero(0);  // the sums this shape uses: 0..NB-1, and 2..2+NB-1 for a second row tile
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NB > 2 || NR == 2) _tile_zero(2);
  if constexpr (NB > 3 || (NR == 2 && NB > 1)) _tile_zero(3);
  for (int64_t c = 0; c < k / 32; ++c) {
    const c10::BFloat16* wc = w + c * 512;  // 16 pairs x 16 columns x 2
    _tile_loadd(4, x + c * 32, k * 2);
    if constexpr (NR == 2) {  // sums 0-1: the first row tile, 2-3: the second; weight tiles 6-7 serve both
      _tile_loadd(6, wc, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, x + 16 * k + c * 32, k * 2);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NB > 1) {
        _tile_loadd(7, wc + block, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    } else {
      _tile_loadd(5, wc, 64);
      _tile_dpbf16ps(0, 4, 5);
      if constexpr (NB > 1) {
        _tile_loadd(6, wc + block, 64);
        _tile_dpbf16ps(1, 4, 6);
      }
      if constexpr (NB > 2) {
        _tile_loadd(7, wc + 2 * block, 64);
        _tile_dpbf16ps(2, 4, 7);
      }
      if constexpr (NB > 3) {
        _tile_loadd(5, wc + 3 * block, 64);
        _tile_dpbf16ps(3, 4, 5);
      }
    }
  }
  const int64_t stride = NB * 64;  // bytes per row of `sums`
  float* second = sums + 16 * NB * 16;
  _tile_stored(0, sums, stride);
  if constexpr (NR == 2) {
    _tile_stored(2, second, stride);
    if constexpr (NB > 1) _tile_stored(1, sums + 16, stride);
    if constexpr (NB > 1) _tile_stored(3, second + 16, stride);
  } else {
    if constexpr (NB > 1) _tile_stored(1, sums + 16, stride);
    if constexpr (NB > 2) _tile_stored(2, sums + 32, stride);
    if constexpr (NB > 3) _tile_stored(3, sums + 48, stride);
  }
}

inline void amx_tiles(int nr, int nb, const c10::BFloat16* x, int64_t k, const c10::BFloat16* w, float* sums) {
  if (nr == 2) return nb == 2 ? amx_tile<2, 2>(x, k, w, sums) : amx_tile<2, 1>(x, k, w, sums);
  switch (nb) {
    case 4: return amx_tile<1, 4>(x, k, w, sums);
    case 3: return amx_tile<1, 3>(x, k, w, sums);
    case 2: return amx_tile<1, 2>(x, k, w, sums);
    default: return amx_tile<1, 1>(x, k, w, sums);
  }
}

// sums [rows, width] + bias, rounded into out (row stride n).
inline void amx_emit(const float* sums, int64_t rows, int64_t width, const float* bias, c10::BFloat16* out, int64_t n) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < width; j += 16) {
      __m512 v = _mm512_loadu_ps(sums + i * width + j);
      if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + j));
      store16_bf16(out + i * n + j, round16_bf16(v));
    }
}
#else
inline bool amx_permitted() { return false; }
#endif

inline bool amx_fits(const at::Tensor& pairs, int64_t k) { return pairs_fit(pairs, k) && k % 32 == 0; }

// x [M, K] bfloat16, pairs from pack_pairs, bias [N] or none; K a multiple of 32.
inline at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& pairs, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(kAmxCompiled && amx_permitted(), "amx_linear needs a CPU with AMX-BF16 that Linux lets use it");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "amx_linear: a bfloat16 [M, K] input");
  const int64_t m = x.size(0), k = x.size(1), blocks = pairs.size(0), n = blocks * 16;
  TORCH_CHECK(amx_fits(pairs, k), "amx_linear: the input's width is not the weight's, or not a multiple of 32");
  at::Tensor out = at::empty({m, n}, x.options());
#if defined(ADASERVE_AMX)
  if (m == 0) return out;
  const int64_t padded = (m + 15) / 16 * 16;
  at::Tensor xp = x;
  if (padded != m || !x.is_contiguous()) {
    xp = at::zeros({padded, k}, x.options());
    xp.narrow(0, 0, m).copy_(x);
  }
  at::Tensor bias32 = bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const c10::BFloat16* xd = xp.data_ptr<c10::BFloat16>();
  const c10::BFloat16* wd = pairs.data_ptr<c10::BFloat16>();
  const float* bd = bias ? bias32.data_ptr<float>() : nullptr;
  c10::BFloat16* od = out.data_ptr<c10::BFloat16>();
  // A tree's rows (2-8 row tiles) go two row tiles by two column blocks, each tile load feeding two
  // products; one row tile, or many (a prefill, where re-reading x per column group costs more), by
  // four column blocks. The bits are the same either way (amx_tile).
  const int nr = padded > 16 && padded <= 128 ? 2 : 1, group = nr == 2 ? 2 : 4;
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    configure_tiles();  // tile state is per thread
    alignas(64) float sums[32 * 64];
    for (int64_t b = begin; b < end; b += group) {
      const int nb = static_cast<int>(std::min<int64_t>(group, end - b));
      for (int64_t r = 0; r < padded; r += 16 * nr) {
        const int tiles = r + 16 < padded ? nr : 1;
        amx_tiles(tiles, nb, xd + r * k, k, wd + b * k * 16, sums);
        amx_emit(sums, std::min<int64_t>(16 * tiles, m - r), nb * 16, bd ? bd + b * 16 : nullptr, od + r * n + b * 16, n);
      }
    }
    _tile_release();
  });
#endif
  return out;
}

}  // namespace adaserve
