// Compute precision on the CPU backend, the reference of the GPU's bf16 and
// fp16: the host conversions round like CUDA's; an op in bf16 or fp16 is the
// fp32 op on the same (rounded) inputs with its stored outputs rounded;
// whole models in bf16 and fp16 follow fp32 to their precision; and the
// dynamic loss scaler.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "src/model/model.h"
#include "src/optim/loss_scaler.h"
#include "tests/test_batches.h"

namespace mpiformer {
namespace {

// ---- conversions ----------------------------------------------------------

// GCC's _Float16 (x86-64, IEEE binary16, round to nearest even) is an
// independent reference for the hand-written conversions.
uint16_t reference_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

TEST(Conversions, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: the even one.
  EXPECT_EQ(float_to_bf16(bits_float(0x3f818000u)), 0x3f82);
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808001u)), 0x3f81);  // above halfway: up
  EXPECT_EQ(float_to_bf16(bits_float(0x3f807fffu)), 0x3f80);  // below halfway: down
  EXPECT_EQ(float_to_bf16(bits_float(0xbf818000u)), 0xbf82);  // negative ties: even too
  EXPECT_EQ(float_to_bf16(bits_float(0x3fff8000u)), 0x4000);  // a tie carries into the exponent
  EXPECT_EQ(float_to_bf16(bits_float(0x00018000u)), 0x0002);  // subnormal tie to even
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(float_to_bf16(bits_float(0x7f800001u)), 0x7fff);  // a NaN that would round to inf
  EXPECT_EQ(float_to_bf16(bits_float(0xffffffffu)), 0x7fff);
  EXPECT_EQ(float_to_bf16(3.4e38f), 0x7f80);                  // beyond bf16's largest: infinity
  EXPECT_EQ(float_to_bf16(bits_float(0x7f7f7fffu)), 0x7f7f);  // just below: the largest
  // A reference over random floats: round to nearest even on the top 16 bits.
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = bits(rng);
    if ((u & 0x7fffffffu) > 0x7f800000u) continue;  // NaN: above
    const uint32_t low = u & 0xffffu, high = u >> 16;
    const uint32_t want = low > 0x8000u || (low == 0x8000u && (high & 1u)) ? high + 1 : high;
    ASSERT_EQ(float_to_bf16(bits_float(u)), want) << std::hex << u;
  }
}

TEST(Conversions, Bf16ToFloatIsExact) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_float(0x3f81), 1.0f + 0x1p-7f);
  EXPECT_EQ(bf16_to_float(0x0001), 0x1p-133f);    // the smallest subnormal
  EXPECT_EQ(bf16_to_float(0x7f7f), 0x1.fep127f);  // the largest finite
  EXPECT_EQ(bf16_to_float(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_float(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fff)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0xffc0)));
  EXPECT_TRUE(std::signbit(bf16_to_float(0x8000)));
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_bits(f), h << 16) << h;  // the top half of an fp32
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), h) << h;  // exact round trip
    }
  }
}

TEST(Conversions, F16MatchesTheCompilersBinary16) {
  // Random bit patterns: every exponent of fp32, so the whole range (zero,
  // fp16 subnormals, normals, overflow) in proportion to its floats.
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    const float f = bits_float(bits(rng));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f), reference_f16(f)) << f;
  }
  // Random floats of fp16's range, log-uniform from 2^-26 to 2^17.
  std::uniform_real_distribution<float> exponent(-26.0f, 17.0f);
  for (int i = 0; i < 1000000; ++i) {
    const float f = std::exp2(exponent(rng)) * (i % 2 ? -1.0f : 1.0f);
    ASSERT_EQ(float_to_f16(f), reference_f16(f)) << f;
  }
  // Every 97th float from 2^-26 to 2^-13 (fp16's subnormals and first
  // normals: ~1.1 million, every rounding case of those bits), and every
  // float around the overflow threshold.
  for (uint32_t u = float_bits(0x1p-26f); u <= float_bits(0x1p-13f); u += 97) {
    ASSERT_EQ(float_to_f16(bits_float(u)), reference_f16(bits_float(u))) << bits_float(u);
  }
  for (uint32_t u = float_bits(65000.0f); u <= float_bits(66000.0f); ++u) {
    ASSERT_EQ(float_to_f16(bits_float(u)), reference_f16(bits_float(u))) << bits_float(u);
  }
  const float edges[] = {0.0f,
                         -0.0f,
                         0x1p-24f,  // the smallest subnormal
                         -0x1p-24f,
                         0x1p-25f,         // half of it: a tie, to even 0
                         0x1.000002p-25f,  // just above the tie: up to 2^-24
                         0x1.8p-24f,       // 1.5 * 2^-24: a tie, to even 2^-23
                         0x1.8p-23f,       // 3 * 2^-24: a tie, to even 4 * 2^-24
                         0x1.ff8p-15f,     // the largest subnormal
                         0x1.ffcp-15f,     // a tie between it and 2^-14
                         0x1p-14f,         // the smallest normal
                         1.0f + 0x1p-11f,  // a tie, to even 1
                         1.0f + 0x1.8p-10f,
                         2049.0f,    // a tie at 2^11, to even 2048
                         65504.0f,   // the largest finite
                         65519.99f,  // below the overflow tie: 65504
                         65520.0f,   // the tie between 65504 and 2^16: infinity
                         -65520.0f,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         1e-30f,
                         std::numeric_limits<float>::denorm_min(),
                         3.0e38f};
  for (float f : edges) EXPECT_EQ(float_to_f16(f), reference_f16(f)) << f;
  EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_f16(-65520.0f), 0xfc00);
  // NaN, whatever its sign and payload: CUDA's canonical 0x7fff.
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(float_to_f16(-std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(float_to_f16(bits_float(0x7f800001u)), 0x7fff);
  EXPECT_EQ(float_to_f16(bits_float(0xffffffffu)), 0x7fff);
}

TEST(Conversions, F16ToFloatMatchesTheCompilersForEveryPattern) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t bits16 = static_cast<uint16_t>(h);
    _Float16 ref;
    std::memcpy(&ref, &bits16, sizeof ref);
    const float want = static_cast<float>(ref), got = f16_to_float(bits16);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(float_bits(got), float_bits(want)) << h;
      ASSERT_EQ(float_to_f16(got), bits16) << h;  // exact round trip
    }
  }
}

