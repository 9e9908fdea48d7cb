// Attention that reads the paged KV cache in place (CPU): no gather of K/V into padded copies.
//
// torch's CPU SDPA needs each sequence's keys and values contiguous, so the torch backend gathers
// them from the cache every layer: for a decode batch that copy costs as much as the attention itself,
// and both are bound by memory. Here each (sequence, KV head, chunk of queries) task walks the
// sequence's pages and uses each key/value row for every query head that shares that KV head (widened
// to float32 once in the generic path; read as bfloat16 in attend_bf16); scores live in a per-task
// float32 buffer. It serves every sequence of a forward: decode steps, token trees and prefill chunks
// (attention/paged_cpu.py says how each compared with SDPA).
//
// Visibility: keys [0, prefix) are seen by every query of the sequence (the committed prefix); key
// prefix + j is seen by query i iff tail_mask[i, j] (the uncommitted region: causal chain or tree).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "attention_tiles.h"
#include "bf16_tiles.h"
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
// The sums do not depend on where the prefix ends (exp_row): the same query gives the same bits.
// Only keys [0, end) are scored (end <= kv_len, the row stride): no query of the task sees one beyond.
inline void softmax_numerators(float* scores, int64_t nq, int64_t group, int64_t kv_len, int64_t prefix,
                               const bool* vis_rows, float* sums, int64_t end) {
  const int64_t tail = kv_len - prefix;
  for (int64_t i = 0; i < nq; ++i) {
    const bool* vis = vis_rows + i * tail;
    for (int64_t g = 0; g < group; ++g) {
      float* sr = scores + (i * group + g) * kv_len;
      float mx = -3.0e38f;
#pragma omp simd reduction(max : mx)
      for (int64_t pos = 0; pos < prefix; ++pos) mx = std::max(mx, sr[pos]);
      mx = visible_max(sr + prefix, vis, end - prefix, mx);
      sums[i * group + g] = exp_row(sr, end, mx, prefix, vis);
    }
  }
}

// One past the last key any of the nq queries sees (vis_rows: their [nq, tail] rows after the prefix):
// a prefill chunk's queries see none of the keys after them, half of a causal square.
inline int64_t visible_end(const bool* vis_rows, int64_t nq, int64_t prefix, int64_t tail) {
  int64_t last = 0;
  for (int64_t i = 0; i < nq; ++i) last = last_visible(vis_rows + i * tail, last, tail);
  return prefix + last;
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
      const int64_t prefix = a.prefix_lens[s];
      const bool* vis = a.mask + a.mask_starts[s] + q0 * (kv_len - prefix);
      const int64_t end = visible_end(vis, nq, prefix, kv_len - prefix);
      for (int64_t p0 = 0; p0 < end; p0 += 16) {
        const int64_t n = std::min<int64_t>(16, end - p0);
        prefetch_rows(krow, p0 + kPrefetchAhead, 16, dim * static_cast<int64_t>(sizeof(T)));
        for (int64_t j = 0; j < n; ++j) to_float(krow[p0 + j], keys.data() + j * dim, dim);
        tile_scores(qf.data(), rows, keys.data(), n, dim, scores.data() + p0, kv_len);
      }
      sums.resize(rows);
      softmax_numerators(scores.data(), nq, group, kv_len, prefix, vis, sums.data(), end);
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.f / sums[r];
        for (int64_t pos = 0; pos < end; ++pos) scores[r * kv_len + pos] *= inv;
      }
      acc.assign(rows * dim, 0.f);
      for (int64_t p0 = 0; p0 < end; p0 += 16) {
        const int64_t n = std::min<int64_t>(16, end - p0);
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
// The bfloat16 path (dim a multiple of 32, at most 128; loops in bf16_tiles.h). Keys and values stay
// bfloat16: each 16 keys are transposed once into bf16 pairs so a query row takes one VDPBF16PS per pair
// for all 16 scores (bf16 products exact, summed in float32), and p.V widens each value row once into
// registers for a block of query rows. Probabilities stay float32 (GPU flash kernels round them to
// bf16), normalised at the end. Measured (2 threads, decode batch of 32 over 1024-token contexts, one
// run) before the transposed tiles: with one layer's cache reused (L3-resident) 1.98 -> 1.35 ms per layer
// against the generic loops; over 30 layers' caches (DRAM) 92 -> 76 ms in all. Tried and slower: a task
// taking every KV head of its sequence so slots are read contiguously (83 ms), and prefetching 8 to 128
// rows ahead (no change): reading the cache, it is latency- rather than bandwidth-bound.
constexpr int64_t kScoreRows = 4;  // query rows sharing one transposed key tile per pass

template <int H>
void attend_bf16(const Paged<c10::BFloat16>& a) {
  using T = c10::BFloat16;
  constexpr int C = 2 * H, kValueRows = 24 / C;  // p.V: kValueRows x C accumulators stay in 32 registers
  const int64_t group = a.group, row_bytes = a.dim * static_cast<int64_t>(sizeof(T));
  at::parallel_for(0, a.num_tasks(), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, sums, inv;
    std::vector<const T*> krow, vrow, qrow;
    std::vector<T*> orow;
    alignas(64) uint32_t kt[16 * 16 * H];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = a.task_seq[t / a.kv_heads], q0 = a.task_q0[t / a.kv_heads], h = t % a.kv_heads;
      const int64_t nq = std::min(kQueryChunk, a.q_lens[s] - q0), rows = nq * group, kv_len = a.kv_lens[s];
      qrow.resize(rows);
      orow.resize(rows);
      for (int64_t r = 0; r < rows; ++r) {
        qrow[r] = a.q + a.row_offset(s, q0, r / group, h, r % group);
        orow[r] = a.out + a.row_offset(s, q0, r / group, h, r % group);
      }
      a.rows(s, h, krow, vrow);
      scores.resize(rows * kv_len);
      for (int64_t p0 = 0; p0 < kv_len; p0 += 16) {
        const int64_t n = std::min<int64_t>(16, kv_len - p0);
        prefetch_rows(krow, p0 + kPrefetchAhead, 16, row_bytes);
        transpose_keys<H>(krow.data() + p0, n, kt);
        for (int64_t r0 = 0; r0 < rows; r0 += kScoreRows)
          tile_scores_upto<H, kScoreRows>(std::min(kScoreRows, rows - r0), qrow.data() + r0, kt, n, a.scale,
                                          scores.data() + r0 * kv_len + p0, kv_len);
      }
      sums.resize(rows);
      const int64_t prefix = a.prefix_lens[s];
      softmax_numerators(scores.data(), nq, group, kv_len, prefix, a.mask + a.mask_starts[s] + q0 * (kv_len - prefix),
                         sums.data(), kv_len);
      inv.resize(rows);
      for (int64_t r = 0; r < rows; ++r) inv[r] = 1.f / sums[r];
      for (int64_t r0 = 0; r0 < rows; r0 += kValueRows)
        rows_times_values_upto<C, kValueRows>(std::min<int64_t>(kValueRows, rows - r0), scores.data() + r0 * kv_len, kv_len,
                                              vrow.data(), kv_len, inv.data() + r0, orow.data() + r0);
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
    switch (q.size(2)) {
      case 32: return attend_bf16<1>(PAGED(c10::BFloat16));
      case 64: return attend_bf16<2>(PAGED(c10::BFloat16));
      case 96: return attend_bf16<3>(PAGED(c10::BFloat16));
      case 128: return attend_bf16<4>(PAGED(c10::BFloat16));
    }
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
