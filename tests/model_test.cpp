// Whole-model tests: the gradient of every parameter tensor against central
// finite differences, for each model kind and option, on tiny configs; and
// the accumulation property the training loop relies on.
#include "src/model/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/observed_ops.h"
#include "src/model/blocks.h"
#include "tests/test_batches.h"

namespace mpiformer {
namespace {

using testing::append_batch;
using testing::random_batch;
using testing::tiny;

struct Fixture {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  std::unique_ptr<Model> model;
  Fixture(const ModelConfig& m, int max_tokens) {
    model = std::make_unique<Model>(*ops, m, ModelCapacity{max_tokens, m.max_len});
    model->init_parameters(7);
  }
};

// Loss of the batch as the training pass computes it (same dropout masks).
double training_loss(Model& model, const Batch& batch, float smoothing, float scale) {
  model.forward_backward(batch, smoothing, scale, PassId{3, 1, 0});
  return model.take_train_sums().loss * scale;
}

// The loss sums of one training pass.
LossSums train_sums(Model& model, const Batch& batch, float smoothing, float scale,
                    const PassId& pass) {
  model.forward_backward(batch, smoothing, scale, pass);
  return model.take_train_sums();
}

// For each parameter tensor: the directional derivative along a random +-1
// direction, (L(p + h d) - L(p - h d)) / 2h, against g . d. Summing over
// the whole tensor keeps fp32 rounding small against the signal; h = 1e-3,
// tolerance 2% relative plus 1e-4 absolute.
void check_gradients(const ModelConfig& m, const Batch& batch, float smoothing) {
  Fixture f(m, 64);
  Model& model = *f.model;
  ParameterSet& p = model.parameters();
  const float scale = 1.0f / static_cast<float>(batch.target_tokens(m.special.pad));
  p.zero_grads();
  training_loss(model, batch, smoothing, scale);
  const std::vector<float> grads(p.grads(), p.grads() + p.count());

  std::mt19937 rng(11);
  const double h = 1e-3;
  for (size_t t = 0; t < p.info().size(); ++t) {
    const ParamInfo& info = p.info()[t];
    float* w = p.param(static_cast<int>(t));
    std::vector<float> saved(w, w + info.size), direction(info.size);
    double analytic = 0.0;
    for (size_t i = 0; i < info.size; ++i) {
      direction[i] = (rng() & 1) ? 1.0f : -1.0f;
      analytic += grads[info.offset + i] * direction[i];
    }
    for (size_t i = 0; i < info.size; ++i) w[i] = saved[i] + static_cast<float>(h) * direction[i];
    const double plus = training_loss(model, batch, smoothing, scale);
    for (size_t i = 0; i < info.size; ++i) w[i] = saved[i] - static_cast<float>(h) * direction[i];
    const double minus = training_loss(model, batch, smoothing, scale);
    std::copy(saved.begin(), saved.end(), w);
    const double numeric = (plus - minus) / (2 * h);
    EXPECT_NEAR(analytic, numeric, 0.02 * std::fabs(numeric) + 1e-4)
        << info.name << " (" << info.size << " values)";
  }
}

TEST(ModelGradient, Lm) {
  ModelConfig m = tiny(ModelKind::kLm);
  check_gradients(m, random_batch(m, {5, 2, 9}, {}, 1), 0.1f);
}

TEST(ModelGradient, LmPostNormSinusoidalUntiedLogLength) {
  ModelConfig m = tiny(ModelKind::kLm);
  m.pre_norm = false;
  m.positions = PositionKind::kSinusoidal;
  m.tied_embeddings = false;
  m.attention_scale = AttentionScale::kLogLength;
  m.attention_ref_len = 8;
  check_gradients(m, random_batch(m, {7, 3, 12}, {}, 2), 0.0f);
}

TEST(ModelGradient, Seq2seq) {
  ModelConfig m = tiny(ModelKind::kSeq2seq);
  check_gradients(m, random_batch(m, {4, 7, 1}, {6, 2, 9}, 3), 0.1f);
}

TEST(ModelGradient, Seq2seqPostNorm) {
  ModelConfig m = tiny(ModelKind::kSeq2seq);
  m.pre_norm = false;
  m.enc_layers = 1;
  m.dec_layers = 2;
  check_gradients(m, random_batch(m, {3, 8}, {10, 4}, 4), 0.2f);
}

TEST(ModelGradient, Mlm) {
  ModelConfig m = tiny(ModelKind::kMlm);
  check_gradients(m, random_batch(m, {6, 11, 2}, {}, 5), 0.1f);
}

TEST(ModelGradient, WithDropoutMasksReplayed) {
  // Dropout masks are a function of the pass id, so the finite differences
  // see the same masks as the analytic gradient.
  ModelConfig m = tiny(ModelKind::kSeq2seq);
  m.dropout = 0.2f;
  check_gradients(m, random_batch(m, {5, 3}, {4, 6}, 6), 0.1f);
}

// The sub-layers' scratch, which the head's logits share: each buffer
// 256-byte aligned from the base, none overlapping another, all inside
// bytes(); no cross-attention buffer without an encoder. With --recompute
// activation, the MLP's activation lies over the attention's gradients
// (datt, dqkv) and over nothing else, so it costs bytes only where d-ff
// exceeds 4 d-model.
TEST(BlockScratch, BuffersAreAlignedApartAndInsideTheirBytes) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int memory_rows : {0, 5}) {
      for (int F : {29, 52, 53, 80}) {
        for (bool activation : {false, true}) {
          SCOPED_TRACE(std::string(to_string(t)) + ", memory rows " + std::to_string(memory_rows) +
                       ", F " + std::to_string(F) + (activation ? ", activation" : ""));
          const int rows = 7, C = 13;
          const size_t bytes = BlockScratch::bytes(t, rows, memory_rows, C, F, activation);
          std::vector<unsigned char> region(bytes + 256);
          unsigned char* base = region.data();
          BlockScratch s;
          s.init(base, t, rows, memory_rows, C, F, activation);
          struct Buffer {
            Act act;
            size_t elements;
            bool attention;  // a gradient only attention uses
          };
          const std::vector<Buffer> buffers = {
              {s.y, rows * C, false},
              {s.dy, rows * C, false},
              {s.du, rows * C, false},
              {s.datt, rows * C, true},
              {s.dqkv, rows * 3 * C, true},
              {s.dff, static_cast<size_t>(rows) * F, false},
              {s.dkv, static_cast<size_t>(memory_rows) * 2 * C, false},
              {s.act, activation ? static_cast<size_t>(rows) * F : 0, false}};
          const auto start = [&](const Buffer& b) {
            return static_cast<size_t>(static_cast<unsigned char*>(b.act.data) - base);
          };
          size_t end = 0;
          for (size_t i = 0; i < buffers.size(); ++i) {
            const Buffer& b = buffers[i];
            if (b.elements == 0) {
              EXPECT_EQ(b.act.data, nullptr) << i;
              continue;
            }
            EXPECT_EQ(start(b) % 256, 0u) << i;
            EXPECT_EQ(b.act.dtype, t) << i;
            const size_t stop = start(b) + b.elements * dtype_bytes(t);
            end = std::max(end, stop);
            for (size_t j = 0; j < i; ++j) {
              const Buffer& o = buffers[j];
              if (o.elements == 0 || (i == 7 && o.attention)) continue;
              const size_t o_stop = start(o) + o.elements * dtype_bytes(t);
              EXPECT_TRUE(stop <= start(o) || o_stop <= start(b)) << i << " overlaps " << j;
            }
          }
          EXPECT_LE(end, bytes);
          EXPECT_GT(end + 256, bytes);
          if (activation) {
            const size_t without = BlockScratch::bytes(t, rows, memory_rows, C, F, false);
            // The attention's gradients hold 4 C elements a row, 256-aligned twice.
            if (F * dtype_bytes(t) * rows + 256 <= 4 * C * dtype_bytes(t) * rows) {
              EXPECT_EQ(bytes, without);
            }
            EXPECT_LE(bytes, without + static_cast<size_t>(rows) * F * dtype_bytes(t) + 256);
          }
        }
      }
    }
  }
}