// ---- ops in bf16 and fp16 ---------------------------------------------------

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// x rounded to t and widened back: what an op in t reads.
std::vector<float> rounded(const std::vector<float>& x, DType t) {
  std::vector<unsigned char> stored(x.size() * dtype_bytes(t));
  narrow(stored.data(), t, x.data(), x.size());
  std::vector<float> back(x.size());
  widen(back.data(), stored.data(), t, x.size());
  return back;
}

// Host data in type t, for the CPU backend.
struct Stored {
  DType t;
  std::vector<unsigned char> bytes;
  Stored(const std::vector<float>& x, DType type) : t(type), bytes(x.size() * dtype_bytes(type)) {
    narrow(bytes.data(), t, x.data(), x.size());
  }
  Act act() { return Act(bytes.data(), t); }
  std::vector<float> values() const {
    std::vector<float> x(bytes.size() / dtype_bytes(t));
    widen(x.data(), bytes.data(), t, x.size());
    return x;
  }
};

class LowPrecisionOps : public ::testing::TestWithParam<DType> {
 protected:
  DType t() const { return GetParam(); }
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
};

INSTANTIATE_TEST_SUITE_P(Types, LowPrecisionOps, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// Self-attention on a fused QKV tensor, dq, dk, dv written as column slices
// of one gradient tensor: in t, exactly the fp32 op on the rounded inputs
// with rounded outputs, and every slice stored (none overwritten by
// another's view).
TEST_P(LowPrecisionOps, AttentionOnFusedSlices) {
  const int H = 2, D = 4, C = H * D, stride = 3 * C;
  const std::vector<int32_t> offsets = {0, 5, 6, 13};
  const Ragged r{offsets.data(), offsets.data(), 3, 13, 7};
  const AttentionConfig cfg{H, D, true, AttentionScale::kStandard, 64.0f};
  const std::vector<float> qkv = rounded(random_vec(13 * stride, 1), t());
  const std::vector<float> dout = rounded(random_vec(13 * C, 2), t());

  // fp32 on the rounded inputs
  std::vector<float> out32(13 * C), stats32(13 * H), dqkv32(13 * stride);
  const Act q32 = Act::f32(qkv.data());
  ops->attention_forward(Act::f32(out32.data()), stats32.data(), q32, stride, q32 + C, q32 + 2 * C,
                         stride, r, r, cfg);
  const std::vector<float> out_rounded = rounded(out32, t());
  ops->attention_backward(Act::f32(dqkv32.data()), Act::f32(dqkv32.data()) + C,
                          Act::f32(dqkv32.data()) + 2 * C, Act::f32(dout.data()),
                          Act::f32(out_rounded.data()), stats32.data(), q32, stride, q32 + C,
                          q32 + 2 * C, stride, r, r, cfg);

  Stored q(qkv, t()), d(dout, t()), out(std::vector<float>(13 * C), t());
  Stored dq(std::vector<float>(13 * stride), t());
  std::vector<float> stats(13 * H);
  ops->attention_forward(out.act(), stats.data(), q.act(), stride, q.act() + C, q.act() + 2 * C,
                         stride, r, r, cfg);
  EXPECT_EQ(out.values(), out_rounded);
  EXPECT_EQ(stats, stats32);
  ops->attention_backward(dq.act(), dq.act() + C, dq.act() + 2 * C, d.act(), out.act(),
                          stats.data(), q.act(), stride, q.act() + C, q.act() + 2 * C, stride, r, r,
                          cfg);
  EXPECT_EQ(dq.values(), rounded(dqkv32, t())) << "dq, dk and dv, each column slice stored";
}

TEST_P(LowPrecisionOps, AccumulatingAndInPlaceOps) {
  const int N = 9, C = 16, OC = 12;
  const std::vector<float> x = rounded(random_vec(N * C, 3, 2.0f), t());
  const std::vector<float> gamma = rounded(random_vec(C, 4), t());
  const std::vector<float> dout = rounded(random_vec(N * C, 5), t());
  const std::vector<float> dx0 = rounded(random_vec(N * C, 6), t());
  std::vector<float> mean(N), rstd(N), ln(N * C);
  const std::vector<float> beta(C, 0.0f);
  ops->layernorm_forward(Act::f32(ln.data()), mean.data(), rstd.data(), Act::f32(x.data()),
                         Act::f32(gamma.data()), Act::f32(beta.data()), N, C, 1e-5f);

  // layer-norm backward accumulating into dx: dx0 + d, rounded once
  std::vector<float> dx32 = dx0, dg32(C), db32(C);
  ops->layernorm_backward(Act::f32(dx32.data()), dg32.data(), db32.data(), Act::f32(dout.data()),
                          Act::f32(x.data()), Act::f32(gamma.data()), mean.data(), rstd.data(), N,
                          C, true);
  Stored dx(dx0, t()), xs(x, t()), gs(gamma, t()), ds(dout, t());
  std::vector<float> dg(C), db(C);
  ops->layernorm_backward(dx.act(), dg.data(), db.data(), ds.act(), xs.act(), gs.act(), mean.data(),
                          rstd.data(), N, C, true);
  EXPECT_EQ(dx.values(), rounded(dx32, t()));
  EXPECT_EQ(dg, dg32);
  EXPECT_EQ(db, db32);

  // dropout in place
  std::vector<float> dropped32 = x;
  ops->dropout(Act::f32(dropped32.data()), Act::f32(dropped32.data()), x.size(), {0.3f, 1, 2});
  Stored dropped(x, t());
  ops->dropout(dropped.act(), dropped.act(), x.size(), {0.3f, 1, 2});
  EXPECT_EQ(dropped.values(), rounded(dropped32, t()));

  // matmul: forward with a fused activation, backward accumulating into dx
  const std::vector<float> w = rounded(random_vec(OC * C, 7, 0.3f), t());
  const std::vector<float> bias = rounded(random_vec(OC, 8), t());
  std::vector<float> y32(N * OC), pre32(N * OC);
  ops->matmul_forward(Act::f32(y32.data()), Act::f32(x.data()), Act::f32(w.data()),
                      Act::f32(bias.data()), N, C, OC, {Activation::kGelu, Act::f32(pre32.data())});
  Stored ws(w, t()), bs(bias, t()), y(std::vector<float>(N * OC), t()),
      pre(std::vector<float>(N * OC), t());
  ops->matmul_forward(y.act(), xs.act(), ws.act(), bs.act(), N, C, OC,
                      {Activation::kGelu, pre.act()});
  EXPECT_EQ(pre.values(), rounded(pre32, t()));
  EXPECT_EQ(y.values(), rounded(y32, t())) << "the activation of the unrounded pre-activation";

  const std::vector<float> dy = rounded(random_vec(N * OC, 9), t());
  std::vector<float> mdx32 = dx0, dw32(OC * C), mdb32(OC);
  ops->matmul_backward(Act::f32(mdx32.data()), dw32.data(), mdb32.data(), Act::f32(dy.data()),
                       Act::f32(x.data()), Act::f32(w.data()), N, C, OC, true);
  Stored mdx(dx0, t()), dys(dy, t());
  std::vector<float> dw(OC * C), mdb(OC);
  ops->matmul_backward(mdx.act(), dw.data(), mdb.data(), dys.act(), xs.act(), ws.act(), N, C, OC,
                       true);
  EXPECT_EQ(mdx.values(), rounded(mdx32, t()));
  EXPECT_EQ(dw, dw32);
  EXPECT_EQ(mdb, mdb32);

  // cross entropy: the gradient written in place, rounded
  const int V = 13;
  const std::vector<float> logits = rounded(random_vec(N * V, 10, 2.0f), t());
  const std::vector<int32_t> targets = {1, 0, 12, 5, 5, 0, 7, 3, 9};
  std::vector<float> grad32 = logits;
  LossSums sums32, sums;
  ops->cross_entropy(Act::f32(grad32.data()), targets.data(), N, V, 0.1f, 0, 0.25f, true, &sums32);
  Stored grad(logits, t());
  ops->cross_entropy(grad.act(), targets.data(), N, V, 0.1f, 0, 0.25f, true, &sums);
  EXPECT_EQ(grad.values(), rounded(grad32, t()));
  EXPECT_EQ(sums.loss, sums32.loss);
  EXPECT_EQ(sums.tokens, sums32.tokens);
}

// The raw 16-bit patterns of data stored in bf16 or fp16.
std::vector<uint16_t> bits16(const Stored& s) {
  std::vector<uint16_t> h(s.bytes.size() / 2);
  std::memcpy(h.data(), s.bytes.data(), s.bytes.size());
  return h;
}

uint16_t host_conversion(float f, DType t) {
  return t == DType::kBF16 ? float_to_bf16(f) : float_to_f16(f);
}

// convert (the weights' compute copy): the host conversion of every
// element, fp16's overflow to infinity and NaN included.
TEST_P(LowPrecisionOps, ConvertIsTheHostConversion) {
  std::vector<float> x = random_vec(4099, 12, 30.0f);
  x.insert(x.end(),
           {0.0f, -0.0f, 1e-9f, 3e-6f, 7e4f, -7e4f, 1e30f, std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN()});
  Stored out(std::vector<float>(x.size(), 1.0f), t());
  ops->convert(out.act(), x.data(), x.size());
  const std::vector<uint16_t> got = bits16(out);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], host_conversion(x[i], t())) << x[i];
}

