// What a cuDNN attention graph is for a key (describe), shared by the
// graphs' cache and runs (attention_cudnn.cpp) and their check without a GPU
// (FlashAttention::validate_graphs, attention_cudnn_graph.cpp). Only in a
// build with the cuDNN frontend.
#pragma once

#if defined(MPIFORMER_HAVE_CUDNN_FRONTEND)
#include <cudnn_frontend.h>

#include <cstdint>
#include <memory>

#include "kernels/cuda/attention_cudnn_keys.h"

namespace mpiformer::cuda {

// Tensor uids of the variant packs.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqQ,
  kSeqKv,
  kRoQ,
  kRoKv,
  kRoO,
  kRoStats
};

// The graph of a key for a GPU of compute capability `sm` (90: Hopper), not
// yet validated or built.
std::shared_ptr<cudnn_frontend::graph::Graph> describe(const GraphKey& key, int sm);

}  // namespace mpiformer::cuda

#endif
