// Attention that reads the paged KV cache in place (CPU): no gather of K/V into padded copies.
//
// torch's CPU SDPA needs each sequence's keys and values contiguous, so the torch backend gathers
// them from the cache every layer: for a decode batch that copy costs as much as the attention itself,
// and both are bound by memory. Here each (sequence, KV head, chunk of queries) task walks the
// sequence's pages and uses each key/value row for every query head that shares that KV head (widened
// to float32 once in the generic path; read as bfloat16 in attend_bf16); scores live in a per-task
// float32 buffer. Work is memory-bound for the few
// queries per sequence it serves (decode steps; attention/paged_cpu.py says which); longer trees and
// prefill chunks stay on SDPA, whose blocked kernels do more arithmetic per byte.
//
// Visibility: keys [0, prefix) are seen by every query of the sequence (the committed prefix); key
// prefix + j is seen by query i iff tail_mask[i, j] (the uncommitted region: causal chain or tree).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "attention_tiles.h"
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

// What both paths read: the batch's raw pointers, its tasks, and the page walk of one sequence.
template <typename T>
struct Paged {
  const T *q, *k, *v;
  T* out;
  const int64_t *q_starts, *q_lens, *first_page, *kv_lens, *prefix_lens, *mask_starts;
  const int32_t* blocks;
  const bool* mask;
  int64_t heads, dim, kv_heads, group, slot_stride, page;
  float scale;
  std::vector<int64_t> task_seq, task_q0;  // (sequence, first query) of each task; times kv_heads tasks

  Paged(const at::Tensor& out_, const at::Tensor& q_, const at::Tensor& k_cache, const at::Tensor& v_cache,
        const at::Tensor& qs, const at::Tensor& ql, const at::Tensor& page_starts, const at::Tensor& kv_indices,
        const at::Tensor& kvl, const at::Tensor& pre, const at::Tensor& ms, const at::Tensor& tail_mask, int64_t page_,
        double scale_)
      : q(q_.data_ptr<T>()), k(k_cache.data_ptr<T>()), v(v_cache.data_ptr<T>()), out(out_.data_ptr<T>()),
        q_starts(qs.data_ptr<int64_t>()), q_lens(ql.data_ptr<int64_t>()), first_page(page_starts.data_ptr<int64_t>()),
        kv_lens(kvl.data_ptr<int64_t>()), prefix_lens(pre.data_ptr<int64_t>()), mask_starts(ms.data_ptr<int64_t>()),
        blocks(kv_indices.data_ptr<int32_t>()), mask(tail_mask.data_ptr<bool>()), heads(q_.size(1)), dim(q_.size(2)),
        kv_heads(k_cache.size(1)), group(heads / kv_heads), slot_stride(kv_heads * dim), page(page_),
        scale(static_cast<float>(scale_)) {
    // Tasks: (sequence, query chunk, KV head), flattened so both threads get work even for one sequence.
    for (int64_t s = 0; s < qs.size(0); ++s)
      for (int64_t q0 = 0; q0 < q_lens[s]; q0 += kQueryChunk) {
        task_seq.push_back(s);
        task_q0.push_back(q0);
      }
  }
  int64_t num_tasks() const { return static_cast<int64_t>(task_seq.size()) * kv_heads; }

  // Row pointers of sequence s's keys and values for KV head h, page by page (no division per key).
  void rows(int64_t s, int64_t h, std::vector<const T*>& krow, std::vector<const T*>& vrow) const {
    const int64_t kv_len = kv_lens[s];
    krow.resize(kv_len);
    vrow.resize(kv_len);
    for (int64_t pos = 0, pg = 0; pos < kv_len; ++pg) {
      const int64_t base = static_cast<int64_t>(blocks[first_page[s] + pg]) * page;
      for (int64_t off = 0; off < page && pos < kv_len; ++off, ++pos) {
        krow[pos] = k + (base + off) * slot_stride + h * dim;
        vrow[pos] = v + (base + off) * slot_stride + h * dim;
      }
    }
  }
  // Query (i, g) of the task's chunk: query q0 + i of sequence s, head g of KV head h's group.
  int64_t row_offset(int64_t s, int64_t q0, int64_t i, int64_t h, int64_t g) const {
    return ((q_starts[s] + q0 + i) * heads + h * group + g) * dim;
  }
};

