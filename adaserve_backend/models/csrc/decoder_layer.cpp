// A Llama decoder layer's work around attention, in two calls per layer, for CPU bfloat16 inference.
//
// Python dispatch and the small elementwise kernels between the GEMMs (norms, rotary embedding,
// SiLU * up, residual adds: ~35 ATen calls per layer) cost a decode step about as much as reading the
// weights once the weights sit in this machine's large L3. Here each side of attention is one call:
//   pre_attention:  residual += x; h = rms_norm(residual); qkv = h W_qkv; rotate q and k in place
//   post_attention: residual += attn W_o; h = rms_norm(residual); out = (silu(h W_g) * h W_u) W_d
// The GEMMs go through packed_linear, which models/linear.py calls too: GGUF blocks, the pair kernel
// (pair_gemm.h) or torch's own oneDNN op on the prepacked weight, by row count. Every elementwise
// result is rounded to bfloat16 where the Python layer (models/llama.py) rounds it, so the two paths
// agree up to the order of the norm's sum of squares and the exp inside SiLU.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "cpu_math.h"
#include "pair_gemm.h"
#include "block_gemm.h"
#include "int8_gemm.h"
#include "amx_gemm.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace {

using namespace adaserve;
using bf16 = c10::BFloat16;

constexpr int64_t kRowsPerTask = 8;

// Which kernel serves a bfloat16 product, set once at startup by models/kernel_choice.py from
// measurements on this machine (never a constant chosen on another CPU: docs/architecture.md#the-model-runtime).
// The default serves every row count with one kernel, the pair kernel, so that a row's numbers never
// depend on how many rows share its product; `amx` serves every count with AMX tiles instead (one kernel
// too); a finite `pair_rows` hands larger products to oneDNN, faster on some CPUs and batch-dependent.
std::atomic<int64_t> g_pair_rows{std::numeric_limits<int64_t>::max()};
std::atomic<bool> g_amx{false};

void set_kernel_choice(int64_t pair_rows, bool amx) {
  TORCH_CHECK(pair_rows >= 0, "pair_rows must be >= 0");
  TORCH_CHECK(!amx || (kAmxCompiled && amx_permitted()), "AMX tiles are not available on this CPU");
  g_pair_rows = pair_rows;
  g_amx = amx;
}

inline float f(bf16 x) { return widen(x); }

// Up to this many rows a weight served from GGUF blocks (models/quantized.py) is read as blocks. The
// dequantization bounds that product, not the bytes: at 4 rows it already cost what the bfloat16
// pairs' larger read costs (docs/architecture.md#the-model-runtime).
constexpr int64_t kBlockRows = 2;

// The product with the cheapest packing there is for this many rows of a [rows, K] input: GGUF blocks,
// bfloat16 pairs, or oneDNN's prepacked weight. All hold the same values. Without AVX512-BF16 the pairs
// serve every row count and `packed` is the plain weight, never read (models/linear.py).
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& pairs,
                         const std::optional<at::Tensor>& blocks, const std::optional<at::Tensor>& bias) {
  if (x.dim() != 2) {  // [..., K]: the product of its rows, shaped back
    std::vector<int64_t> sizes = x.sizes().vec();
    const at::Tensor out = packed_linear(x.reshape({-1, x.size(-1)}), packed, pairs, blocks, bias);
    sizes.back() = out.size(1);
    return out.reshape(sizes);
  }
  const int64_t rows = x.size(0);
  // Integer-dot blocks (int8) serve every row count: their numbers are not the bfloat16 packings'.
  if (blocks && blocks->scalar_type() == at::kChar) return int8_linear(x, *blocks, bias);
  if (blocks && rows <= kBlockRows) return block_linear(x, *blocks, bias);
  // GGUF-block weights keep the pair kernel's order at every count (block_linear computes in it).
  if (pairs && !blocks && g_amx && amx_fits(*pairs, x.size(1))) return amx_linear(x, *pairs, bias);
  if (pairs && rows <= g_pair_rows) return pair_linear(x, *pairs, bias);
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                            c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<std::optional<at::Scalar>>(), c10::string_view(""));
}

void check_rows(const at::Tensor& t, int64_t cols, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 && t.dim() == 2 && t.size(1) == cols && t.is_contiguous(), what,
              " must be a contiguous bfloat16 [T, ", cols, "] tensor");
}

