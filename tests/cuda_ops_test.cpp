// Every CUDA op against the CPU reference on random inputs, ragged batches
// included (label gpu). Without a GPU every test is skipped with a message.
// Tolerances (fp32): 1e-5 relative for elementwise ops, 1e-4 for reductions,
// GEMMs and attention (other summation orders).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"

namespace mpiformer {
namespace {

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible: the CUDA op tests are skipped";
    gpu_ = make_cuda_ops(0);
    cpu_ = make_cpu_ops(1);
  }

  std::vector<float> random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng_);
    return x;
  }

  // A device copy of host data, released at the end of the test.
  template <typename T>
  T* upload(const std::vector<T>& host) {
    auto* p = static_cast<T*>(gpu_->allocate(std::max<size_t>(host.size(), 1) * sizeof(T)));
    gpu_->copy_to_device(p, host.data(), host.size() * sizeof(T));
    owned_.push_back(p);
    return p;
  }
  template <typename T>
  std::vector<T> download(const T* p, size_t n) {
    std::vector<T> host(n);
    gpu_->copy_to_host(host.data(), p, n * sizeof(T));
    return host;
  }
  void TearDown() override {
    for (void* p : owned_) gpu_->release(p);
  }

  static void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                           double rel, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double max_abs = 0.0;
    for (float w : want) max_abs = std::max(max_abs, std::abs(static_cast<double>(w)));
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], rel * std::max(1.0, max_abs)) << what << " at " << i;
    }
  }

  std::mt19937 rng_{7};
  std::unique_ptr<Ops> gpu_, cpu_;
  std::vector<void*> owned_;
};

TEST_F(CudaOpsTest, ElementwiseAndDropout) {
  const size_t n = 10007;
  std::vector<float> x = random(n), d = random(n), want(n);
  for (Activation act : {Activation::kGelu, Activation::kRelu}) {
    float* out = upload(std::vector<float>(n));
    gpu_->activation_forward(out, upload(x), n, act);
    cpu_->activation_forward(want.data(), x.data(), n, act);
    expect_close(download(out, n), want, 1e-5, "activation_forward");
    gpu_->activation_backward(out, upload(d), upload(x), n, act);
    cpu_->activation_backward(want.data(), d.data(), x.data(), n, act);
    expect_close(download(out, n), want, 1e-5, "activation_backward");
  }
  float* out = upload(std::vector<float>(n));
  gpu_->dropout_forward(out, upload(x), n, 0.3f, 42, 9);
  cpu_->dropout_forward(want.data(), x.data(), n, 0.3f, 42, 9);
  expect_close(download(out, n), want, 1e-6, "dropout: the same mask on both backends");
}