// Softmax numerators of each of the task's score rows over the keys its query sees (hidden keys: 0);
// sums[r] gets row r's sum. Keys [0, prefix) are seen by all; prefix + j by query i iff vis row i, j.
inline void softmax_numerators(float* scores, int64_t nq, int64_t group, int64_t kv_len, int64_t prefix,
                               const bool* vis_rows, float* sums) {
  const int64_t tail = kv_len - prefix;
  for (int64_t i = 0; i < nq; ++i) {
    const bool* vis = vis_rows + i * tail;
    for (int64_t g = 0; g < group; ++g) {
      float* sr = scores + (i * group + g) * kv_len;
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
      sums[i * group + g] = sum;
    }
  }
}

// The generic path (float32, the exact oracle; bfloat16 where AVX512-BF16 is missing): each key and
// value row widened to float32 once into a buffer and used for every query head sharing its KV head.
template <typename T>
void attend(const Paged<T>& a) {
  const int64_t dim = a.dim, group = a.group;
  at::parallel_for(0, a.num_tasks(), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf, scores, acc, sums, keys(16 * dim, 0.f);
    std::vector<const T*> krow, vrow;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = a.task_seq[t / a.kv_heads], q0 = a.task_q0[t / a.kv_heads], h = t % a.kv_heads;
      const int64_t nq = std::min(kQueryChunk, a.q_lens[s] - q0), rows = nq * group, kv_len = a.kv_lens[s];
      qf.assign(rows * dim, 0.f);
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t g = 0; g < group; ++g) {
          float* dst = qf.data() + (i * group + g) * dim;
          to_float(a.q + a.row_offset(s, q0, i, h, g), dst, dim);
          for (int64_t d = 0; d < dim; ++d) dst[d] *= a.scale;
        }
      scores.resize(rows * kv_len);
      a.rows(s, h, krow, vrow);
      for (int64_t p0 = 0; p0 < kv_len; p0 += 16) {
        const int64_t n = std::min<int64_t>(16, kv_len - p0);
        prefetch_rows(krow, p0 + kPrefetchAhead, 16, dim * static_cast<int64_t>(sizeof(T)));
        for (int64_t j = 0; j < n; ++j) to_float(krow[p0 + j], keys.data() + j * dim, dim);
        tile_scores(qf.data(), rows, keys.data(), n, dim, scores.data() + p0, kv_len);
      }
      sums.resize(rows);
      const int64_t prefix = a.prefix_lens[s];
      softmax_numerators(scores.data(), nq, group, kv_len, prefix, a.mask + a.mask_starts[s] + q0 * (kv_len - prefix), sums.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.f / sums[r];
        for (int64_t pos = 0; pos < kv_len; ++pos) scores[r * kv_len + pos] *= inv;
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
          T* dst = a.out + a.row_offset(s, q0, i, h, g);
          const float* src = acc.data() + (i * group + g) * dim;
          for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(src[d]);
        }
    }
  });
}

#if defined(__AVX512BF16__)
// The bfloat16 path (dim a multiple of 32, at most 128). Keys and values stay bfloat16: q.k by
// VDPBF16PS (bf16 pairs multiplied exactly, summed in float32) straight from the cache rows, and p.V
// with each value row widened once into registers for a block of query rows. The generic loops widen
// every row into a buffer and reread it per query row, about three times the instructions. Measured
// (2 threads, decode batch of 32 over 1024-token contexts, one run): with one layer's cache reused
// (L3-resident) 1.98 -> 1.35 ms per layer; over 30 layers' caches (DRAM) 92 -> 76 ms in all. Tried
// and slower: a task taking every KV head of its sequence so slots are read contiguously (83 ms), and
// prefetching 8 to 128 rows ahead (no change): reading the cache, it is latency- rather than
// bandwidth-bound. Probabilities stay float32 (GPU flash kernels round them to bf16), normalised at the end.
constexpr int64_t kRowBlock = 6;  // query rows whose p.V accumulators (up to 8 registers each) stay in registers

inline __m512bh load32_bf16(const c10::BFloat16* p) { return (__m512bh)_mm512_loadu_si512(p); }

