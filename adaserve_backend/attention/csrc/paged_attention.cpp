// Attention that reads the paged KV cache in place (CPU): no gather of K/V into padded copies.
//
// torch's CPU SDPA needs each sequence's keys and values contiguous, so the torch backend gathers
// them from the cache every layer: for a decode batch that copy costs as much as the attention itself,
// and both are bound by memory. Here each (sequence, KV head, chunk of queries) task walks the
// sequence's pages, widens each key/value row to float32 once and uses it for every query head that
// shares that KV head; scores live in a per-task float32 buffer. Work is memory-bound for the few
// queries per sequence it serves (decode steps; attention/paged_cpu.py says which); longer trees and
// prefill chunks stay on SDPA, whose blocked kernels do more arithmetic per byte.
//
// Visibility: keys [0, prefix) are seen by every query of the sequence (the committed prefix); key
// prefix + j is seen by query i iff tail_mask[i, j] (the uncommitted region: causal chain or tree).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using namespace adaserve;

constexpr int64_t kQueryChunk = 8;  // queries per task: bounds the score buffer, splits long trees
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

// Softmax numerators of row[0:n] in place (exp(x - mx), all x <= mx); returns their sum.
inline float exp_row(float* row, int64_t n, float mx) {
  int64_t pos = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  for (; pos + 16 <= n; pos += 16) {
    const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + pos), vmx));
    _mm512_storeu_ps(row + pos, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  sum = _mm512_reduce_add_ps(vsum);
#endif
  for (; pos < n; ++pos) {
    row[pos] = exp_nonpositive(row[pos] - mx);
    sum += row[pos];
  }
  return sum;
}

// Rows `ahead` positions on are requested now: each row is a few cache lines of a page, so the
// hardware prefetcher alone leaves the loads waiting on memory (measured: over half the kernel's time).
template <typename T>
inline void prefetch_rows(const std::vector<const T*>& rows, int64_t from, int64_t n, int64_t bytes) {
#if defined(__AVX512F__)
  const int64_t end = std::min<int64_t>(from + n, static_cast<int64_t>(rows.size()));
  for (int64_t i = from; i < end; ++i)
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(rows[i]) + b, _MM_HINT_T0);
#endif
}

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
#if defined(__AVX512F__)
  if (n % 16 == 0) {
    for (int64_t d = 0; d < n; d += 16) _mm512_storeu_ps(dst + d, load16(src + d));
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
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      float dot = 0.f;
      for (int64_t d = 0; d < dim; ++d) dot += q[r * dim + d] * keys[j * dim + d];
      scores[r * stride + j] = dot;
    }
}

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
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const float w = p[r * stride + j];
      for (int64_t d = 0; d < dim; ++d) acc[r * dim + d] += w * values[j * dim + d];
    }
}