TEST_F(CudaOpsTest, EmbeddingsLayerNormAndMatmul) {
  const int N = 37, C = 48, V = 29, OC = 70;
  std::vector<int32_t> ids(N);
  for (int32_t& id : ids) id = std::uniform_int_distribution<int>(0, V - 1)(rng_);
  const std::vector<float> table = random(static_cast<size_t>(V) * C);
  std::vector<float> want(static_cast<size_t>(N) * C);
  float* out = upload(std::vector<float>(want.size()));
  gpu_->embedding_forward(out, upload(ids), upload(table), N, C, 2.0f);
  cpu_->embedding_forward(want.data(), ids.data(), table.data(), N, C, 2.0f);
  expect_close(download(out, want.size()), want, 1e-6, "embedding_forward");

  const std::vector<float> dout = random(want.size());
  std::vector<float> dtable_want(table.size());
  float* dtable = upload(std::vector<float>(table.size()));
  gpu_->embedding_backward(dtable, upload(dout), upload(ids), N, C, 2.0f);
  cpu_->embedding_backward(dtable_want.data(), dout.data(), ids.data(), N, C, 2.0f);
  expect_close(download(dtable, table.size()), dtable_want, 1e-5, "embedding_backward");

  const std::vector<float> x = random(want.size(), 3.0f), gamma = random(C), beta = random(C);
  std::vector<float> mean_w(N), rstd_w(N);
  float* mean = upload(std::vector<float>(N));
  float* rstd = upload(std::vector<float>(N));
  float* x_d = upload(x);
  float* gamma_d = upload(gamma);
  gpu_->layernorm_forward(out, mean, rstd, x_d, gamma_d, upload(beta), N, C, 1e-5f);
  cpu_->layernorm_forward(want.data(), mean_w.data(), rstd_w.data(), x.data(), gamma.data(),
                          beta.data(), N, C, 1e-5f);
  expect_close(download(out, want.size()), want, 1e-4, "layernorm_forward");
  std::vector<float> dgamma_w(C), dbeta_w(C);
  float* dgamma = upload(std::vector<float>(C));
  float* dbeta = upload(std::vector<float>(C));
  gpu_->layernorm_backward(out, dgamma, dbeta, upload(dout), x_d, gamma_d, mean, rstd, N, C, false);
  cpu_->layernorm_backward(want.data(), dgamma_w.data(), dbeta_w.data(), dout.data(), x.data(),
                           gamma.data(), mean_w.data(), rstd_w.data(), N, C, false);
  expect_close(download(out, want.size()), want, 1e-4, "layernorm_backward dx");
  expect_close(download(dgamma, C), dgamma_w, 1e-4, "layernorm_backward dgamma");
  expect_close(download(dbeta, C), dbeta_w, 1e-4, "layernorm_backward dbeta");

  const std::vector<float> w = random(static_cast<size_t>(OC) * C), bias = random(OC);
  std::vector<float> y_w(static_cast<size_t>(N) * OC);
  float* y = upload(std::vector<float>(y_w.size()));
  float* w_d = upload(w);
  gpu_->matmul_forward(y, x_d, w_d, upload(bias), N, C, OC);
  cpu_->matmul_forward(y_w.data(), x.data(), w.data(), bias.data(), N, C, OC);
  expect_close(download(y, y_w.size()), y_w, 1e-4, "matmul_forward");
  const std::vector<float> dy = random(y_w.size());
  std::vector<float> dx_w(x.size(), 0.5f), dw_w(w.size(), 0.25f), db_w(OC, 0.125f);
  float* dx = upload(dx_w);
  float* dw = upload(dw_w);
  float* db = upload(db_w);
  gpu_->matmul_backward(dx, dw, db, upload(dy), x_d, w_d, N, C, OC, true);
  cpu_->matmul_backward(dx_w.data(), dw_w.data(), db_w.data(), dy.data(), x.data(), w.data(), N, C,
                        OC, true);
  expect_close(download(dx, x.size()), dx_w, 1e-4, "matmul_backward dx (accumulated)");
  expect_close(download(dw, w.size()), dw_w, 1e-4, "matmul_backward dweight");
  expect_close(download(db, OC), db_w, 1e-4, "matmul_backward dbias");
}