// activation_forward and activation_backward (alone and in place), dropout out of place, and the
// embedding lookup and its backward (into fp32 tables, with repeated ids
// and positions, with and without a positions gradient).
TEST_P(LowPrecisionOps, ElementwiseAndEmbeddings) {
  const size_t n = 777;
  const std::vector<float> x = rounded(random_vec(n, 13, 2.0f), t());
  const std::vector<float> dout = rounded(random_vec(n, 14), t());
  for (Activation a : {Activation::kGelu, Activation::kRelu}) {
    SCOPED_TRACE(a == Activation::kGelu ? "gelu" : "relu");
    std::vector<float> dx32(n);
    ops->activation_backward(Act::f32(dx32.data()), Act::f32(dout.data()), Act::f32(x.data()), n,
                             a);
    Stored d(dout, t()), pre(x, t()), dx(std::vector<float>(n), t());
    ops->activation_backward(dx.act(), d.act(), pre.act(), n, a);
    EXPECT_EQ(dx.values(), rounded(dx32, t()));
    ops->activation_backward(d.act(), d.act(), pre.act(), n, a);  // dx aliasing dout
    EXPECT_EQ(d.values(), rounded(dx32, t()));
    std::vector<float> out32(n);
    ops->activation_forward(Act::f32(out32.data()), Act::f32(x.data()), n, a);
    Stored out(std::vector<float>(n), t());
    ops->activation_forward(out.act(), pre.act(), n, a);
    EXPECT_EQ(out.values(), rounded(out32, t()));
  }
  std::vector<float> dropped32(n);
  ops->dropout(Act::f32(dropped32.data()), Act::f32(x.data()), n, {0.4f, 7, 8});
  Stored xs(x, t()), dropped(std::vector<float>(n), t());
  ops->dropout(dropped.act(), xs.act(), n, {0.4f, 7, 8});
  EXPECT_EQ(dropped.values(), rounded(dropped32, t()));

  const int V = 11, L = 7, C = 8;
  const std::vector<int32_t> ids = {3, 0, 3, 5, 1, 3, 0, 10, 10, 4, 3, 2};
  const std::vector<int32_t> pos = {0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 4, 6};
  const int N = static_cast<int>(ids.size());
  const float scale = std::sqrt(static_cast<float>(C));
  const std::vector<float> tokens = rounded(random_vec(V * C, 15), t());
  const std::vector<float> positions = rounded(random_vec(L * C, 16), t());
  std::vector<float> out32(N * C);
  ops->embedding_forward(Act::f32(out32.data()), ids.data(), Act::f32(tokens.data()), pos.data(),
                         Act::f32(positions.data()), N, C, scale);
  Stored ts(tokens, t()), ps(positions, t()), out(std::vector<float>(N * C), t());
  ops->embedding_forward(out.act(), ids.data(), ts.act(), pos.data(), ps.act(), N, C, scale);
  EXPECT_EQ(out.values(), rounded(out32, t()));

  std::vector<int32_t> id_keys, id_starts, id_rows, pos_keys, pos_starts, pos_rows;
  const int id_groups = group_rows_by_key(ids.data(), N, &id_keys, &id_starts, &id_rows);
  const int pos_groups = group_rows_by_key(pos.data(), N, &pos_keys, &pos_starts, &pos_rows);
  const RowGroups by_id{id_keys.data(), id_starts.data(), id_rows.data(), id_groups};
  const RowGroups by_pos{pos_keys.data(), pos_starts.data(), pos_rows.data(), pos_groups};
  const std::vector<float> g = rounded(random_vec(N * C, 17), t());
  const std::vector<float> dtokens0 = random_vec(V * C, 18), dpositions0 = random_vec(L * C, 19);
  std::vector<float> dtokens32 = dtokens0, dpositions32 = dpositions0;
  ops->embedding_backward(dtokens32.data(), dpositions32.data(), Act::f32(g.data()), by_id, by_pos,
                          N, C, scale);
  Stored gs(g, t());
  std::vector<float> dtokens = dtokens0, dpositions = dpositions0, dtokens_only = dtokens0;
  ops->embedding_backward(dtokens.data(), dpositions.data(), gs.act(), by_id, by_pos, N, C, scale);
  EXPECT_EQ(dtokens, dtokens32);
  EXPECT_EQ(dpositions, dpositions32);
  ops->embedding_backward(dtokens_only.data(), nullptr, gs.act(), by_id, by_pos, N, C, scale);
  EXPECT_EQ(dtokens_only, dtokens32);
}