// One row: r = bf16(r + a) when a is given; returns the sum of squares of r.
inline float add_and_square(bf16* r, const bf16* a, int64_t dim) {
  int64_t d = 0;
  float squares = 0.f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; d + 16 <= dim; d += 16) {
    __m512 v = load16(r + d);
    if (a) {
      v = round16_bf16(_mm512_add_ps(v, load16(a + d)));
      store16_bf16(r + d, v);
    }
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  squares = _mm512_reduce_add_ps(acc);
#elif defined(ADASERVE_AVX2)
  __m256 acc = _mm256_setzero_ps();
  for (; d + 8 <= dim; d += 8) {
    __m256 v = load8(r + d);
    if (a) {
      v = round8_bf16(_mm256_add_ps(v, load8(a + d)));
      store8_bf16(r + d, v);
    }
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  squares = reduce8(acc);
#endif
  for (; d < dim; ++d) {
    if (a) r[d] = round_bf16(f(r[d]) + f(a[d]));
    squares += f(r[d]) * f(r[d]);
  }
  return squares;
}

// One row: out = bf16(w * bf16(r * inv)).
inline void scale_row(const bf16* r, const bf16* w, float inv, bf16* out, int64_t dim) {
  int64_t d = 0;
#if defined(__AVX512F__)
  const __m512 vinv = _mm512_set1_ps(inv);
  for (; d + 16 <= dim; d += 16)
    store16_bf16(out + d, round16_bf16(_mm512_mul_ps(load16(w + d), round16_bf16(_mm512_mul_ps(load16(r + d), vinv)))));
#elif defined(ADASERVE_AVX2)
  const __m256 vinv = _mm256_set1_ps(inv);
  for (; d + 8 <= dim; d += 8)
    store8_bf16(out + d, round8_bf16(_mm256_mul_ps(load8(w + d), round8_bf16(_mm256_mul_ps(load8(r + d), vinv)))));
#endif
  for (; d < dim; ++d) out[d] = round_bf16(f(w[d]) * f(round_bf16(f(r[d]) * inv)));
}

// residual = bf16(residual + x) when x is given; returns bf16(weight * bf16(residual / rms(residual))).
at::Tensor add_rms_norm(const std::optional<at::Tensor>& x, at::Tensor& residual, const at::Tensor& weight,
                        double eps) {
  const int64_t rows = residual.size(0), dim = residual.size(1);
  check_rows(residual, dim, "residual");
  if (x) check_rows(*x, dim, "x");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.numel() == dim, "norm weight must be bfloat16 [dim]");
  at::Tensor out = at::empty_like(residual);
  bf16* res = residual.data_ptr<bf16>();
  const bf16* add = x ? x->data_ptr<bf16>() : nullptr;
  const bf16* w = weight.data_ptr<bf16>();
  bf16* o = out.data_ptr<bf16>();
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float squares = add_and_square(res + r * dim, add ? add + r * dim : nullptr, dim);
      const float inv = 1.f / std::sqrt(squares / static_cast<float>(dim) + static_cast<float>(eps));
      scale_row(res + r * dim, w, inv, o + r * dim, dim);
    }
  });
  return out;
}

