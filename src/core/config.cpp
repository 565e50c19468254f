#include "src/core/config.h"

#include <charconv>
#include <string>
#include <type_traits>

namespace mpiformer {

std::string vocab_fault(int64_t vocab) {
  constexpr int least = SpecialTokens::kCount + 2;
  if (vocab < least) {
    return "must be at least " + std::to_string(least) + " (" +
           std::to_string(SpecialTokens::kCount) + " reserved ids and two data symbols); got " +
           std::to_string(vocab);
  }
  if (vocab > kMaxWidth) {
    return "must be at most " + std::to_string(kMaxWidth) + "; got " + std::to_string(vocab);
  }
  return "";
}

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
    case DeviceKind::kAuto:
      return "auto";
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
    case Recompute::kActivation:
      return "activation";
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

std::string model_difference(const ModelConfig& a, const ModelConfig& b) {
  const auto text = [](auto value) -> std::string {
    using T = decltype(value);
    if constexpr (std::is_same_v<T, bool>) {
      return value ? "true" : "false";
    } else if constexpr (std::is_same_v<T, const char*>) {
      return value;
    } else {
      char buf[32];
      return std::string(buf, std::to_chars(buf, buf + sizeof buf, value).ptr);
    }
  };
  const auto differs = [&](const char* flag, auto x, auto y) -> std::string {
    const std::string tx = text(x), ty = text(y);
    return tx == ty ? "" : std::string(flag) + " " + tx + " (not " + ty + ")";
  };
  // In the order of the flag table, so the first difference is the one
  // config.ini shows first.
  std::string d = differs("--model", to_string(a.kind), to_string(b.kind));
  if (!d.empty()) return d;
  const bool seq2seq = a.kind == ModelKind::kSeq2seq;
  const std::string checks[] = {
      seq2seq ? "" : differs("--layers", a.layers, b.layers),
      seq2seq ? differs("--enc-layers", a.enc_layers, b.enc_layers) : "",
      seq2seq ? differs("--dec-layers", a.dec_layers, b.dec_layers) : "",
      differs("--d-model", a.d_model, b.d_model),
      differs("--heads", a.heads, b.heads),
      differs("--d-ff", a.d_ff, b.d_ff),
      differs("--max-len", a.max_len, b.max_len),
      differs("--vocab", a.vocab, b.vocab),
      differs("--norm", a.pre_norm ? "pre" : "post", b.pre_norm ? "pre" : "post"),
      differs("--positions", to_string(a.positions), to_string(b.positions)),
      differs("--tied-embeddings", a.tied_embeddings, b.tied_embeddings),
      differs("--output-bias", a.output_bias, b.output_bias),
      differs("--activation", to_string(a.activation), to_string(b.activation)),
      differs("--attention-scale", to_string(a.attention_scale), to_string(b.attention_scale)),
      a.attention_scale == AttentionScale::kLogLength
          ? differs("--attention-ref-len", a.attention_ref_len, b.attention_ref_len)
          : "",
  };
  for (const std::string& c : checks) {
    if (!c.empty()) return c;
  }
  if (a.kind != ModelKind::kClassify) return "";
  const std::string classifier_checks[] = {
      differs("--num-labels", a.num_labels, b.num_labels),
      differs("--pool", to_string(a.pool), to_string(b.pool)),
      differs("--loss", to_string(a.loss), to_string(b.loss)),
      differs("--patch", a.patch, b.patch),
      differs("--image-height", a.image_height, b.image_height),
      differs("--image-width", a.image_width, b.image_width),
      differs("--image-channels", a.image_channels, b.image_channels),
  };
  for (const std::string& c : classifier_checks) {
    if (!c.empty()) return c;
  }
  return "";
}

}  // namespace mpiformer