// layernorm_forward, and residual_layernorm_forward, which rounds the
// residual sum to its storage type before normalising it (the stored
// residual stream is what the fused GPU kernel normalises): its reference
// is the fp32 op's sum, rounded, then the fp32 norm of that.
TEST_P(LowPrecisionOps, LayerNormAndResidual) {
  const int N = 13, C = 20;
  const size_t n = static_cast<size_t>(N) * C;
  const std::vector<float> x = rounded(random_vec(n, 20, 3.0f), t());
  const std::vector<float> gamma = rounded(random_vec(C, 21), t());
  const std::vector<float> beta = rounded(random_vec(C, 22), t());
  std::vector<float> out32(n), mean32(N), rstd32(N);
  ops->layernorm_forward(Act::f32(out32.data()), mean32.data(), rstd32.data(), Act::f32(x.data()),
                         Act::f32(gamma.data()), Act::f32(beta.data()), N, C, 1e-5f);
  Stored xs(x, t()), gs(gamma, t()), bs(beta, t()), out(std::vector<float>(n), t());
  std::vector<float> mean(N), rstd(N);
  ops->layernorm_forward(out.act(), mean.data(), rstd.data(), xs.act(), gs.act(), bs.act(), N, C,
                         1e-5f);
  EXPECT_EQ(out.values(), rounded(out32, t()));
  EXPECT_EQ(mean, mean32);
  EXPECT_EQ(rstd, rstd32);

  // The backward writing dx (=); the accumulating one is checked above.
  const std::vector<float> dout = rounded(random_vec(n, 34), t());
  std::vector<float> dx32(n), dg32(C), db32(C), dg(C), db(C);
  ops->layernorm_backward(Act::f32(dx32.data()), dg32.data(), db32.data(), Act::f32(dout.data()),
                          Act::f32(x.data()), Act::f32(gamma.data()), mean32.data(), rstd32.data(),
                          N, C, false);
  Stored ds(dout, t()), dx(std::vector<float>(n, 7.0f), t());
  ops->layernorm_backward(dx.act(), dg.data(), db.data(), ds.act(), xs.act(), gs.act(), mean.data(),
                          rstd.data(), N, C, false);
  EXPECT_EQ(dx.values(), rounded(dx32, t()));
  EXPECT_EQ(dg, dg32);
  EXPECT_EQ(db, db32);

  const std::vector<float> y = rounded(random_vec(n, 23), t());
  for (float p : {0.0f, 0.2f}) {
    SCOPED_TRACE("dropout " + std::to_string(p));
    const Dropout d{p, 3, 4};
    std::vector<float> sum32(n), unused(n);
    ops->residual_layernorm_forward(Act::f32(sum32.data()), Act::f32(unused.data()), mean32.data(),
                                    rstd32.data(), Act::f32(x.data()), Act::f32(y.data()), d,
                                    Act::f32(gamma.data()), Act::f32(beta.data()), N, C, 1e-5f);
    const std::vector<float> sum_rounded = rounded(sum32, t());
    ops->layernorm_forward(Act::f32(out32.data()), mean32.data(), rstd32.data(),
                           Act::f32(sum_rounded.data()), Act::f32(gamma.data()),
                           Act::f32(beta.data()), N, C, 1e-5f);
    Stored ys(y, t()), sum(std::vector<float>(n), t()), normed(std::vector<float>(n), t());
    ops->residual_layernorm_forward(sum.act(), normed.act(), mean.data(), rstd.data(), xs.act(),
                                    ys.act(), d, gs.act(), bs.act(), N, C, 1e-5f);
    EXPECT_EQ(sum.values(), sum_rounded);
    EXPECT_EQ(normed.values(), rounded(out32, t()));
    EXPECT_EQ(mean, mean32);
    EXPECT_EQ(rstd, rstd32);
  }
}