TEST(Model, MicroBatchesAddUpToTheWholeBatch) {
  // Two micro-batches with grad_scale 1/N_total give the gradient of one
  // batch holding both: the property gradient accumulation and data
  // parallelism rest on.
  ModelConfig m = tiny(ModelKind::kSeq2seq);
  const Batch a = random_batch(m, {4, 6}, {5, 3}, 8);
  const Batch b = random_batch(m, {7}, {2}, 9);
  Batch both = a;
  append_batch(&both, b);
  const int pad = m.special.pad;
  const float scale = 1.0f / static_cast<float>(both.target_tokens(pad));

  Fixture split(m, 64), whole(m, 64);
  split.model->parameters().zero_grads();
  const LossSums sa = train_sums(*split.model, a, 0.1f, scale, PassId{1, 1, 0});
  const LossSums sb = train_sums(*split.model, b, 0.1f, scale, PassId{1, 1, 1});
  whole.model->parameters().zero_grads();
  const LossSums sw = train_sums(*whole.model, both, 0.1f, scale, PassId{1, 1, 0});

  EXPECT_EQ(sa.tokens + sb.tokens, sw.tokens);
  EXPECT_NEAR(sa.loss + sb.loss, sw.loss, 1e-4 * std::fabs(sw.loss));
  ParameterSet& ps = split.model->parameters();
  ParameterSet& pw = whole.model->parameters();
  double max_rel = 0.0;
  for (size_t i = 0; i < ps.count(); ++i) {
    const double d = std::fabs(ps.grads()[i] - pw.grads()[i]);
    max_rel = std::max(max_rel, d / (std::fabs(pw.grads()[i]) + 1e-6));
  }
  EXPECT_LT(max_rel, 1e-3);
}

