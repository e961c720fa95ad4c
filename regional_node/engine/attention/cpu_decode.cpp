// Paged decode attention on the CPU, float32, over vLLM's CPU cache layout (vllm_backend.py).
//
// On a decode step vLLM's cpu_attention_with_kv_cache read the cache at 12-15 GB/s on a 2-core
// AVX-512 machine whose memory streams 32 (with the cache hot in L3 the two kernels are level).
// Decode attention is bound by reading the cache, so this kernel reads each block once: a task
// is one sequence and its KV heads, the blocks in memory order (per block: each KV head's K^T then
// its V, adjacent in the layout), every query head of a KV head's group in registers, and an
// online softmax, so K and V go by in one pass.
//
// Layout (what cpu_attn_reshape_and_cache writes, for the "vec" and "vec16" ISAs): a block of a
// KV head is K^T [head_dim][block_size] (one row of block_size tokens per dimension) and V
// [block_size][head_dim]. Built at first use by torch.utils.cpp_extension with -march=native,
// so GCC's vector extensions below become AVX-512 (or AVX2) code for the machine it runs on.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int L = 16;  // floats per vector
constexpr int MAX_GROUP = 8;  // query heads per KV head kept in registers at once
typedef float vf __attribute__((vector_size(L * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(L * sizeof(int32_t))));

inline vf splat(float x) { return vf{} + x; }
inline vf loadu(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storeu(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// e^x for x <= 0: range reduction by ln 2 and Cephes' expf polynomial (within 2 ulp of expf).
inline vf vexp(vf x) {
  x = x < splat(-87.f) ? splat(-87.f) : x;
  const vf t = x * splat(1.44269504088896341f) + splat(0.5f);
  vi n = __builtin_convertvector(t, vi);  // truncates: one too high below zero
  n += (__builtin_convertvector(n, vf) > t);  // a true lane is -1
  const vf nf = __builtin_convertvector(n, vf);
  const vf r = x - nf * splat(0.693359375f) + nf * splat(2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.f);
  const vi bits = (n + 127) << 23;
  vf two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// The running softmax of G query heads that share one KV head: max m, sum l, unnormalised output.
struct HeadState {
  float* m;
  float* l;
  vf* acc;  // [G][D / L]
};

// One block of one KV head for G of its query heads: scores, softmax update, weighted V rows.
// q: the first head's query (heads `q_head_stride` apart); kt: the block's K^T; v: its V;
// n: the block's valid tokens; p: [G][block_size] scratch.
template <int G, int D>
void attend_block(const float* q, int64_t q_head_stride, const float* kt, const float* v, int64_t block_size,
                  int64_t n, float scale, HeadState state, float* p) {
  constexpr int DV = D / L;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < block_size; c += L) {
    // Even and odd dimensions in separate sums: twice the independent FMAs in flight.
    vf even[G] = {}, odd[G] = {};
    for (int d = 0; d < D; d += 2) {
      const vf k0 = loadu(kt + d * block_size + c), k1 = loadu(kt + (d + 1) * block_size + c);
      for (int h = 0; h < G; ++h) {
        even[h] += splat(q[h * q_head_stride + d]) * k0;
        odd[h] += splat(q[h * q_head_stride + d + 1]) * k1;
      }
    }
    for (int h = 0; h < G; ++h) storeu(p + h * block_size + c, (even[h] + odd[h]) * splat(scale));
  }
  for (int h = 0; h < G; ++h) {
    float* ph = p + h * block_size;
    float top = state.m[h];
    for (int64_t t = 0; t < n; ++t) top = std::max(top, ph[t]);
    for (int64_t t = n; t < block_size; ++t) ph[t] = neg_inf;
    vf total{};
    for (int64_t t = 0; t < block_size; t += L) {
      const vf x = loadu(ph + t);
      const vf e = x == splat(neg_inf) ? splat(0.f) : vexp(x - splat(top));
      storeu(ph + t, e);
      total += e;
    }
    float sum = 0.f;
    for (int k = 0; k < L; ++k) sum += total[k];
    const float correction = std::exp(state.m[h] - top);  // 0 on the first block (m = -inf)
    state.l[h] = state.l[h] * correction + sum;
    state.m[h] = top;
    for (int c = 0; c < DV; ++c) state.acc[h * DV + c] *= splat(correction);
  }
  vf acc[G][DV];
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < DV; ++c) acc[h][c] = state.acc[h * DV + c];
  for (int64_t t = 0; t < n; ++t) {
    vf row[DV];
    for (int c = 0; c < DV; ++c) row[c] = loadu(v + t * D + c * L);
    for (int h = 0; h < G; ++h) {
      const vf weight = splat(p[h * block_size + t]);
      for (int c = 0; c < DV; ++c) acc[h][c] += weight * row[c];
    }
  }
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < DV; ++c) state.acc[h * DV + c] = acc[h][c];
}

using BlockFn = void (*)(const float*, int64_t, const float*, const float*, int64_t, int64_t, float, HeadState,
                         float*);

template <int D>
BlockFn block_fn_for(int64_t group) {
  switch (group) {
    case 1: return attend_block<1, D>;
    case 2: return attend_block<2, D>;
    case 3: return attend_block<3, D>;
    case 4: return attend_block<4, D>;
    case 5: return attend_block<5, D>;
    case 6: return attend_block<6, D>;
    case 7: return attend_block<7, D>;
    case 8: return attend_block<8, D>;
    default: return nullptr;
  }
}

BlockFn block_fn(int64_t group, int64_t head_dim) {
  switch (head_dim) {
    case 32: return block_fn_for<32>(group);
    case 64: return block_fn_for<64>(group);
    case 128: return block_fn_for<128>(group);
    default: return nullptr;
  }
}

}  // namespace