// A GEMM into rows of a padded stride (the columns past OC keep what they
// held: only the slice is stored), plain and with a fused activation, and
// the backward from dout rows in that stride through a fused activation,
// with a bias gradient; without dx.
TEST_P(LowPrecisionOps, MatmulStridesAndFusedBackward) {
  const int N = 7, IC = 12, OC = 10, stride = 16;
  const std::vector<float> x = rounded(random_vec(N * IC, 24), t());
  const std::vector<float> w = rounded(random_vec(OC * IC, 25, 0.3f), t());
  const std::vector<float> b = rounded(random_vec(OC, 26), t());
  std::vector<float> y32(N * stride, 3.0f);
  ops->matmul_forward(Act::f32(y32.data()), Act::f32(x.data()), Act::f32(w.data()),
                      Act::f32(b.data()), N, IC, OC, {}, stride);
  Stored xs(x, t()), ws(w, t()), bs(b, t()), y(std::vector<float>(N * stride, 3.0f), t());
  ops->matmul_forward(y.act(), xs.act(), ws.act(), bs.act(), N, IC, OC, {}, stride);
  EXPECT_EQ(y.values(), rounded(y32, t())) << "the pad columns keep 3";

  for (Activation a : {Activation::kGelu, Activation::kRelu}) {  // fused, into the stride
    std::vector<float> f32(N * stride, 3.0f), pre32(N * OC);
    ops->matmul_forward(Act::f32(f32.data()), Act::f32(x.data()), Act::f32(w.data()),
                        Act::f32(b.data()), N, IC, OC, {a, Act::f32(pre32.data())}, stride);
    Stored fy(std::vector<float>(N * stride, 3.0f), t()), fpre(std::vector<float>(N * OC), t());
    ops->matmul_forward(fy.act(), xs.act(), ws.act(), bs.act(), N, IC, OC, {a, fpre.act()}, stride);
    EXPECT_EQ(fy.values(), rounded(f32, t())) << "fused: the pad columns keep 3";
    EXPECT_EQ(fpre.values(), rounded(pre32, t()));
  }

  const std::vector<float> dout = y.values();  // (N, stride)
  const std::vector<float> pre = rounded(random_vec(N * IC, 27, 2.0f), t());
  for (Activation a : {Activation::kGelu, Activation::kRelu}) {
    SCOPED_TRACE(a == Activation::kGelu ? "gelu" : "relu");
    std::vector<float> dx32(N * IC), dw32(OC * IC), db32(OC);
    ops->matmul_backward(Act::f32(dx32.data()), dw32.data(), db32.data(), Act::f32(dout.data()),
                         Act::f32(x.data()), Act::f32(w.data()), N, IC, OC, false,
                         {a, Act::f32(pre.data())}, stride);
    Stored ps(pre, t()), dx(std::vector<float>(N * IC, 5.0f), t());
    std::vector<float> dw(OC * IC), db(OC);
    ops->matmul_backward(dx.act(), dw.data(), db.data(), y.act(), xs.act(), ws.act(), N, IC, OC,
                         false, {a, ps.act()}, stride);
    EXPECT_EQ(dx.values(), rounded(dx32, t()));
    EXPECT_EQ(dw, dw32);
    EXPECT_EQ(db, db32);
  }
  std::vector<float> dw32(OC * IC), dw(OC * IC);
  ops->matmul_backward(Act(), dw32.data(), nullptr, Act::f32(dout.data()), Act::f32(x.data()),
                       Act::f32(w.data()), N, IC, OC, false, {}, stride);
  ops->matmul_backward(Act(), dw.data(), nullptr, y.act(), xs.act(), ws.act(), N, IC, OC, false, {},
                       stride);
  EXPECT_EQ(dw, dw32);
}

