// The tiling of the CUDA flash attention kernels, tested where no GPU is:
// their CPU twin (kernels/cpu/attention_tiled.h), which walks the same tiles
// with the same recurrences, against CpuOps's attention (the reference) in
// fp32. Cases cross the 64-row tiles: lengths 1, not multiples of 64, more
// than two tiles; causal and bidirectional; cross-attention with other key
// lengths per sequence and a sequence with no keys; the log-length scale;
// q, k, v as column slices of one fused tensor with a pad column.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_tiled.h"
#include "kernels/ops.h"

namespace mpiformer {
namespace {

using Vec = std::vector<float>;

Vec random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  Vec x(n);
  for (float& v : x) v = u(rng);
  return x;
}

// max |got - want| <= rel * max(1, max |want|), reported at the worst element.
void expect_close(const Vec& got, const Vec& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 1.0, worst = 0.0;
  size_t at = 0;
  for (float w : want) largest = std::max(largest, std::abs(static_cast<double>(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst)) worst = d, at = i;  // NaN counts as worst
  }
  EXPECT_LE(worst, rel * largest) << what << ": worst at " << at << ": " << got[at] << " vs "
                                  << want[at];
}

struct Batch {
  std::vector<int32_t> offsets{0};
  explicit Batch(const std::vector<int>& lengths) {
    for (int len : lengths) offsets.push_back(offsets.back() + len);
  }
  Ragged view() const {
    Ragged r;
    r.host_offsets = r.device_offsets = offsets.data();
    r.batch = static_cast<int>(offsets.size()) - 1;
    r.total = offsets.back();
    for (int b = 0; b < r.batch; ++b) r.max_len = std::max(r.max_len, r.length(b));
    return r;
  }
};

struct TilingCase {
  std::string name;
  std::vector<int> q_lengths, k_lengths;
  int heads, head_dim;
  bool causal;
  AttentionScale scale = AttentionScale::kStandard;
  bool fused = true;  // q, k, v column slices of one (N, 3C + 1) tensor
};

void PrintTo(const TilingCase& tc, std::ostream* os) {
  *os << tc.name;
}

// Operands: fused, one (N, 3C + 1) tensor q | k | v | pad; cross, q (Nq, C + 1)
// and kv (Nk, 2C + 1), each with a pad column.
struct Operands {
  int q_stride, kv_stride, k_column;
  Vec q_buf, kv_buf;
  const float* q() const { return q_buf.data(); }
  const float* k(bool fused) const { return (fused ? q_buf : kv_buf).data() + k_column; }
};

Operands operands(const TilingCase& tc, int Nq, int Nk) {
  const int C = tc.heads * tc.head_dim;
  Operands o;
  o.q_stride = tc.fused ? 3 * C + 1 : C + 1;
  o.kv_stride = tc.fused ? 3 * C + 1 : 2 * C + 1;
  o.k_column = tc.fused ? C : 0;
  o.q_buf = random_vec(static_cast<size_t>(Nq) * o.q_stride, 11);
  if (!tc.fused) o.kv_buf = random_vec(static_cast<size_t>(Nk) * o.kv_stride, 12);
  return o;
}

// The gradient columns [0, written) of rows `stride` apart, after checking
// that the columns past them still hold the sentinel.  buf: (rows, stride)
Vec written_columns(const Vec& buf, int rows, int stride, int written, float sentinel,
                    const std::string& what) {
  Vec cols;
  for (int i = 0; i < rows; ++i) {
    for (int c = 0; c < stride; ++c) {
      const float x = buf[static_cast<size_t>(i) * stride + c];
      if (c < written)
        cols.push_back(x);
      else
        EXPECT_EQ(x, sentinel) << what << ": pad column written, row " << i;
    }
  }
  return cols;
}

class AttentionTiling : public ::testing::TestWithParam<TilingCase> {
 protected:
  std::unique_ptr<Ops> reference = make_cpu_ops(2);
};

TEST_P(AttentionTiling, TwinMatchesTheReference) {
  const TilingCase& tc = GetParam();
  const AttentionConfig cfg{tc.heads, tc.head_dim, tc.causal, tc.scale, 64.0f};
  const int C = tc.heads * tc.head_dim;
  const Batch qb(tc.q_lengths), kb(tc.fused ? tc.q_lengths : tc.k_lengths);
  const Ragged qs = qb.view(), ks = kb.view();
  const int Nq = qs.total, Nk = ks.total;
  const Operands o = operands(tc, Nq, Nk);
  const float *q = o.q(), *k = o.k(tc.fused), *v = k + C;

  Vec out(static_cast<size_t>(Nq) * C), stats(static_cast<size_t>(Nq) * tc.heads);
  Vec ref_out(out.size()), ref_stats(stats.size());
  reference->attention_forward(Act::f32(ref_out.data()), ref_stats.data(), Act::f32(q), o.q_stride,
                               Act::f32(k), Act::f32(v), o.kv_stride, qs, ks, cfg);
  cpu::tiled_attention_forward(out.data(), stats.data(), q, o.q_stride, k, v, o.kv_stride, qs, ks,
                               cfg);
  expect_close(out, ref_out, 1e-5, "out");
  expect_close(stats, ref_stats, 1e-5, "stats");

  // Backward from the reference's forward, so only the backward differs.
  const float kSentinel = 7.0f;
  const Vec dout = random_vec(out.size(), 13);
  Vec grads[2][2];  // [twin, reference][dq buffer, dkv buffer]
  for (int ref = 0; ref < 2; ++ref) {
    Vec& dq_buf = grads[ref][0];
    Vec& dkv_buf = grads[ref][1];
    dq_buf.assign(o.q_buf.size(), kSentinel);
    dkv_buf.assign(o.kv_buf.size(), kSentinel);
    float* dk = (tc.fused ? dq_buf : dkv_buf).data() + o.k_column;
    if (ref) {
      reference->attention_backward(Act::f32(dq_buf.data()), Act::f32(dk), Act::f32(dk + C),
                                    Act::f32(dout.data()), Act::f32(ref_out.data()),
                                    ref_stats.data(), Act::f32(q), o.q_stride, Act::f32(k),
                                    Act::f32(v), o.kv_stride, qs, ks, cfg);
    } else {
      cpu::tiled_attention_backward(dq_buf.data(), dk, dk + C, dout.data(), ref_out.data(),
                                    ref_stats.data(), q, o.q_stride, k, v, o.kv_stride, qs, ks,
                                    cfg);
    }
  }
  const int q_written = tc.fused ? 3 * C : C;
  expect_close(written_columns(grads[0][0], Nq, o.q_stride, q_written, kSentinel, "twin dq"),
               written_columns(grads[1][0], Nq, o.q_stride, q_written, kSentinel, "ref dq"), 1e-4,
               tc.fused ? "dqkv" : "dq");
  if (!tc.fused) {
    expect_close(written_columns(grads[0][1], Nk, o.kv_stride, 2 * C, kSentinel, "twin dkv"),
                 written_columns(grads[1][1], Nk, o.kv_stride, 2 * C, kSentinel, "ref dkv"), 1e-4,
                 "dkv");
  }
}

// Each (tile, head) sums on its own: the same bits on 1 thread as on 2.
TEST_P(AttentionTiling, TwinBitsDoNotDependOnThreads) {
  const TilingCase& tc = GetParam();
  const AttentionConfig cfg{tc.heads, tc.head_dim, tc.causal, tc.scale, 64.0f};
  const int C = tc.heads * tc.head_dim;
  const Batch qb(tc.q_lengths), kb(tc.fused ? tc.q_lengths : tc.k_lengths);
  const Ragged qs = qb.view(), ks = kb.view();
  const Operands o = operands(tc, qs.total, ks.total);
  const float *q = o.q(), *k = o.k(tc.fused), *v = k + C;
  const Vec dout = random_vec(static_cast<size_t>(qs.total) * C, 13);
  Vec results[2];
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Vec out(static_cast<size_t>(qs.total) * C), stats(static_cast<size_t>(qs.total) * tc.heads);
    cpu::tiled_attention_forward(out.data(), stats.data(), q, o.q_stride, k, v, o.kv_stride, qs, ks,
                                 cfg);
    Vec dq(o.q_buf.size()), dkv(tc.fused ? o.q_buf.size() : o.kv_buf.size());
    float* dk = (tc.fused ? dq : dkv).data() + o.k_column;
    cpu::tiled_attention_backward(dq.data(), dk, dk + C, dout.data(), out.data(), stats.data(), q,
                                  o.q_stride, k, v, o.kv_stride, qs, ks, cfg);
    Vec& all = results[threads - 1];
    for (const Vec* part : {&out, &stats, &dq, &dkv})
      all.insert(all.end(), part->begin(), part->end());
  }
  omp_set_num_threads(2);
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)),
            0);
}

