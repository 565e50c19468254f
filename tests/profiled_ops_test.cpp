// ProfiledOps (kernels/profiled_ops.h) and bench's profile table: each call
// is counted with the operations its sizes tell (call_flops), so the table
// gives a GEMM's or attention's TFLOP/s beside its time. The CPU backend
// runs the ops, a fixed clock times them.
#include "kernels/profiled_ops.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/app/profile_table.h"
#include "tests/backend_buffer.h"

namespace mpiformer {
namespace {

// Every op 2 ms.
class FixedTimer final : public OpTimer {
 public:
  void begin() override {}
  void end() override { spans_.push_back(2.0); }
  std::vector<double> span_milliseconds() override { return spans_; }
  void reset() override { spans_.clear(); }

 private:
  std::vector<double> spans_;
};

const ProfiledOps::CallTotal& total_of(const std::vector<ProfiledOps::CallTotal>& totals,
                                       const std::string& start) {
  for (const ProfiledOps::CallTotal& t : totals)
    if (t.call.rfind(start, 0) == 0) return t;
  ADD_FAILURE() << "no call " << start;
  return totals.front();
}

TEST(ProfiledOps, GemmCallsCountTheirOperations) {
  std::unique_ptr<Ops> cpu = make_cpu_ops(1);
  ProfiledOps ops(*cpu, std::make_unique<FixedTimer>());
  constexpr int N = 4, IC = 3, OC = 5;
  const auto zeros = [&](size_t n) {
    return std::make_unique<Buffer<float>>(*cpu, std::vector<float>(n));
  };
  const auto x = zeros(N * IC), w = zeros(OC * IC), b = zeros(OC), out = zeros(N * OC),
             dx = zeros(N * IC), dw = zeros(OC * IC), db = zeros(OC), normed = zeros(N * OC),
             stats = zeros(2 * N);
  const auto act = [](const std::unique_ptr<Buffer<float>>& buffer) {
    return Act(buffer->get(), DType::kF32);
  };
  ops.matmul_forward(act(out), act(x), act(w), act(b), N, IC, OC);
  ops.matmul_forward(act(out), act(x), act(w), act(b), N, IC, OC);
  ops.matmul_backward(act(dx), dw->get(), db->get(), act(out), act(x), act(w), N, IC, OC, false);
  ops.matmul_backward(Act(), dw->get(), db->get(), act(out), act(x), act(w), N, IC, OC, true);
  ops.layernorm_forward(act(normed), stats->get(), stats->get() + N, act(out), act(b), act(b), N,
                        OC, 1e-5f);
  const std::vector<ProfiledOps::CallTotal> totals = ops.call_totals();
  const double product = 2.0 * N * IC * OC;
  const ProfiledOps::CallTotal& forward = total_of(totals, "matmul_forward");
  EXPECT_EQ(forward.count, 2);
  EXPECT_DOUBLE_EQ(forward.flops, 2 * product) << "two calls, a product each";
  EXPECT_DOUBLE_EQ(
      total_of(totals, "matmul_backward (fp32; N 4, IC 3, OC 5, dout_stride 0, dx 1").flops,
      2 * product)
      << "dx and dW";
  EXPECT_DOUBLE_EQ(
      total_of(totals, "matmul_backward (fp32; N 4, IC 3, OC 5, dout_stride 0, dx 0").flops,
      product)
      << "dW alone";
  const ProfiledOps::CallTotal& norm = total_of(totals, "layernorm_forward");
  EXPECT_EQ(norm.flops, 0.0) << "a memory-bound op: no operations counted";
  // 2 calls of 2 ms: 240 operations in 4 ms.
  EXPECT_EQ(call_rate(forward), ": 6e-08 TFLOP/s");
  EXPECT_EQ(call_rate(norm), "");
  EXPECT_EQ(call_rate({"matmul_forward (bf16; ...)", 10.0, 12, 5.83e12}), ": 583 TFLOP/s");
}

// Attention's operations follow from its totals only where every sequence
// has the longest length.
TEST(ProfiledOps, AttentionCountsUniformBatchesAlone) {
  const auto flops = [](int batch, int nq, int lq, bool causal, const char* name) {
    const OpCall call{name,
                      OpFamily::kAttention,
                      DType::kBF16,
                      {{"B", batch},
                       {"Nq", nq},
                       {"Nk", nq},
                       {"longest q", lq},
                       {"longest k", lq},
                       {"heads", 12},
                       {"head size", 64},
                       {"causal", causal},
                       {"log-length", 0}}};
    return call_flops(call);
  };
  const double full = 4.0 * 32 * 1024.0 * 1024 * 12 * 64;
  EXPECT_DOUBLE_EQ(flops(32, 32768, 1024, false, "attention_forward"), full);
  EXPECT_DOUBLE_EQ(flops(32, 32768, 1024, true, "attention_forward"), full / 2)
      << "the masked half is not counted";
  EXPECT_DOUBLE_EQ(flops(32, 32768, 1024, true, "attention_backward"), 2.5 * full / 2);
  EXPECT_EQ(flops(32, 30000, 1024, true, "attention_forward"), 0.0)
      << "ragged: the totals do not tell the products";
}

}  // namespace
}  // namespace mpiformer