TEST(Model, SameSeedSameParametersAndLoss) {
  ModelConfig m = tiny(ModelKind::kLm);
  m.dropout = 0.1f;
  const Batch batch = random_batch(m, {5, 8}, {}, 10);
  Fixture x(m, 32), y(m, 32);
  ASSERT_EQ(x.model->parameters().count(), y.model->parameters().count());
  for (size_t i = 0; i < x.model->parameters().count(); ++i)
    ASSERT_EQ(x.model->parameters().params()[i], y.model->parameters().params()[i]);
  const LossSums lx = train_sums(*x.model, batch, 0.1f, 1.0f, PassId{5, 2, 0});
  const LossSums ly = train_sums(*y.model, batch, 0.1f, 1.0f, PassId{5, 2, 0});
  EXPECT_EQ(lx.loss, ly.loss);
  const LossSums other = train_sums(*y.model, batch, 0.1f, 1.0f, PassId{5, 3, 0});
  EXPECT_NE(lx.loss, other.loss) << "another step must draw other dropout masks";
}

TEST(Model, RejectsBatchBeyondCapacity) {
  ModelConfig m = tiny(ModelKind::kLm);
  Fixture f(m, 8);
  const Batch batch = random_batch(m, {6, 6}, {}, 12);
  EXPECT_THROW(f.model->evaluate(batch, 0.0f), std::runtime_error);
}

TEST(Model, FlopsFollowTheDesignConvention) {
  // lm: 6 N per token + 12 L d T per token of a sequence of length T.
  ModelConfig m = tiny(ModelKind::kLm);
  Fixture f(m, 32);
  const Batch batch = random_batch(m, {4, 8}, {}, 13);
  const double N = static_cast<double>(f.model->flop_parameters());
  const double expected = 6 * N * 12 + 12.0 * m.layers * m.d_model * (4 * 4 + 8 * 8);
  EXPECT_DOUBLE_EQ(f.model->training_flops(batch), expected);
  // non-embedding params + output projection: everything but the position
  // table (the tied token table counts once, as the projection)
  const double all = static_cast<double>(f.model->parameters().count());
  EXPECT_DOUBLE_EQ(N, all - m.max_len * m.d_model);
}

// ---- --recompute activation and layer

// The offsets backward reports final, in order (what the reducer hears).
struct OffsetLog : GradientListener {
  std::vector<size_t> offsets;
  void gradients_final(size_t offset) override { offsets.push_back(offset); }
};