// Rotates the first `rotated` heads of each row of qkv [T, heads * dim] in place (rotate-half
// convention): x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, each product and sum rounded to bf16.
// cos, signed_sin: [T, dim] bfloat16, signed_sin = cat(-sin, sin) as models/llama.py builds it.
void rope_in_place(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin, int64_t rotated,
                   int64_t dim) {
  const int64_t rows = qkv.size(0), width = qkv.size(1), half = dim / 2;
  check_rows(cos, dim, "cos");
  check_rows(signed_sin, dim, "signed_sin");
  TORCH_CHECK(cos.size(0) == rows && signed_sin.size(0) == rows, "rotary tables need one row per token");
  TORCH_CHECK(rotated * dim <= width && dim % 2 == 0, "rotated heads must fit in the row");
  bf16* base = qkv.data_ptr<bf16>();
  const bf16* c = cos.data_ptr<bf16>();
  const bf16* s = signed_sin.data_ptr<bf16>();
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const bf16* cr = c + r * dim;
      const bf16* sr = s + r * dim;
      for (int64_t h = 0; h < rotated; ++h) {
        bf16* x = base + r * width + h * dim;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= half; i += 16) {
          const __m512 x1 = load16(x + i), x2 = load16(x + i + half);
          const __m512 lo = _mm512_add_ps(round16_bf16(_mm512_mul_ps(x1, load16(cr + i))),
                                          round16_bf16(_mm512_mul_ps(x2, load16(sr + i))));
          const __m512 hi = _mm512_add_ps(round16_bf16(_mm512_mul_ps(x2, load16(cr + i + half))),
                                          round16_bf16(_mm512_mul_ps(x1, load16(sr + i + half))));
          store16_bf16(x + i, round16_bf16(lo));
          store16_bf16(x + i + half, round16_bf16(hi));
        }
#elif defined(ADASERVE_AVX2)
        for (; i + 8 <= half; i += 8) {
          const __m256 x1 = load8(x + i), x2 = load8(x + i + half);
          const __m256 lo = _mm256_add_ps(round8_bf16(_mm256_mul_ps(x1, load8(cr + i))),
                                          round8_bf16(_mm256_mul_ps(x2, load8(sr + i))));
          const __m256 hi = _mm256_add_ps(round8_bf16(_mm256_mul_ps(x2, load8(cr + i + half))),
                                          round8_bf16(_mm256_mul_ps(x1, load8(sr + i + half))));
          store8_bf16(x + i, round8_bf16(lo));
          store8_bf16(x + i + half, round8_bf16(hi));
        }
#endif
        for (; i < half; ++i) {
          const float x1 = f(x[i]), x2 = f(x[i + half]);
          x[i] = round_bf16(f(round_bf16(x1 * f(cr[i]))) + f(round_bf16(x2 * f(sr[i]))));
          x[i + half] = round_bf16(f(round_bf16(x2 * f(cr[i + half]))) + f(round_bf16(x1 * f(sr[i + half]))));
        }
      }
    }
  });
}

// silu(x) = x / (1 + exp(-x)), as torch computes it in float32 for a bfloat16 tensor.
inline float silu(float x) { return x / (1.f + exp_accurate(-x)); }

// gate_up [T, 2I] -> bf16(bf16(silu(gate)) * up) [T, I].
at::Tensor silu_mul(const at::Tensor& gate_up) {
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  check_rows(gate_up, 2 * inter, "gate_up");
  at::Tensor out = at::empty({rows, inter}, gate_up.options());
  const bf16* g = gate_up.data_ptr<bf16>();
  bf16* o = out.data_ptr<bf16>();
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const bf16* gr = g + r * 2 * inter;
      bf16* orow = o + r * inter;
      int64_t i = 0;
#if defined(__AVX512F__)
      const __m512 one = _mm512_set1_ps(1.f);
      for (; i + 16 <= inter; i += 16) {
        const __m512 x = load16(gr + i);
        const __m512 e = exp16_accurate(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 act = round16_bf16(_mm512_div_ps(x, _mm512_add_ps(one, e)));
        store16_bf16(orow + i, round16_bf16(_mm512_mul_ps(act, load16(gr + inter + i))));
      }
#elif defined(ADASERVE_AVX2)
      const __m256 one = _mm256_set1_ps(1.f);
      for (; i + 8 <= inter; i += 8) {
        const __m256 x = load8(gr + i);
        const __m256 e = exp8_accurate(_mm256_sub_ps(_mm256_setzero_ps(), x));
        const __m256 act = round8_bf16(_mm256_div_ps(x, _mm256_add_ps(one, e)));
        store8_bf16(orow + i, round8_bf16(_mm256_mul_ps(act, load8(gr + inter + i))));
      }
#endif
      for (; i < inter; ++i) orow[i] = round_bf16(f(round_bf16(silu(f(gr[i])))) * f(gr[inter + i]));
    }
  });
  return out;
}

}  // namespace

// x: the previous layer's MLP output [T, hidden] (None for the first layer, whose residual is the
// embedding); residual [T, hidden] is updated in place. Returns qkv [T, (heads + 2 kv_heads) * dim]
// with the first `rotated` = heads + kv_heads heads rotated.
at::Tensor pre_attention(const std::optional<at::Tensor>& x, at::Tensor residual, const at::Tensor& norm_weight,
                         const at::Tensor& qkv_packed, const std::optional<at::Tensor>& qkv_pairs,
                         const std::optional<at::Tensor>& qkv_blocks, const std::optional<at::Tensor>& qkv_bias,
                         const at::Tensor& cos, const at::Tensor& signed_sin, int64_t rotated, int64_t dim, double eps) {
  at::Tensor qkv = packed_linear(add_rms_norm(x, residual, norm_weight, eps), qkv_packed, qkv_pairs, qkv_blocks, qkv_bias);
  rope_in_place(qkv, cos, signed_sin, rotated, dim);
  return qkv;
}

