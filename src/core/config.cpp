#include "src/core/config.h"

namespace mpiformer {

// The spellings below are the command-line and config-file values: the flag
// tables of src/app/*_options.cpp parse them and config.ini records them, so
// they must stay in step.

const char* to_string(ModelKind k) {
  switch (k) {
    case ModelKind::kLm:
      return "lm";
    case ModelKind::kSeq2seq:
      return "seq2seq";
    case ModelKind::kMlm:
      return "mlm";
    case ModelKind::kClassify:
      return "classify";
  }
  return "?";
}

const char* to_string(PoolKind k) {
  switch (k) {
    case PoolKind::kCls:
      return "cls";
    case PoolKind::kMean:
      return "mean";
  }
  return "?";
}

const char* to_string(ClassifyLoss k) {
  switch (k) {
    case ClassifyLoss::kSoftmax:
      return "softmax";
    case ClassifyLoss::kZlpr:
      return "zlpr";
  }
  return "?";
}

const char* to_string(PositionKind k) {
  switch (k) {
    case PositionKind::kLearned:
      return "learned";
    case PositionKind::kSinusoidal:
      return "sinusoidal";
  }
  return "?";
}

const char* to_string(SyntheticTask k) {
  switch (k) {
    case SyntheticTask::kNone:
      return "none";
    case SyntheticTask::kReverse:
      return "reverse";
    case SyntheticTask::kCopy:
      return "copy";
    case SyntheticTask::kSort:
      return "sort";
  }
  return "?";
}

const char* to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kConstant:
      return "constant";
    case ScheduleKind::kPolynomial:
      return "polynomial";
    case ScheduleKind::kInverseSqrt:
      return "inverse-sqrt";
    case ScheduleKind::kCosine:
      return "cosine";
  }
  return "?";
}

const char* to_string(DeviceKind k) {
  switch (k) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}

const char* to_string(Precision k) {
  switch (k) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return DType::kF32;
    case Precision::kBf16:
      return DType::kBF16;
    case Precision::kFp16:
      return DType::kF16;
  }
  return DType::kF32;
}

const char* to_string(Activation k) {
  switch (k) {
    case Activation::kGelu:
      return "gelu";
    case Activation::kRelu:
      return "relu";
  }
  return "?";
}

const char* to_string(AttentionScale k) {
  switch (k) {
    case AttentionScale::kStandard:
      return "standard";
    case AttentionScale::kLogLength:
      return "log-length";
  }
  return "?";
}

const char* to_string(TooLong k) {
  switch (k) {
    case TooLong::kAuto:
      return "auto";
    case TooLong::kSkip:
      return "skip";
    case TooLong::kTruncate:
      return "truncate";
  }
  return "?";
}

const char* to_string(Sharding k) {
  switch (k) {
    case Sharding::kData:
      return "data";
    case Sharding::kFile:
      return "file";
  }
  return "?";
}

const char* to_string(LrScaling k) {
  switch (k) {
    case LrScaling::kNone:
      return "none";
    case LrScaling::kLinear:
      return "linear";
    case LrScaling::kSqrt:
      return "sqrt";
  }
  return "?";
}

const char* to_string(GradSum k) {
  switch (k) {
    case GradSum::kExact:
      return "exact";
    case GradSum::kFloat:
      return "float";
  }
  return "?";
}

const char* to_string(Transport k) {
  switch (k) {
    case Transport::kAuto:
      return "auto";
    case Transport::kNccl:
      return "nccl";
    case Transport::kMpi:
      return "mpi";
  }
  return "?";
}

const char* to_string(Recompute k) {
  switch (k) {
    case Recompute::kNone:
      return "none";
    case Recompute::kLayer:
      return "layer";
  }
  return "?";
}

const char* to_string(OnDivergence k) {
  switch (k) {
    case OnDivergence::kStop:
      return "stop";
    case OnDivergence::kSkip:
      return "skip";
  }
  return "?";
}

}  // namespace mpiformer
