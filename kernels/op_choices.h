// The choices a run makes of how some ops compute, named by the config
// (src/core/config.h) and taken by the ops (kernels/ops.h): small enough for
// the config to include without the op interface.
#pragma once

namespace mpiformer {

enum class Activation { kGelu, kRelu };
enum class AttentionScale { kStandard, kLogLength };
// How a classifier turns a sequence's rows into one vector: its first row
// (a CLS token or patch) or the mean of its rows.
enum class PoolKind { kCls, kMean };
// Which attention kernels run (--attention): auto takes a fused library
// kernel (cuDNN's, on a GPU) wherever it takes the case and the plain
// kernels otherwise; cudnn makes a case it refuses an error; plain never
// asks it.
enum class AttentionPath { kAuto, kCudnn, kPlain };

}  // namespace mpiformer