// Cross entropy over logits rows in a padded stride: without a gradient the
// logits keep their bits and the sums add up (+=) over calls; with one, the
// gradient is stored in the rows' first V columns only.
TEST_P(LowPrecisionOps, CrossEntropyWithAStride) {
  const int N = 6, V = 9, stride = 12;
  std::vector<float> logits = rounded(random_vec(N * stride, 28, 3.0f), t());
  for (int i = 0; i < N; ++i) {
    for (int c = V; c < stride; ++c) logits[i * stride + c] = 3.0f;
  }
  const std::vector<int32_t> targets = {2, 0, 8, 4, 1, 0};  // pad 0: rows 1 and 5
  LossSums sums32;
  std::vector<float> copy32 = logits;
  for (int k = 0; k < 2; ++k) {
    ops->cross_entropy(Act::f32(copy32.data()), targets.data(), N, V, 0.1f, 0, 1.0f, false, &sums32,
                       stride);
  }
  Stored ls(logits, t());
  const std::vector<unsigned char> before = ls.bytes;
  LossSums sums;
  for (int k = 0; k < 2; ++k) {
    ops->cross_entropy(ls.act(), targets.data(), N, V, 0.1f, 0, 1.0f, false, &sums, stride);
  }
  EXPECT_EQ(ls.bytes, before);
  EXPECT_EQ(sums.loss, sums32.loss);
  EXPECT_EQ(sums.tokens, 8);
  EXPECT_EQ(sums.correct, sums32.correct);

  ops->cross_entropy(Act::f32(copy32.data()), targets.data(), N, V, 0.1f, 0, 0.5f, true, &sums32,
                     stride);
  ops->cross_entropy(ls.act(), targets.data(), N, V, 0.1f, 0, 0.5f, true, &sums, stride);
  EXPECT_EQ(ls.values(), rounded(copy32, t())) << "the pad columns keep 3";
  EXPECT_EQ(sums.loss, sums32.loss);
  EXPECT_EQ(sums.tokens, 12);
}

// Cross-attention (q and a fused kv in their own buffers, with pad columns)
// over ragged lengths with empty query and key sequences, log-length scale:
// as the fp32 op; the gradients' pad columns keep their contents.
TEST_P(LowPrecisionOps, CrossAttentionWithEmptySequences) {
  const int H = 2, D = 3, C = H * D, q_stride = C + 2, kv_stride = 2 * C + 1;
  const std::vector<int32_t> q_offsets = {0, 0, 2, 5, 9}, k_offsets = {0, 3, 3, 5, 10};
  const Ragged qs{q_offsets.data(), q_offsets.data(), 4, 9, 4};
  const Ragged ks{k_offsets.data(), k_offsets.data(), 4, 10, 5};
  AttentionConfig cfg{H, D, false, AttentionScale::kLogLength, 4.0f};
  const std::vector<float> q = rounded(random_vec(9 * q_stride, 29), t());
  const std::vector<float> kv = rounded(random_vec(10 * kv_stride, 30), t());
  const std::vector<float> dout = rounded(random_vec(9 * C, 31), t());
  std::vector<float> out32(9 * C), stats32(9 * H), dq32(9 * q_stride, 5.0f),
      dkv32(10 * kv_stride, 5.0f);
  const Act kv32 = Act::f32(kv.data()), dkv32_act = Act::f32(dkv32.data());
  ops->attention_forward(Act::f32(out32.data()), stats32.data(), Act::f32(q.data()), q_stride, kv32,
                         kv32 + C, kv_stride, qs, ks, cfg);
  const std::vector<float> out_rounded = rounded(out32, t());
  ops->attention_backward(Act::f32(dq32.data()), dkv32_act, dkv32_act + C, Act::f32(dout.data()),
                          Act::f32(out_rounded.data()), stats32.data(), Act::f32(q.data()),
                          q_stride, kv32, kv32 + C, kv_stride, qs, ks, cfg);

  Stored qt(q, t()), kvt(kv, t()), dt(dout, t()), out(std::vector<float>(9 * C), t());
  Stored dq(std::vector<float>(9 * q_stride, 5.0f), t()),
      dkv(std::vector<float>(10 * kv_stride, 5.0f), t());
  std::vector<float> stats(9 * H);
  ops->attention_forward(out.act(), stats.data(), qt.act(), q_stride, kvt.act(), kvt.act() + C,
                         kv_stride, qs, ks, cfg);
  EXPECT_EQ(out.values(), out_rounded);
  EXPECT_EQ(stats, stats32);
  ops->attention_backward(dq.act(), dkv.act(), dkv.act() + C, dt.act(), out.act(), stats.data(),
                          qt.act(), q_stride, kvt.act(), kvt.act() + C, kv_stride, qs, ks, cfg);
  EXPECT_EQ(dq.values(), rounded(dq32, t()));
  EXPECT_EQ(dkv.values(), rounded(dkv32, t())) << "dk and dv: column slices of one buffer";
}