template <typename T>
void attend(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& q_starts, const at::Tensor& q_lens, const at::Tensor& page_starts,
            const at::Tensor& kv_indices, const at::Tensor& kv_lens, const at::Tensor& prefix_lens,
            const at::Tensor& mask_starts, const at::Tensor& tail_mask, int64_t page, double scale) {
  const int64_t heads = q.size(1), dim = q.size(2), kv_heads = k_cache.size(1);
  const int64_t group = heads / kv_heads;
  const int64_t slot_stride = kv_heads * dim;
  const T* qp = q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* qs = q_starts.data_ptr<int64_t>();
  const int64_t* ql = q_lens.data_ptr<int64_t>();
  const int64_t* first_page = page_starts.data_ptr<int64_t>();
  const int32_t* blocks = kv_indices.data_ptr<int32_t>();
  const int64_t* kvl = kv_lens.data_ptr<int64_t>();
  const int64_t* pre = prefix_lens.data_ptr<int64_t>();
  const int64_t* ms = mask_starts.data_ptr<int64_t>();
  const bool* mask = tail_mask.data_ptr<bool>();
  const int64_t num_seqs = q_starts.size(0);

  // Tasks: (sequence, query chunk, KV head), flattened so both threads get work even for one sequence.
  std::vector<int64_t> task_seq, task_q0;
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int64_t q0 = 0; q0 < ql[s]; q0 += kQueryChunk) {
      task_seq.push_back(s);
      task_q0.push_back(q0);
    }
  const int64_t num_tasks = static_cast<int64_t>(task_seq.size()) * kv_heads;
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf, scores, acc, keys(16 * dim, 0.f);
    std::vector<const T*> krow, vrow;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = task_seq[t / kv_heads], q0 = task_q0[t / kv_heads], h = t % kv_heads;
      const int64_t nq = std::min(kQueryChunk, ql[s] - q0), rows = nq * group;
      const int64_t kv_len = kvl[s], prefix = pre[s], tail = kv_len - prefix;
      qf.assign(rows * dim, 0.f);
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t g = 0; g < group; ++g) {
          const T* src = qp + ((qs[s] + q0 + i) * heads + h * group + g) * dim;
          float* dst = qf.data() + (i * group + g) * dim;
          to_float(src, dst, dim);
          for (int64_t d = 0; d < dim; ++d) dst[d] *= fscale;
        }
      scores.resize(rows * kv_len);
      // Row pointers of this sequence's keys and values for this head, page by page (no division per key).
      krow.resize(kv_len);
      vrow.resize(kv_len);
      for (int64_t pos = 0, pg = 0; pos < kv_len; ++pg) {
        const int64_t base = static_cast<int64_t>(blocks[first_page[s] + pg]) * page;
        for (int64_t off = 0; off < page && pos < kv_len; ++off, ++pos) {
          krow[pos] = kp + (base + off) * slot_stride + h * dim;
          vrow[pos] = vp + (base + off) * slot_stride + h * dim;
        }
      }
      for (int64_t p0 = 0; p0 < kv_len; p0 += 16) {
        const int64_t n = std::min<int64_t>(16, kv_len - p0);
        prefetch_rows(krow, p0 + kPrefetchAhead, 16, dim * static_cast<int64_t>(sizeof(T)));
        for (int64_t j = 0; j < n; ++j) to_float(krow[p0 + j], keys.data() + j * dim, dim);
        tile_scores(qf.data(), rows, keys.data(), n, dim, scores.data() + p0, kv_len);
      }
      // Softmax per row over the keys its query sees; hidden keys get probability 0.
      for (int64_t i = 0; i < nq; ++i) {
        const bool* vis = mask + ms[s] + (q0 + i) * tail;
        for (int64_t g = 0; g < group; ++g) {
          float* sr = scores.data() + (i * group + g) * kv_len;
          float mx = -3.0e38f;
#pragma omp simd reduction(max : mx)
          for (int64_t pos = 0; pos < prefix; ++pos) mx = std::max(mx, sr[pos]);
          for (int64_t j = 0; j < tail; ++j)
            if (vis[j]) mx = std::max(mx, sr[prefix + j]);
          float sum = exp_row(sr, prefix, mx);
          for (int64_t j = 0; j < tail; ++j) {
            const float e = vis[j] ? exp_nonpositive(sr[prefix + j] - mx) : 0.f;
            sr[prefix + j] = e;
            sum += e;
          }
          const float inv = 1.f / sum;
          for (int64_t pos = 0; pos < kv_len; ++pos) sr[pos] *= inv;
        }
      }
      acc.assign(rows * dim, 0.f);
      for (int64_t p0 = 0; p0 < kv_len; p0 += 16) {
        const int64_t n = std::min<int64_t>(16, kv_len - p0);
        prefetch_rows(vrow, p0 + kPrefetchAhead, 16, dim * static_cast<int64_t>(sizeof(T)));
        for (int64_t j = 0; j < n; ++j) to_float(vrow[p0 + j], keys.data() + j * dim, dim);
        tile_accumulate(acc.data(), rows, scores.data() + p0, kv_len, keys.data(), n, dim);
      }
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t g = 0; g < group; ++g) {
          T* dst = op + ((qs[s] + q0 + i) * heads + h * group + g) * dim;
          const float* src = acc.data() + (i * group + g) * dim;
          for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(src[d]);
        }
    }
  });
}

}  // namespace

// Writes the attention output of the listed sequences' query rows into `out` (rows of other
// sequences are left as they are). q, out: [T, heads, dim]; k_cache, v_cache: [slots, kv_heads, dim].
void paged_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& q_starts, const at::Tensor& q_lens, const at::Tensor& page_starts,
                     const at::Tensor& kv_indices, const at::Tensor& kv_lens, const at::Tensor& prefix_lens,
                     const at::Tensor& mask_starts, const at::Tensor& tail_mask, int64_t page, double scale) {
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_attention: q, out and the cache views must be contiguous");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && q.size(2) == k_cache.size(2) && q.size(1) % k_cache.size(1) == 0,
              "paged_attention: q [T, heads, dim] and cache [slots, kv_heads, dim] with heads a multiple of kv_heads");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == out.scalar_type(),
              "paged_attention: q, cache and out must share a dtype");
  if (q.scalar_type() == at::kBFloat16) {
    attend<c10::BFloat16>(out, q, k_cache, v_cache, q_starts, q_lens, page_starts, kv_indices, kv_lens, prefix_lens,
                          mask_starts, tail_mask, page, scale);
  } else if (q.scalar_type() == at::kFloat) {
    attend<float>(out, q, k_cache, v_cache, q_starts, q_lens, page_starts, kv_indices, kv_lens, prefix_lens,
                  mask_starts, tail_mask, page, scale);
  } else {
    TORCH_CHECK(false, "paged_attention: float32 or bfloat16 only");
  }
}

// Each call releases the GIL: it reads and writes tensors only, and a step spends most of its time in
// these calls, during which Triton's stub threads (responses, requests) need the interpreter.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, py::call_guard<py::gil_scoped_release>(), "attention over a paged KV cache, read in place (CPU)");
}