// One model of a capacity (64 rows) and recompute mode.
std::unique_ptr<Model> model_with(Ops& ops, const ModelConfig& m, Recompute recompute,
                                  DType compute = DType::kF32) {
  auto model = std::make_unique<Model>(ops, m, ModelCapacity{64, m.max_len, 0, recompute}, compute);
  model->init_parameters(7);
  return model;
}

// What two micro-batches of training (a, then b) and an evaluation of a leave.
struct Trained {
  std::vector<float> grads;
  LossSums sums;
  std::vector<size_t> offsets;
  double eval_loss = 0.0;
  std::vector<ParamInfo> info;
};

Trained train_two(const ModelConfig& m, Recompute recompute, DType compute, const Batch& a,
                  const Batch& b) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  std::unique_ptr<Model> model = model_with(*ops, m, recompute, compute);
  OffsetLog heard;
  model->parameters().zero_grads();
  model->forward_backward(a, 0.1f, 0.01f, PassId{3, 2, 0}, &heard);
  model->forward_backward(b, 0.1f, 0.01f, PassId{3, 2, 1}, &heard);
  Trained t;
  t.sums = model->take_train_sums();
  const ParameterSet& p = model->parameters();
  t.grads.assign(p.grads(), p.grads() + p.count());
  t.offsets = heard.offsets;
  t.info = p.info();
  // Evaluation (no backward) runs through the shared set too.
  model->evaluate(a, 0.1f);
  t.eval_loss = model->take_eval_sums().loss;
  return t;
}

// Two micro-batches of training with dropout: each of `modes` must give the
// gradients, loss sums and reported offsets of --recompute none, bit for
// bit. layer reruns each layer's forward from its kept input with the same
// masks; activation makes the MLP's activation again from its pre-
// activation, which in fp32 is the forward's own, and a pre-LN sub-layer's
// input norm from the stored stream by forward's row routine.
void expect_recompute_same_bits(ModelConfig m, const Batch& a, const Batch& b,
                                DType compute = DType::kF32,
                                std::vector<Recompute> modes = {Recompute::kActivation,
                                                                Recompute::kLayer}) {
  m.dropout = 0.1f;
  const Trained none = train_two(m, Recompute::kNone, compute, a, b);
  double norm = 0.0;
  for (float g : none.grads) norm += std::fabs(g);
  EXPECT_GT(norm, 0.0);
  for (Recompute mode : modes) {
    SCOPED_TRACE(std::string("--recompute ") + to_string(mode));
    const Trained other = train_two(m, mode, compute, a, b);
    ASSERT_EQ(none.grads.size(), other.grads.size());
    EXPECT_EQ(std::memcmp(none.grads.data(), other.grads.data(), none.grads.size() * sizeof(float)),
              0)
        << "gradients differ";
    EXPECT_EQ(none.sums.loss, other.sums.loss);
    EXPECT_EQ(none.sums.nll, other.sums.nll);
    EXPECT_EQ(none.sums.tokens, other.sums.tokens);
    EXPECT_EQ(none.sums.correct, other.sums.correct);
    EXPECT_EQ(none.offsets, other.offsets);
    EXPECT_EQ(other.offsets.back(), 0u);
    EXPECT_EQ(none.eval_loss, other.eval_loss);
  }
}

TEST(Recompute, LmGradientsAreTheSameBits) {
  ModelConfig m = tiny(ModelKind::kLm);
  m.layers = 3;
  expect_recompute_same_bits(m, random_batch(m, {5, 2, 9}, {}, 21),
                             random_batch(m, {12, 4}, {}, 22));
}

TEST(Recompute, LmPostNormBf16GradientsAreTheSameBits) {
  ModelConfig m = tiny(ModelKind::kLm);
  m.layers = 3;
  m.pre_norm = false;
  m.positions = PositionKind::kSinusoidal;
  expect_recompute_same_bits(m, random_batch(m, {7, 3, 12}, {}, 23), random_batch(m, {6}, {}, 24),
                             DType::kBF16, {Recompute::kLayer});
}

