// CheckedOps (kernels/checked_ops.h, MPIFORMER_CUDA_CHECK=1): a device
// fault is reported by the op that caused it, with its shapes and type.
// The device here is the CPU backend behind a wrapper that faults on
// demand, as a GPU does when a kernel reads out of bounds: the next wait
// for the device fails.
#include "kernels/checked_ops.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/backend_buffer.h"
#include "tests/forwarding_device.h"

namespace mpiformer {
namespace {

class FaultyDevice final : public ForwardingDevice {
 public:
  explicit FaultyDevice(Device& inner) : ForwardingDevice(inner) {}
  // The next wait fails, as after a kernel's illegal address.
  bool faulted = false;

  void synchronize() override {
    if (faulted)
      throw std::runtime_error(
          "CUDA error in cudaStreamSynchronize: an illegal memory access was encountered");
  }
};

// What FaultyOps runs on, made before its ObservedOps base.
struct FaultyParts {
  std::unique_ptr<Ops> cpu = make_cpu_ops(1);
  FaultyDevice faulty{cpu->device()};
};

// The CPU backend's ops on a FaultyDevice.
class FaultyOps final : private FaultyParts, public ObservedOps {
 public:
  FaultyOps() : ObservedOps(*cpu, faulty) {}
  FaultyDevice& faulty_device() { return faulty; }
  // layernorm_forward throws at once, as on a launch error.
  bool launch_fails = false;

  void layernorm_forward(Act out, float* mean, float* rstd, Act x, Act gamma, Act beta, int N,
                         int C, float eps) override {
    if (launch_fails) throw std::runtime_error("CUDA error in layernorm_forward: invalid argument");
    ObservedOps::layernorm_forward(out, mean, rstd, x, gamma, beta, N, C, eps);
  }
};

std::string message_of(const std::function<void()>& op) {
  try {
    op();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(CheckedOps, AFaultIsReportedByTheOpThatCausedIt) {
  auto owned = std::make_unique<FaultyOps>();
  FaultyDevice& device = owned->faulty_device();
  CheckedOps ops(std::move(owned));
  const int N = 5, IC = 7, OC = 3;
  Buffer<float> x(ops, std::vector<float>(N * IC, 0.5f)),
      w(ops, std::vector<float>(OC * IC, 0.25f));
  Buffer<float> out(ops, std::vector<float>(N * OC));
  const auto matmul = [&] {
    ops.matmul_forward(Act::f32(out.get()), Act::f32(x.get()), Act::f32(w.get()), Act(), N, IC, OC,
                       FusedActivation{}, 0);
  };
  EXPECT_EQ(message_of(matmul), "");
  EXPECT_FLOAT_EQ(out.read()[0], 7 * 0.5f * 0.25f);

  device.faulted = true;
  const std::string fault = message_of(matmul);
  EXPECT_NE(fault.find("after matmul_forward (fp32; N 5, IC 7, OC 3, out_stride 0"),
            std::string::npos)
      << fault;
  EXPECT_NE(fault.find("an illegal memory access was encountered"), std::string::npos) << fault;
}

TEST(CheckedOps, AnOpThatThrowsIsNamedWithItsShapes) {
  auto owned = std::make_unique<FaultyOps>();
  owned->launch_fails = true;
  CheckedOps ops(std::move(owned));
  Buffer<float> x(ops, std::vector<float>(8)), stats(ops, std::vector<float>(2));
  const std::string error = message_of([&] {
    ops.layernorm_forward(Act::f32(x.get()), stats.get(), stats.get(), Act::f32(x.get()),
                          Act::f32(x.get()), Act::f32(x.get()), 2, 4, 1e-5f);
  });
  EXPECT_EQ(error,
            "in layernorm_forward (fp32; N 2, C 4): CUDA error in layernorm_forward: invalid "
            "argument");
}

}  // namespace
}  // namespace mpiformer