// attn: attention output [T, heads * dim]; residual is updated in place. Returns the MLP's output.
at::Tensor post_attention(const at::Tensor& attn, at::Tensor residual, const at::Tensor& o_packed,
                          const std::optional<at::Tensor>& o_pairs, const std::optional<at::Tensor>& o_blocks,
                          const std::optional<at::Tensor>& o_bias, const at::Tensor& norm_weight,
                          const at::Tensor& gate_up_packed, const std::optional<at::Tensor>& gate_up_pairs,
                          const std::optional<at::Tensor>& gate_up_blocks, const std::optional<at::Tensor>& gate_up_bias,
                          const at::Tensor& down_packed, const std::optional<at::Tensor>& down_pairs,
                          const std::optional<at::Tensor>& down_blocks, const std::optional<at::Tensor>& down_bias, double eps) {
  const at::Tensor o = packed_linear(attn, o_packed, o_pairs, o_blocks, o_bias);
  const at::Tensor h = add_rms_norm(o, residual, norm_weight, eps);
  return packed_linear(silu_mul(packed_linear(h, gate_up_packed, gate_up_pairs, gate_up_blocks, gate_up_bias)), down_packed,
                       down_pairs, down_blocks, down_bias);
}

// Each call releases the GIL: it reads and writes tensors only, and a step spends most of its time in
// these calls, during which Triton's stub threads (responses, requests) need the interpreter.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pre_attention", &pre_attention, py::call_guard<py::gil_scoped_release>(), "residual add, RMSNorm, QKV projection and rotary embedding (CPU bf16)");
  m.def("post_attention", &post_attention, py::call_guard<py::gil_scoped_release>(), "output projection, residual add, RMSNorm and MLP (CPU bf16)");
  m.def("add_rms_norm", &add_rms_norm, py::call_guard<py::gil_scoped_release>(), "residual += x; RMSNorm(residual) (CPU bf16)");
  m.def("rope_in_place", &rope_in_place, py::call_guard<py::gil_scoped_release>(), "rotary embedding of the first heads of each row, in place (CPU bf16)");
  m.def("silu_mul", &silu_mul, py::call_guard<py::gil_scoped_release>(), "silu(gate) * up of [T, 2I] rows (CPU bf16)");
  m.def("pack_pairs", &pack_pairs, "a bfloat16 [N, K] weight in the layout pair_linear reads");
  m.def("pair_linear", &pair_linear, py::call_guard<py::gil_scoped_release>(), "x W^T + bias, W from pack_pairs (AVX512-BF16: few rows; AVX2 and FMA: any)");
  m.def("block_linear", &block_linear, py::call_guard<py::gil_scoped_release>(),
        "x W^T + bias, W from models/quantized.py's pack_q4_1 or pack_q8_0 (AVX512-BF16)");
  m.def("int8_linear", &int8_linear, py::call_guard<py::gil_scoped_release>(),
        "x W^T + bias in integer dot products, W from models/quantized.py's pack_q4_1_int8 (AVX512-VNNI)");
  m.def("packed_linear", &packed_linear, py::call_guard<py::gil_scoped_release>(),
        "x W^T + bias through the cheapest packing for x's rows: GGUF blocks, pairs or oneDNN's (CPU bf16)");
  m.attr("pair_gemm") = py::bool_(kPairGemmCompiled);
  m.attr("block_gemm") = py::bool_(kBlockGemmCompiled);
  m.def("set_kernel_choice", &set_kernel_choice, "products of up to pair_rows rows take the pair kernel, more oneDNN; amx: AMX tiles at every count");
  m.def("kernel_choice", [] { return py::make_tuple(g_pair_rows.load(), g_amx.load()); }, "(pair_rows, amx) as set");
  m.def("amx_linear", &amx_linear, py::call_guard<py::gil_scoped_release>(), "x W^T + bias on AMX tiles, W from pack_pairs, K a multiple of 32");
  m.attr("amx_compiled") = py::bool_(kAmxCompiled);
  m.def("amx_permitted", &amx_permitted, "whether this process may use the AMX tiles");
  m.attr("int8_gemm") = py::bool_(kInt8GemmCompiled);
}