constexpr AttentionScale kLog = AttentionScale::kLogLength;
const std::vector<int> kRagged = {1, 13, 64, 65, 130, 7, 200};

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionTiling,
    ::testing::Values(
        TilingCase{"causal_ragged", kRagged, {}, 3, 8, true},
        TilingCase{"bidirectional_ragged", kRagged, {}, 2, 16, false},
        TilingCase{"causal_log_length_d64", {1, 2, 64, 129}, {}, 2, 64, true, kLog},
        TilingCase{"bidirectional_log_length", {17, 17, 3, 90}, {}, 2, 16, false, kLog},
        TilingCase{"causal_empty_sequences", {3, 0, 66, 0, 128}, {}, 2, 8, true},
        TilingCase{"causal_d128", {100, 28}, {}, 1, 128, true},
        TilingCase{"causal_odd_head_size", {13, 1, 66}, {}, 3, 5, true},
        TilingCase{"cross",
                   {5, 70, 1, 129, 64},
                   {64, 3, 130, 1, 200},
                   3,
                   32,
                   false,
                   AttentionScale::kStandard,
                   false},
        TilingCase{
            "cross_no_keys", {5, 70, 3}, {9, 0, 65}, 2, 8, false, AttentionScale::kStandard, false},
        TilingCase{
            "cross_no_keys_log_length", {5, 70, 3, 0}, {9, 0, 65, 4}, 2, 8, false, kLog, false}),
    [](const ::testing::TestParamInfo<TilingCase>& info) { return info.param.name; });

}  // namespace
}  // namespace mpiformer