TEST_F(CudaOpsTest, RaggedAttentionForwardAndBackward) {
  const int H = 3, D = 8, C = H * D;
  for (bool causal : {false, true}) {
    for (AttentionScale scale : {AttentionScale::kStandard, AttentionScale::kLogLength}) {
      const std::vector<int32_t> offsets = {0, 5, 6, 19, 19, 27};  // a length-0 sequence too
      const int B = 5, N = offsets.back(), stride = 3 * C;         // fused QKV rows
      Ragged r{offsets.data(), upload(offsets), B, N, 13};
      AttentionConfig cfg{H, D, causal, scale, 64.0f};
      const std::vector<float> qkv = random(static_cast<size_t>(N) * stride);
      const float* qkv_d = upload(qkv);
      const size_t P = attention_probs_size(r, r, H);
      std::vector<float> out_w(static_cast<size_t>(N) * C), probs_w(P);
      float* out = upload(std::vector<float>(out_w.size()));
      float* probs = upload(std::vector<float>(P));
      gpu_->attention_forward(out, probs, qkv_d, stride, qkv_d + C, qkv_d + 2 * C, stride, r, r,
                              cfg);
      Ragged rc = r;
      rc.device_offsets = offsets.data();
      cpu_->attention_forward(out_w.data(), probs_w.data(), qkv.data(), stride, qkv.data() + C,
                              qkv.data() + 2 * C, stride, rc, rc, cfg);
      expect_close(download(out, out_w.size()), out_w, 1e-4, "attention_forward");

      const std::vector<float> dout = random(out_w.size());
      std::vector<float> dqkv_w(qkv.size());
      float* dqkv = upload(std::vector<float>(qkv.size()));
      gpu_->attention_backward(dqkv, dqkv + C, dqkv + 2 * C, upload(dout), probs, qkv_d, stride,
                               qkv_d + C, qkv_d + 2 * C, stride, r, r, cfg);
      cpu_->attention_backward(dqkv_w.data(), dqkv_w.data() + C, dqkv_w.data() + 2 * C, dout.data(),
                               probs_w.data(), qkv.data(), stride, qkv.data() + C,
                               qkv.data() + 2 * C, stride, rc, rc, cfg);
      expect_close(download(dqkv, qkv.size()), dqkv_w, 1e-4, "attention_backward dq, dk, dv");
    }
  }
}

TEST_F(CudaOpsTest, SoftmaxCrossEntropyAdamWAndNorm) {
  const int R = 9, L = 33;
  const std::vector<float> x = random(static_cast<size_t>(R) * L);
  const std::vector<int32_t> valid = {33, 1, 0, 17, 33, 5, 40, 2, 33};
  std::vector<float> p_w(x.size());
  float* p = upload(std::vector<float>(x.size()));
  gpu_->softmax_forward(p, upload(x), R, L, 0.5f, valid.data());
  cpu_->softmax_forward(p_w.data(), x.data(), R, L, 0.5f, valid.data());
  expect_close(download(p, x.size()), p_w, 1e-5, "softmax_forward");

  const int N = 23, V = 517;
  const std::vector<float> logits = random(static_cast<size_t>(N) * V, 2.0f);
  std::vector<int32_t> targets(N);
  for (int32_t& t : targets) t = std::uniform_int_distribution<int>(0, V - 1)(rng_);
  targets[3] = targets[11] = 0;  // pad rows
  std::vector<float> grad_w = logits;
  float* grad = upload(logits);
  const LossSums got = gpu_->cross_entropy(grad, upload(targets), N, V, 0.1f, 0, 0.01f, true);
  const LossSums want =
      cpu_->cross_entropy(grad_w.data(), targets.data(), N, V, 0.1f, 0, 0.01f, true);
  EXPECT_NEAR(got.loss, want.loss, 1e-4 * std::abs(want.loss));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.correct, want.correct);
  expect_close(download(grad, logits.size()), grad_w, 1e-5, "cross_entropy gradient");

  const size_t n = 70001;
  std::vector<float> params = random(n), grads = random(n), m = random(n, 0.1f), v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::abs(m[i]) * 0.5f;
  float* params_d = upload(params);
  float* m_d = upload(m);
  float* v_d = upload(v);
  const float* grads_d = upload(grads);
  AdamWConfig cfg{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3, 0.5f};
  gpu_->adamw_update(params_d, grads_d, m_d, v_d, n, cfg);
  cpu_->adamw_update(params.data(), grads.data(), m.data(), v.data(), n, cfg);
  expect_close(download(params_d, n), params, 1e-5, "adamw params");
  expect_close(download(m_d, n), m, 1e-5, "adamw m");
  expect_close(download(v_d, n), v, 1e-5, "adamw v");
  EXPECT_NEAR(gpu_->sum_squares(grads_d, n), cpu_->sum_squares(grads.data(), n),
              1e-9 * cpu_->sum_squares(grads.data(), n));
}

}  // namespace
}  // namespace mpiformer