bool supports_head_dim(int64_t head_dim) { return block_fn(1, head_dim) != nullptr; }

// out, q: [S, heads, head_dim] (rows and heads may be strided: q is a view into the qkv rows);
// key_cache, value_cache: [blocks, kv_heads, block_size, head_dim] views of vLLM's layout;
// block_table: [S, width] int32; seq_lens: [S] int32, each sequence's context including this token.
void decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor key_cache, torch::Tensor value_cache,
                      torch::Tensor block_table, torch::Tensor seq_lens, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat && out.scalar_type() == torch::kFloat &&
                  key_cache.scalar_type() == torch::kFloat && value_cache.scalar_type() == torch::kFloat,
              "decode_attention runs float32 only");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes() && key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes(),
              "decode_attention: bad shapes");
  TORCH_CHECK(q.stride(2) == 1 && out.stride(2) == 1 && key_cache.stride(3) == 1 && key_cache.stride(2) == key_cache.size(3) &&
                  value_cache.stride(3) == 1 && value_cache.stride(2) == value_cache.size(3),
              "decode_attention: head_dim and block rows must be dense");
  TORCH_CHECK(block_table.scalar_type() == torch::kInt && seq_lens.scalar_type() == torch::kInt &&
                  block_table.stride(1) == 1 && seq_lens.is_contiguous() && block_table.size(0) == q.size(0) &&
                  seq_lens.size(0) == q.size(0),
              "decode_attention: block_table and seq_lens must be int32, one row per sequence");
  const int64_t num_seqs = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const int64_t kv_heads = key_cache.size(1), block_size = key_cache.size(2);
  TORCH_CHECK(key_cache.size(3) == head_dim && heads % kv_heads == 0 && block_size % L == 0,
              "decode_attention: heads must be a multiple of kv_heads and block_size of 16");
  TORCH_CHECK(supports_head_dim(head_dim), "decode_attention: head_dim must be 32, 64 or 128");
  const int64_t group = heads / kv_heads;
  const int64_t dv = head_dim / L;

  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* kp = key_cache.data_ptr<float>();
  const float* vp = value_cache.data_ptr<float>();
  const int64_t q_row = q.stride(0), q_head = q.stride(1), o_row = out.stride(0), o_head = out.stride(1);
  const int64_t k_block = key_cache.stride(0), k_head = key_cache.stride(1);
  const int64_t v_block = value_cache.stride(0), v_head = value_cache.stride(1);
  const int32_t* tables = block_table.data_ptr<int32_t>();
  const int64_t table_row = block_table.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const float fscale = static_cast<float>(scale);

  // A task is a sequence and all its KV heads (each block read as one stretch of memory) while
  // there are enough sequences to keep every thread busy; else one KV head each.
  const int64_t threads = at::get_num_threads();
  const int64_t heads_per_task = num_seqs >= 4 * threads ? kv_heads : 1;
  const int64_t splits = kv_heads / heads_per_task;
  const int64_t num_tasks = num_seqs * splits;
  // Longest first, handed out one at a time, so the threads finish together.
  std::vector<int64_t> order(num_tasks);
  for (int64_t i = 0; i < num_tasks; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return lens[a / splits] > lens[b / splits]; });
  std::atomic<int64_t> next{0};
  // The block function for each run of at most MAX_GROUP query heads of a group, picked once.
  std::vector<BlockFn> subgroup_fns;
  for (int64_t h0 = 0; h0 < group; h0 += MAX_GROUP)
    subgroup_fns.push_back(block_fn(std::min<int64_t>(MAX_GROUP, group - h0), head_dim));

  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    const int64_t task_heads = heads_per_task * group;
    std::vector<vf> acc(task_heads * dv);
    std::vector<float> m(task_heads), l(task_heads), p(std::min<int64_t>(group, MAX_GROUP) * block_size);
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < num_tasks;) {
      const int64_t seq = order[i] / splits, first_kv = (order[i] % splits) * heads_per_task;
      const int64_t len = lens[seq];
      const int32_t* table = tables + seq * table_row;
      std::fill(acc.begin(), acc.end(), vf{});
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t b = 0; b * block_size < len; ++b) {
        const int64_t n = std::min(block_size, len - b * block_size);
        for (int64_t kv = 0; kv < heads_per_task; ++kv) {
          const float* kt = kp + table[b] * k_block + (first_kv + kv) * k_head;
          const float* vb = vp + table[b] * v_block + (first_kv + kv) * v_head;
          // The group's query heads, at most MAX_GROUP at a time.
          for (size_t sub = 0; sub < subgroup_fns.size(); ++sub) {
            const int64_t h0 = static_cast<int64_t>(sub) * MAX_GROUP;
            const int64_t local = kv * group + h0;  // index among this task's query heads
            const float* qh = qp + seq * q_row + ((first_kv + kv) * group + h0) * q_head;
            subgroup_fns[sub](qh, q_head, kt, vb, block_size, n, fscale,
                              HeadState{m.data() + local, l.data() + local, acc.data() + local * dv}, p.data());
          }
        }
      }
      for (int64_t h = 0; h < task_heads; ++h) {
        float* o = op + seq * o_row + (first_kv * group + h) * o_head;
        const vf inv = splat(1.f / l[h]);
        for (int64_t c = 0; c < dv; ++c) storeu(o + c * L, acc[h * dv + c] * inv);
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("decode_attention", &decode_attention, "paged decode attention over vLLM's CPU cache layout");
}