// In bf16, --recompute activation makes the MLP's activation again from the
// rounded pre-activation where forward used the unrounded one: only the
// gradients that read it, the MLPs' proj weights, may differ, and by
// rounding alone; everything upstream reads the same pre-activation, and
// the input norms made again (pre-LN) are the same bits.
TEST(Recompute, ActivationInBf16ChangesOnlyTheProjectionWeightGradients) {
  for (bool pre : {true, false}) {
    SCOPED_TRACE(pre ? "pre-LN" : "post-LN");
    ModelConfig m = tiny(ModelKind::kLm);
    m.layers = 3;
    m.pre_norm = pre;
    m.dropout = 0.1f;
    const Batch a = random_batch(m, {7, 3, 12}, {}, 23), b = random_batch(m, {6}, {}, 24);
    const Trained none = train_two(m, Recompute::kNone, DType::kBF16, a, b);
    const Trained act = train_two(m, Recompute::kActivation, DType::kBF16, a, b);
    EXPECT_EQ(none.sums.loss, act.sums.loss);
    EXPECT_EQ(none.eval_loss, act.eval_loss);
    int differing = 0;
    for (const ParamInfo& info : none.info) {
      const float* x = none.grads.data() + info.offset;
      const float* y = act.grads.data() + info.offset;
      const bool proj = info.name.find(".mlp.proj.weight") != std::string::npos;
      double largest = 0.0, diff = 0.0;
      for (size_t i = 0; i < info.size; ++i) {
        largest = std::max(largest, std::fabs(static_cast<double>(x[i])));
        diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
      }
      if (!proj) {
        EXPECT_EQ(std::memcmp(x, y, info.size * sizeof(float)), 0) << info.name;
        continue;
      }
      differing += diff > 0.0;
      EXPECT_GT(largest, 0.0) << info.name;
      EXPECT_LE(diff, 0.02 * largest) << info.name;
    }
    EXPECT_GT(differing, 0) << "bf16 rounding should show in some proj weight gradient";
  }
}

TEST(Recompute, Seq2seqGradientsAreTheSameBits) {
  ModelConfig m = tiny(ModelKind::kSeq2seq);
  m.enc_layers = 3;
  m.dec_layers = 2;
  expect_recompute_same_bits(m, random_batch(m, {4, 7, 1}, {6, 2, 9}, 25),
                             random_batch(m, {8}, {3}, 26));
}

TEST(Recompute, Seq2seqPostNormGradientsAreTheSameBits) {
  ModelConfig m = tiny(ModelKind::kSeq2seq);
  m.pre_norm = false;
  m.enc_layers = 2;
  m.dec_layers = 3;
  expect_recompute_same_bits(m, random_batch(m, {3, 8}, {10, 4}, 27),
                             random_batch(m, {5, 5}, {5, 5}, 28));
}

TEST(Recompute, MlmGradientsAreTheSameBits) {
  ModelConfig m = tiny(ModelKind::kMlm);
  expect_recompute_same_bits(m, random_batch(m, {6, 11, 2}, {}, 29), random_batch(m, {9}, {}, 30));
}

TEST(Recompute, ClassifyGradientsAreTheSameBits) {
  ModelConfig m = tiny(ModelKind::kClassify);
  m.num_labels = 3;
  auto labelled = [&](const std::vector<int>& lengths, uint32_t seed) {
    Batch batch = random_batch(m, lengths, {}, seed);
    batch.targets.clear();
    for (int s = 0; s < batch.decoder.batch(); ++s) batch.targets.push_back(s % m.num_labels);
    return batch;
  };
  expect_recompute_same_bits(m, labelled({6, 11, 2}, 31), labelled({4, 9}, 32));
}

// The CPU's ops, asking the model for the output projections' bias
// gradients from the layer norm backward after them (as a GPU does under
// MPIFORMER_KERNELS=dbias_out=norm), counting the calls that sum them there.
class BiasGradInNorm : public ObservedOps {
 public:
  using ObservedOps::ObservedOps;
  bool bias_grad_in_norm() const override { return true; }
  void layernorm_backward(Act dx, float* dgamma, float* dbeta, Act dout, Act x, Act gamma,
                          const float* mean, const float* rstd, int N, int C, bool accumulate,
                          float* dx_sums) override {
    if (dx_sums) ++summed;
    ObservedOps::layernorm_backward(dx, dgamma, dbeta, dout, x, gamma, mean, rstd, N, C, accumulate,
                                    dx_sums);
  }
  int summed = 0;
};