void attend_bf16(const Paged<c10::BFloat16>& a) {
  using T = c10::BFloat16;
  const int64_t dim = a.dim, group = a.group, halves = dim / 32, chunks = dim / 16;
  const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(T));
  at::parallel_for(0, a.num_tasks(), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, sums;
    std::vector<const T*> krow, vrow, qrow;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = a.task_seq[t / a.kv_heads], q0 = a.task_q0[t / a.kv_heads], h = t % a.kv_heads;
      const int64_t nq = std::min(kQueryChunk, a.q_lens[s] - q0), rows = nq * group, kv_len = a.kv_lens[s];
      qrow.resize(rows);
      for (int64_t r = 0; r < rows; ++r) qrow[r] = a.q + a.row_offset(s, q0, r / group, h, r % group);
      a.rows(s, h, krow, vrow);
      scores.resize(rows * kv_len);
      for (int64_t p0 = 0; p0 < kv_len; p0 += 16) {
        const int64_t n = std::min<int64_t>(16, kv_len - p0);
        prefetch_rows(krow, p0 + kPrefetchAhead, 16, row_bytes);
        const __mmask16 keep = static_cast<__mmask16>((1u << n) - 1);
        for (int64_t r = 0; r < rows; ++r) {
          __m512 acc[16];
          for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
          for (int64_t c = 0; c < halves; ++c) {
            const __m512bh qv = load32_bf16(qrow[r] + 32 * c);
            for (int64_t j = 0; j < n; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], qv, load32_bf16(krow[p0 + j] + 32 * c));
          }
          _mm512_mask_storeu_ps(scores.data() + r * kv_len + p0, keep, _mm512_mul_ps(sum16(acc), _mm512_set1_ps(a.scale)));
        }
      }
      sums.resize(rows);
      const int64_t prefix = a.prefix_lens[s];
      softmax_numerators(scores.data(), nq, group, kv_len, prefix, a.mask + a.mask_starts[s] + q0 * (kv_len - prefix), sums.data());
      for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
        const int64_t nr = std::min(kRowBlock, rows - r0);
        __m512 acc[kRowBlock][8];
        for (int64_t r = 0; r < nr; ++r)
          for (int64_t c = 0; c < chunks; ++c) acc[r][c] = _mm512_setzero_ps();
        for (int64_t pos = 0; pos < kv_len; ++pos) {
          if ((pos & 15) == 0) prefetch_rows(vrow, pos + kPrefetchAhead, 16, row_bytes);
          __m512 val[8];
          for (int64_t c = 0; c < chunks; ++c) val[c] = load16(vrow[pos] + 16 * c);
          for (int64_t r = 0; r < nr; ++r) {
            const __m512 w = _mm512_set1_ps(scores[(r0 + r) * kv_len + pos]);
            for (int64_t c = 0; c < chunks; ++c) acc[r][c] = _mm512_fmadd_ps(w, val[c], acc[r][c]);
          }
        }
        for (int64_t r = 0; r < nr; ++r) {
          T* dst = a.out + a.row_offset(s, q0, (r0 + r) / group, h, (r0 + r) % group);
          const __m512 inv = _mm512_set1_ps(1.f / sums[r0 + r]);
          alignas(64) float tmp[16];
          for (int64_t c = 0; c < chunks; ++c) {
            _mm512_store_ps(tmp, _mm512_mul_ps(acc[r][c], inv));
            for (int d = 0; d < 16; ++d) dst[16 * c + d] = static_cast<T>(tmp[d]);
          }
        }
      }
    }
  });
}
#endif

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
#define PAGED(T) Paged<T>(out, q, k_cache, v_cache, q_starts, q_lens, page_starts, kv_indices, kv_lens, prefix_lens, \
                          mask_starts, tail_mask, page, scale)
  if (q.scalar_type() == at::kBFloat16) {
#if defined(__AVX512BF16__)
    if (q.size(2) % 32 == 0 && q.size(2) <= 128) return attend_bf16(PAGED(c10::BFloat16));
#endif
    attend(PAGED(c10::BFloat16));
  } else if (q.scalar_type() == at::kFloat) {
    attend(PAGED(float));
  } else {
    TORCH_CHECK(false, "paged_attention: float32 or bfloat16 only");
  }
#undef PAGED
}

// Each call releases the GIL: it reads and writes tensors only, and a step spends most of its time in
// these calls, during which Triton's stub threads (responses, requests) need the interpreter.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, py::call_guard<py::gil_scoped_release>(), "attention over a paged KV cache, read in place (CPU)");
}
