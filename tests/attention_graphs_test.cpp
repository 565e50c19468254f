// The cuDNN attention graphs of kernels/cuda/attention_cudnn.cpp pass the
// cuDNN frontend's validation for a Hopper GPU (sm 90): dimensions, strides,
// ragged offsets, masks and statistics layouts as the linked cuDNN accepts
// them. Validation needs no GPU, so this runs wherever the CUDA backend is
// built; running the graphs is the gpu-labelled cuda_ops_test's part.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda/attention_cudnn.h"

namespace mpiformer::cuda {
namespace {

TEST(AttentionGraphs, ValidateForHopper) {
  if (!FlashAttention::built()) GTEST_SKIP() << "this build has no cuDNN frontend";
  const std::vector<std::string> failures = FlashAttention::validate_graphs(90);
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace mpiformer::cuda