// The CPU's ops, asking the model for the MLPs' first-layer bias gradients
// from the second layer's matmul_backward (as a GPU does under
// MPIFORMER_KERNELS=dbias_in=dgelu), counting the calls that sum them there.
class BiasGradInActivation : public ObservedOps {
 public:
  using ObservedOps::ObservedOps;
  bool bias_grad_in_activation() const override { return true; }
  void matmul_backward(Act dx, float* dweight, float* dbias, Act dout, Act x, Act weight, int N,
                       int IC, int OC, bool accumulate, const FusedActivation& fused,
                       int dout_stride) override {
    if (fused.pre_bias_grad) ++summed;
    ObservedOps::matmul_backward(dx, dweight, dbias, dout, x, weight, N, IC, OC, accumulate, fused,
                                 dout_stride);
  }
  int summed = 0;
};

// Two micro-batches' gradients with some bias gradients summed where
// Asking (above) asks for them: on the CPU, the same column sums of the
// same gradient as the layer's own weight gradient takes, so the same bits
// as without, in fp32 and bf16; `want_summed` the calls that took them.
template <class Asking>
void expect_asked_bias_grads_same_bits(const ModelConfig& m, DType compute, const Batch& a,
                                       const Batch& b, int want_summed) {
  std::vector<std::vector<float>> grads;
  int summed = -1;
  for (bool asked : {false, true}) {
    std::unique_ptr<Ops> cpu = make_cpu_ops(1);
    Asking asking(*cpu);
    Ops& ops = asked ? static_cast<Ops&>(asking) : *cpu;
    std::unique_ptr<Model> model = model_with(ops, m, Recompute::kNone, compute);
    model->parameters().zero_grads();
    model->forward_backward(a, 0.1f, 0.01f, PassId{3, 2, 0});
    model->forward_backward(b, 0.1f, 0.01f, PassId{3, 2, 1});
    const ParameterSet& p = model->parameters();
    grads.emplace_back(p.grads(), p.grads() + p.count());
    if (asked) summed = asking.summed;
  }
  EXPECT_EQ(summed, want_summed);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  EXPECT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * sizeof(float)))
      << "gradients differ";
}

// The output projections' (a pre-norm sub-layer's without dropout, per
// micro-batch; none with it).
void expect_bias_grad_in_norm_same_bits(const ModelConfig& m, DType compute, const Batch& a,
                                        const Batch& b, int want_summed) {
  expect_asked_bias_grads_same_bits<BiasGradInNorm>(m, compute, a, b, want_summed);
}

TEST(BiasGradInNorm, LmGradientsAreTheSameBits) {
  ModelConfig m = tiny(ModelKind::kLm);
  m.layers = 3;
  m.dropout = 0.0f;
  const Batch a = random_batch(m, {5, 2, 9}, {}, 41), b = random_batch(m, {12, 4}, {}, 42);
  for (DType compute : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(to_string(compute));
    // 3 layers of attention and MLP, 2 micro-batches
    expect_bias_grad_in_norm_same_bits(m, compute, a, b, 3 * 2 * 2);
  }
  m.dropout = 0.1f;  // dy is then the dropped gradient, not the stream's
  expect_bias_grad_in_norm_same_bits(m, DType::kF32, a, b, 0);
  m.dropout = 0.0f;
  m.pre_norm = false;  // post-norm: the norm comes before the sub-layer's backward
  expect_bias_grad_in_norm_same_bits(m, DType::kF32, a, b, 0);
}

TEST(BiasGradInNorm, Seq2seqGradientsAreTheSameBits) {
  ModelConfig m = tiny(ModelKind::kSeq2seq);
  m.enc_layers = 2;
  m.dec_layers = 2;
  m.dropout = 0.0f;
  // encoder 2 x (attention, MLP), decoder 2 x (self-, cross-attention, MLP); 2 micro-batches
  expect_bias_grad_in_norm_same_bits(m, DType::kF32, random_batch(m, {4, 7, 1}, {6, 2, 9}, 43),
                                     random_batch(m, {8}, {3}, 44), (2 * 2 + 2 * 3) * 2);
}