// AdamW with a compute copy in t: the master weights and moments are those
// of the update without one, and the copy holds their conversion.
TEST_P(LowPrecisionOps, AdamWRefreshesTheComputeCopy) {
  const size_t n = 3000;
  const std::vector<float> start = random_vec(n, 32), grads = random_vec(n, 33, 0.1f);
  const std::vector<AdamWRange> ranges = {{0, 1000, 0.1f}, {1000, n, 0.0f}};
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.inv_loss_scale = 0.25f;
  cfg.max_norm = 1.0f;
  double norm_sq = 0.0;
  ops->sum_squares(&norm_sq, grads.data(), n);
  std::vector<float> p32 = start, m32(n), v32(n), p = start, m(n), v(n);
  ops->adamw_update(p32.data(), grads.data(), m32.data(), v32.data(), Act(), n, ranges.data(), 2,
                    cfg, &norm_sq);
  Stored copy(std::vector<float>(n), t());
  ops->adamw_update(p.data(), grads.data(), m.data(), v.data(), copy.act(), n, ranges.data(), 2,
                    cfg, &norm_sq);
  EXPECT_EQ(p, p32);
  EXPECT_EQ(m, m32);
  EXPECT_EQ(v, v32);
  const std::vector<uint16_t> got = bits16(copy);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], host_conversion(p[i], t())) << i;
}

// ---- whole models -----------------------------------------------------------

struct Step {
  LossSums sums;
  std::vector<float> grads;
};

// One step; fp16 with a loss scale of 1024, as training runs it (without
// one, gradients below fp16's 2^-24 vanish), divided out again.
Step model_step(const ModelConfig& m, DType t, const Batch& batch) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  Model model(*ops, m, ModelCapacity{64, m.max_len}, t);
  model.init_parameters(11);
  ParameterSet& p = model.parameters();
  p.zero_grads();
  const float loss_scale = t == DType::kF16 ? 1024.0f : 1.0f;
  model.forward_backward(batch, 0.1f, loss_scale / static_cast<float>(batch.target_tokens(0)),
                         PassId{1, 1, 0});
  Step step{model.take_train_sums(), std::vector<float>(p.grads(), p.grads() + p.count())};
  for (float& g : step.grads) g /= loss_scale;
  return step;
}

// bf16 and fp16 models against fp32, from the same initialisation (the same
// fp32 master weights; the compute copy is their rounding): the loss within
// 1e-2 relative and, per gradient tensor, max |low - fp32| / max |fp32|
// within a tolerance. Measured over these tiny models (lm, seq2seq, mlm) on
// 5 random batches (seeds 21..25): loss within 9e-5 (bf16) and 1e-5 (fp16);
// worst tensor 0.026 in bf16 (typically 0.012-0.019) and 0.0036 in fp16
// with the loss scale of 1024. bf16 keeps 8 significant bits (a rounding
// costs up to 2^-9 = 0.002 relative) and a gradient passes through tens of
// roundings (activations, their gradients, the weights' copy), whose random
// walk gives the ~0.015 seen; fp16's 11 bits give 8x less. Hence 0.05 and
// 0.01: ~2x and ~3x the worst measured, far below the O(1) error of a wrong
// op or a missing rounding. (fp16 without the loss scale measured up to
// 0.12: the seq2seq cross-attention norms' gradients, ~1e-6, fall among
// fp16's subnormals.) Tensors whose fp32 gradient is below 1e-6 everywhere
// (the key bias, zero up to rounding) have no relative difference to take.
TEST(LowPrecisionModels, FollowFp32) {
  for (uint32_t seed = 21; seed <= 25; ++seed) {
    for (ModelKind kind : {ModelKind::kLm, ModelKind::kSeq2seq, ModelKind::kMlm}) {
      ModelConfig m = testing::tiny(kind);
      const Batch batch = testing::random_batch(m, {5, 9, 3}, {4, 7, 6}, seed);
      const Step full = model_step(m, DType::kF32, batch);
      for (DType t : {DType::kBF16, DType::kF16}) {
        const Step low = model_step(m, t, batch);
        const std::string what =
            std::string(to_string(kind)) + " " + to_string(t) + ", batch " + std::to_string(seed);
        EXPECT_EQ(low.sums.tokens, full.sums.tokens) << what;
        EXPECT_NEAR(low.sums.loss, full.sums.loss, 1e-2 * full.sums.loss) << what;
        std::unique_ptr<Ops> ops = make_cpu_ops(1);
        Model shape(*ops, m, ModelCapacity{64, m.max_len});
        const double tolerance = t == DType::kBF16 ? 0.05 : 0.01;
        for (const ParamInfo& info : shape.parameters().info()) {
          double largest = 0.0, worst = 0.0;
          for (size_t i = info.offset; i < info.offset + info.size; ++i) {
            largest = std::max(largest, std::fabs(static_cast<double>(full.grads[i])));
            worst = std::max(worst, std::fabs(static_cast<double>(low.grads[i]) - full.grads[i]));
          }
          if (largest < 1e-6) continue;  // zero up to rounding (a key bias)
          EXPECT_LE(worst, tolerance * largest) << what << " " << info.name;
        }
      }
    }
  }
}