// The MLPs' first-layer bias gradients from the second layer's backward:
// one call per MLP and micro-batch, with dropout and post-norm too (nothing
// comes between the activation and the second layer), in lm's fp32 and
// bf16 and in seq2seq's encoder and decoder; with a ReLU (the GPU's column
// pass rather than its GELU epilogue) too.
TEST(BiasGradInActivation, GradientsAreTheSameBits) {
  ModelConfig m = tiny(ModelKind::kLm);
  m.layers = 3;
  const Batch a = random_batch(m, {5, 2, 9}, {}, 51), b = random_batch(m, {12, 4}, {}, 52);
  for (DType compute : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(to_string(compute));
    expect_asked_bias_grads_same_bits<BiasGradInActivation>(m, compute, a, b, 3 * 2);
  }
  m.dropout = 0.1f;
  m.pre_norm = false;
  m.activation = Activation::kRelu;
  expect_asked_bias_grads_same_bits<BiasGradInActivation>(m, DType::kF32, a, b, 3 * 2);
  ModelConfig s = tiny(ModelKind::kSeq2seq);
  s.enc_layers = 2;
  s.dec_layers = 2;
  expect_asked_bias_grads_same_bits<BiasGradInActivation>(
      s, DType::kF32, random_batch(s, {4, 7, 1}, {6, 2, 9}, 53), random_batch(s, {8}, {3}, 54),
      (2 + 2) * 2);
}

TEST(Recompute, MeasureCountsWhatEachModeAllocates) {
  const auto bytes = [](const ModelConfig& m, Recompute r, bool measure) {
    std::unique_ptr<Ops> ops = make_cpu_ops(1);
    const ModelCapacity capacity{64, m.max_len, 0, r};
    if (measure) return Model::measure(*ops, m, capacity).activation_bytes;
    Model model(*ops, m, capacity);
    return ops->device().peak_allocated_bytes();
  };
  for (ModelKind kind : {ModelKind::kLm, ModelKind::kSeq2seq, ModelKind::kMlm}) {
    for (bool pre : {true, false}) {
      ModelConfig m = tiny(kind);
      m.pre_norm = pre;
      m.layers = m.enc_layers = m.dec_layers = 4;
      for (Recompute r : {Recompute::kNone, Recompute::kActivation, Recompute::kLayer}) {
        // The arena rounds each buffer to 64 bytes, as the backends align.
        const size_t measured = bytes(m, r, true), allocated = bytes(m, r, false);
        EXPECT_GE(measured, allocated) << to_string(kind) << " " << to_string(r);
        EXPECT_LE(measured, allocated + 64 * 200) << to_string(kind) << " " << to_string(r);
      }
      // With layer, each further layer costs its kept (N, C) input only.
      ModelConfig deeper = m;
      deeper.layers = deeper.enc_layers = deeper.dec_layers = 5;
      const size_t stacks = kind == ModelKind::kSeq2seq ? 2 : 1;
      const size_t input = size_t{64} * m.d_model * sizeof(float);
      EXPECT_EQ(bytes(deeper, Recompute::kLayer, true) - bytes(m, Recompute::kLayer, true),
                stacks * input)
          << to_string(kind);
      EXPECT_GT(bytes(deeper, Recompute::kNone, true) - bytes(m, Recompute::kNone, true),
                stacks * 8 * input)
          << to_string(kind);
      // With activation, each further layer keeps (N, F) fewer, its MLP's
      // activation, and in pre-LN models (N, C) fewer per sub-layer, its
      // input norm's output: both made in the scratch instead.
      const size_t activation = size_t{64} * m.d_ff * sizeof(float);
      const size_t sublayers = kind == ModelKind::kSeq2seq ? 2 + 3 : 2;
      EXPECT_EQ(bytes(deeper, Recompute::kNone, true) - bytes(deeper, Recompute::kActivation, true),
                bytes(m, Recompute::kNone, true) - bytes(m, Recompute::kActivation, true) +
                    stacks * activation + (pre ? sublayers * input : 0))
          << to_string(kind) << (pre ? " pre-LN" : " post-LN");
    }
  }
}

}  // namespace
}  // namespace mpiformer