// The loss sums stay on the backend until taken: training and evaluation
// sums are kept apart, both accumulate over passes, and taking them resets
// them. With dropout off, evaluating the batch gives the training pass's
// sums (the same forward).
TEST(LowPrecisionModels, TrainingAndEvaluationSumsAreSeparate) {
  for (ModelKind kind : {ModelKind::kLm, ModelKind::kSeq2seq, ModelKind::kMlm}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string what = std::string(to_string(kind)) + " " + to_string(t);
      ModelConfig m = testing::tiny(kind);
      m.dropout = 0.0f;
      std::unique_ptr<Ops> ops = make_cpu_ops(1);
      Model model(*ops, m, ModelCapacity{64, m.max_len}, t);
      model.init_parameters(1);
      const Batch batch = testing::random_batch(m, {6, 4}, {5, 3}, 22);
      const int64_t tokens = batch.target_tokens(m.special.pad);
      model.forward_backward(batch, 0.1f, 1.0f, PassId{1, 1, 0});
      model.evaluate(batch, 0.1f);
      model.evaluate(batch, 0.1f);
      const LossSums train = model.take_train_sums(), eval = model.take_eval_sums();
      EXPECT_EQ(train.tokens, tokens) << what;
      EXPECT_EQ(eval.tokens, 2 * tokens) << what;
      EXPECT_EQ(eval.loss, 2 * train.loss) << what;
      EXPECT_EQ(eval.correct, 2 * train.correct) << what;
      const LossSums again = model.take_train_sums(), eval_again = model.take_eval_sums();
      EXPECT_EQ(again.tokens, 0) << what << ": taking resets the sums";
      EXPECT_EQ(again.loss, 0.0) << what;
      EXPECT_EQ(again.correct, 0) << what;
      EXPECT_EQ(eval_again.tokens, 0) << what;
      EXPECT_EQ(eval_again.loss, 0.0) << what;
      model.evaluate(batch, 0.1f);
      EXPECT_EQ(model.take_train_sums().tokens, 0)
          << what << ": evaluation adds nothing to training";
      EXPECT_EQ(model.take_eval_sums().loss, train.loss) << what;
    }
  }
}

// ---- loss scaling ---------------------------------------------------------------

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterTheWindow) {
  LossScaler s(true, 1024.0f, 3);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false)) << "an overflow skips the step";
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.good_steps(), 0) << "and restarts the count";
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_TRUE(s.update(true));  // the third good step in a row
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.good_steps(), 0);
}

TEST(LossScaler, StaysWithinItsBoundsAndRestores) {
  LossScaler low(true, 2.0f, 1);
  low.update(false);
  low.update(false);
  low.update(false);
  EXPECT_EQ(low.scale(), 1.0f) << "never below 1";
  LossScaler high(true, 8388608.0f, 1);  // 2^23
  high.update(true);
  high.update(true);
  EXPECT_EQ(high.scale(), 16777216.0f) << "never above 2^24";
  LossScaler restored(true, 65536.0f, 10);
  restored.restore(256.0f, 7);
  EXPECT_EQ(restored.scale(), 256.0f);
  EXPECT_EQ(restored.good_steps(), 7);
  restored.restore(std::numeric_limits<float>::quiet_NaN(), -3);  // a damaged state
  EXPECT_EQ(restored.scale(), 1.0f);
  EXPECT_EQ(restored.good_steps(), 0);
}

TEST(LossScaler, RefusesScalesOutOfRangeAndAnEmptyWindow) {
  EXPECT_THROW(LossScaler(true, 0.5f, 10), std::invalid_argument);
  EXPECT_THROW(LossScaler(true, 33554432.0f, 10), std::invalid_argument);  // 2^25
  EXPECT_THROW(LossScaler(true, std::numeric_limits<float>::infinity(), 10), std::invalid_argument);
  EXPECT_THROW(LossScaler(true, std::numeric_limits<float>::quiet_NaN(), 10),
               std::invalid_argument);
  EXPECT_THROW(LossScaler(true, 1024.0f, 0), std::invalid_argument);
  EXPECT_NO_THROW(LossScaler(true, 1.0f, 1));
  EXPECT_NO_THROW(LossScaler(true, 16777216.0f, 1));
  EXPECT_NO_THROW(LossScaler(false, 0.5f, 10)) << "a fixed scale ignores the initial one";
}

TEST(LossScaler, RecoversFromARunOfOverflows) {
  // Overflows halve the scale step by step down to the floor, every one
  // skipped; then each window of good steps doubles it again.
  LossScaler s(true, 8.0f, 2);
  for (float want : {4.0f, 2.0f, 1.0f, 1.0f}) {
    EXPECT_FALSE(s.update(false));
    EXPECT_EQ(s.scale(), want);
  }
  for (float want : {1.0f, 2.0f, 2.0f, 4.0f}) {
    EXPECT_TRUE(s.update(true));
    EXPECT_EQ(s.scale(), want);
  }
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.good_steps(), 1);
  EXPECT_FALSE(s.update(false)) << "one overflow within a window";
  EXPECT_EQ(s.good_steps(), 0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 2.0f) << "the count restarted: one good step is not a window";
}

TEST(LossScaler, FixedScaleForBf16AndFp32) {
  LossScaler fixed(false, 65536.0f, 2);
  EXPECT_FALSE(fixed.dynamic());
  EXPECT_EQ(fixed.scale(), 1.0f);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(fixed.update(false)) << "a fixed scale always applies the step";
    EXPECT_TRUE(fixed.update(true));
  }
  EXPECT_EQ(fixed.scale(), 1.0f);
  fixed.restore(4096.0f, 1);  // an fp16 checkpoint resumed in bf16
  EXPECT_EQ(fixed.scale(), 1.0f);
}

}  // namespace
}  // namespace mpiformer
