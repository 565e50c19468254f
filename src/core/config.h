// The configuration of a run, as parsed from the command line and --config.
// Plain data: parsing and validation live in src/app (options.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/op_choices.h"

namespace mpiformer {

// The range of fp16's dynamic loss scale: never below 1 (a gradient that
// overflows unscaled is a diverged run, not a scaling problem) nor above
// 2^24 (fp32 gradient sums would then lose the small values the scale is
// meant to keep). A checkpoint holding a scale outside it is refused.
constexpr float kMinLossScale = 1.0f;
constexpr float kMaxLossScale = 16777216.0f;

enum class ModelKind { kLm, kSeq2seq, kMlm, kClassify };
// The loss of a classifier: one label per example (softmax), or any number
// of labels, hard or soft (ZLPR, kernels/ops.h).
enum class ClassifyLoss { kSoftmax, kZlpr };
enum class PositionKind { kLearned, kSinusoidal };
enum class SyntheticTask { kNone, kReverse, kCopy, kSort };
enum class ScheduleKind { kConstant, kPolynomial, kInverseSqrt, kCosine };
// kAuto: cuda where a GPU is visible and the build has the CUDA backend,
// cpu otherwise (resolve_device, src/app/shared_options.h); settled before
// anything runs, so the rest of the program sees cpu or cuda.
enum class DeviceKind { kCpu, kCuda, kAuto };
enum class Precision { kFp32, kBf16, kFp16 };
// Sequences longer than --max-len: skip (seq2seq default) or truncate (lm, mlm default).
enum class TooLong { kAuto, kSkip, kTruncate };
// data: every rank reads the whole set and takes every W-th global batch;
// file: each rank reads its own shard files.
enum class Sharding { kData, kFile };
// How the peak LR follows the global token budget per step (docs/DESIGN.md section 6).
enum class LrScaling { kNone, kLinear, kSqrt };
// How gradients are summed over micro-batches and ranks (src/parallel/gradient_reducer.h).
enum class GradSum { kExact, kFloat };
// Which transport carries the gradient all-reduce (src/parallel/data_parallel.h):
// auto is NCCL when every rank has a GPU of its own, MPI otherwise.
enum class Transport { kAuto, kNccl, kMpi };
// What a step with a non-finite loss or gradient norm does (src/train/divergence_guard.h).
enum class OnDivergence { kStop, kSkip };
// What backward recomputes: none keeps every layer's activations;
// activation makes the cheap ones again in backward (each MLP's activation
// from its pre-activation; in pre-LN models each sub-layer's input norm
// from the stream); layer keeps each layer's input and reruns the layer's
// forward in backward. In the order of what they save
// (src/train/memory_budget.cpp compares them).
enum class Recompute { kNone, kActivation, kLayer };

const char* to_string(ModelKind k);
const char* to_string(PositionKind k);
const char* to_string(SyntheticTask k);
const char* to_string(ScheduleKind k);
const char* to_string(DeviceKind k);
const char* to_string(Precision k);
const char* to_string(Activation k);
const char* to_string(AttentionScale k);
const char* to_string(TooLong k);
const char* to_string(Sharding k);
const char* to_string(LrScaling k);
const char* to_string(GradSum k);
const char* to_string(Transport k);
const char* to_string(OnDivergence k);
const char* to_string(Recompute k);
const char* to_string(PoolKind k);
const char* to_string(ClassifyLoss k);

// The element type of activations for a compute precision.
DType compute_dtype(Precision p);

// Reserved token ids shared by every model kind and the synthetic tasks.
struct SpecialTokens {
  int pad = 0;
  int bos = 1;
  int eos = 2;
  int unk = 3;
  int mask = 4;
  int sep = 5;
  static constexpr int kCount = 6;  // ids below this are never data symbols
  bool operator==(const SpecialTokens&) const = default;
};

// --vocab's rule, which a file's vocabulary (a shard's vocab_size) keeps too:
// the reserved ids and at least two data symbols, or no task has anything to
// learn. "" when `vocab` keeps it, else why not ("must be at least 8 ...").
std::string vocab_fault(int64_t vocab);

// The largest width (--d-model, --d-ff, --vocab, --max-len, ...) and depth
// a model may have: tensor shapes are int, and a width of 3 x --d-model
// (fused QKV) must still be one. Far above any model that fits a machine,
// whose size the memory estimate then judges.
constexpr int kMaxWidth = 1 << 24;
constexpr int kMaxLayers = 1 << 12;
// Images: a patch row holds patch x patch x channels values (each at most
// kMaxPatch) and an image at most (kMaxImageSide / patch)^2 rows.
constexpr int kMaxPatch = 1 << 10;
constexpr int kMaxImageSide = 1 << 14;

struct ModelConfig {
  ModelKind kind = ModelKind::kLm;
  int layers = 2;      // lm and mlm
  int enc_layers = 2;  // seq2seq
  int dec_layers = 2;  // seq2seq
  int d_model = 64;
  int heads = 4;
  int d_ff = 256;
  int vocab = 32;
  int max_len = 64;  // longest sequence (positions table size)
  float dropout = 0.0f;
  bool pre_norm = true;
  PositionKind positions = PositionKind::kLearned;
  bool tied_embeddings = true;
  bool output_bias = true;  // a bias on the vocabulary projection (GPT-2 has none)
  Activation activation = Activation::kGelu;
  AttentionScale attention_scale = AttentionScale::kStandard;
  float attention_ref_len = 512.0f;
  float ln_eps = 1e-5f;
  SpecialTokens special;

  // classify: the encoder stack, a pooled vector per sequence, K scores.
  int num_labels = 0;  // K; 0: from the shards
  PoolKind pool = PoolKind::kCls;
  ClassifyLoss loss = ClassifyLoss::kSoftmax;
  // Images (ViT): P x P patches of an H x W x channels image, each one
  // position; 0: text. The image's size comes from the shards.
  int patch = 0;
  int image_height = 0, image_width = 0, image_channels = 0;

  bool images() const { return kind == ModelKind::kClassify && patch > 0; }
  // Values a patch row carries: its pixels, then a one-hot of its position
  // (src/model/model.cpp: the position table is part of the patch weight).
  int patch_features() const { return patch * patch * image_channels + max_len; }
  // Rows of one image: its patches, and a first row (the CLS slot, no
  // pixels) with --pool cls.
  int image_rows() const {
    if (patch <= 0) return 0;
    return (image_height / patch) * (image_width / patch) + (pool == PoolKind::kCls ? 1 : 0);
  }
};

// The first flag whose value differs between two models, as "--heads 4 (not 8)"
// (a's value, then b's); "" when both compute the same function of the same
// tensors. Dropout is not compared: it changes training, not the function.
// Checkpoints are averaged only between models that agree here
// (src/io/checkpoint_average.h).
std::string model_difference(const ModelConfig& a, const ModelConfig& b);

struct OptimConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.98f;
  float eps = 1e-9f;
  float weight_decay = 0.0f;
  bool decay_all = false;  // also decay biases, norms and embeddings
  float clip_norm = 1.0f;  // 0 disables clipping
  ScheduleKind schedule = ScheduleKind::kInverseSqrt;
  int64_t warmup = 100;
  float end_lr = 0.0f;  // polynomial and cosine: LR at the last step
  float poly_power = 1.0f;
};

struct TrainConfig {
  // --arch: the preset the flags not given were taken from ("": none;
  // src/app/arch_presets.h)
  std::string arch;
  ModelConfig model;
  OptimConfig optim;

  // data
  std::string data_dir;  // --data: a directory written by `mpiformer prepare`
  SyntheticTask synthetic = SyntheticTask::kNone;
  std::vector<int> buckets;  // --buckets: explicit boundaries; empty: tensor2tensor's
  TooLong too_long = TooLong::kAuto;
  Sharding sharding = Sharding::kData;
  int prefetch = 4;              // batches prepared ahead by the loader thread
  int max_tokens = 4096;         // padded tokens per micro-batch
  int max_sentences = 0;         // 0: no limit
  int min_len = 1;               // synthetic sequence lengths
  float label_smoothing = 0.0f;  // unless given: 0.1 for seq2seq (src/app/train_options.cpp)
  float mlm_probability = 0.15f;

  // loop
  std::string out_dir;
  std::string config_file;
  std::string resume = "none";
  bool resume_other_run = false;  // --resume PATH of another run into a directory holding one
  int accum_steps = 1;
  int64_t steps = 1000;
  uint64_t seed = 1;
  int log_every = 10;
  int eval_every = 0;           // 0: only at the end
  int eval_batches = 0;         // 0: the whole validation split (a synthetic task: 8)
  int checkpoint_every = 1000;  // 0: only at the last step
  int keep_checkpoints = 5;     // newest step_*.h5 kept (0: all)
  // Model choice (src/train/model_choice.h): the validation metric is the
  // nll, or seq2seq's BLEU of greedy translations of the validation split.
  bool valid_bleu = false;
  int keep_best = 0;   // checkpoints of the best evaluations kept (0: none)
  int early_stop = 0;  // evaluations without a better metric before stopping (0: never)
  // At the end, the mean of the newest K checkpoints in
  // checkpoints/average_last_K.h5 (0: none; src/io/checkpoint_average.h)
  int average_checkpoints = 0;
  OnDivergence on_divergence = OnDivergence::kStop;
  // auto: cuda where a GPU is visible, else cpu (settle_device resolves it
  // when the flags are read)
  DeviceKind device = DeviceKind::kAuto;
  std::string device_choice;  // why --device auto chose `device` ("" when given)
  Precision precision = Precision::kFp32;
  bool tf32 = false;               // fp32 GEMMs on TF32 tensor cores (cuda only)
  int threads = 0;                 // 0: all cores shared among local ranks
  std::string blas_core = "auto";  // OpenBLAS's kernel family (kernels/cpu/blas_kernels.h)
  // fp16's dynamic loss scaling (src/optim/loss_scaler.h)
  float loss_scale = 65536.0f;   // the initial scale
  int loss_scale_window = 2000;  // good steps in a row before the scale doubles

  // distribution
  LrScaling lr_scaling = LrScaling::kNone;
  int64_t lr_reference_tokens = 0;  // the global padded-token budget --lr was tuned for
  float bucket_mb = 0.0f;           // gradient all-reduce bucket size (0: by transport)
  bool overlap = true;              // start buckets during backward
  GradSum grad_sum = GradSum::kExact;
  Transport transport = Transport::kAuto;
  bool deterministic = true;  // GPU: no algorithm whose sums depend on timing
  AttentionPath attention = AttentionPath::kAuto;
  int check_every = 100;  // steps between replica checks (0: off)
  // Each rank keeps masters and moments of its slice of the flat buffer only
  // (ZeRO-1): gradients reduce-scattered, weights all-gathered after the update.
  bool shard_optimizer = false;
  Recompute recompute = Recompute::kNone;
};

// The text of a held-out split given as files (prepare --valid, --test).
struct SplitFiles {
  std::string input;   // one sequence (lm) or source sentence per line
  std::string target;  // seq2seq: target sentences; classify: labels; line-aligned with input
  bool given() const { return !input.empty(); }
};

// `mpiformer prepare`: raw text (or a parallel pair) to HDF5 shards.
struct PrepareConfig {
  std::string kind = "lm";  // lm | seq2seq | classify | image
  std::string input;        // text, one sequence (lm) or source sentence per line; image: .h5/.npz
  std::string target;       // seq2seq: target sentences, line-aligned with input
  std::string labels;       // classify: each line's labels (NAME or NAME:WEIGHT), line-aligned
  std::string out_dir;
  int shards = 4;
  int vocab_size = 8000;
  std::string tokenizer;  // an existing SentencePiece model; empty: train one
  std::string model_type = "unigram";
  // Held-out splits: from files, or carved from the end of the input (test
  // lines last, validation lines before them), each at most a tenth of it.
  std::string valid_files, test_files;  // --valid, --test: FILE[,TARGET] as given
  SplitFiles valid, test;               // parsed from them
  int valid_lines = 1000;
  int test_lines = 0;              // 0: no test split unless --test
  bool valid_lines_given = false;  // a capped --valid-lines is worth a warning only if asked for
  uint64_t seed = 1;
};

// `mpiformer average`: the mean of the parameters of checkpoints of one
// model (src/io/checkpoint_average.h), from files or a run's newest.
struct AverageConfig {
  std::vector<std::string> inputs;  // checkpoint files, as given
  std::string run_dir;              // --run RUNDIR: its newest --last checkpoints
  int last = 0;                     // --last K
  std::string out;                  // --out FILE
};

// `mpiformer eval`: a checkpoint on a held-out split of a data set.
struct EvalConfig {
  std::string checkpoint;       // --checkpoint FILE
  std::string data_dir;         // --data DIR
  std::string split = "valid";  // valid | test: DIR/SPLIT-NNNNN.h5
  int max_tokens = 0;           // padded tokens per batch; 0: the checkpoint's run's
  int batches = 0;              // evaluation batches; 0: all of them
  // cuda: the run's precision on the rank's GPU; cpu: fp32 (auto: resolve_device)
  DeviceKind device = DeviceKind::kAuto;
  std::string device_choice;       // why --device auto chose `device`
  int threads = 0;                 // 0: all cores shared among local ranks
  std::string blas_core = "auto";  // OpenBLAS's kernel family (kernels/cpu/blas_kernels.h)
};

// `mpiformer generate`: decoding with a checkpoint (rank 0 decodes).
struct GenerateConfig {
  std::string checkpoint;      // --checkpoint FILE
  std::string prompt;          // --prompt TEXT: one input
  std::string input;           // --input FILE: one input per line
  std::string data_dir;        // --data DIR: the source side of a split, in order (seq2seq)
  std::string split = "test";  // with --data: test | valid
  std::string references;      // with --data: the split's targets, line-aligned with the output
  std::string output;          // --output FILE ("": stdout)
  int beam = 1;                // 1: greedy
  float length_alpha = 1.0f;
  int max_new_tokens = 0;  // 0: up to max-len
  int min_new_tokens = 0;  // EOS is not chosen before this many new tokens
  int top_k = 0;           // lm: sample among the k most likely (0: greedy or beam)
  float temperature = 1.0f;
  uint64_t seed = 1;
  bool cache = true;       // false: recompute every prefix at every step (the reference)
  int max_tokens = 16384;  // key/value cache rows the sentences decoding together may fill
  DeviceKind device = DeviceKind::kAuto;   // resolved as train's
  std::string device_choice;               // why --device auto chose `device`
  Precision precision = Precision::kFp32;  // of the weights' compute copy and activations
  int threads = 0;
  std::string blas_core = "auto";
  bool profile = false;  // --profile: time decoding's ops by family (a table on stderr)
};

// `mpiformer classify`: label scores of text lines with a classifier checkpoint.
struct ClassifyConfig {
  std::string checkpoint;  // --checkpoint FILE
  std::string text;        // --text TEXT: one input
  std::string input;       // --input FILE: one input per line
  std::string output;      // --output FILE ("": stdout)
  int top = 5;             // labels printed per input, best first
  int batch = 64;          // lines scored at a time
  // cuda: the run's precision on the first visible GPU; cpu: fp32 (auto: resolve_device)
  DeviceKind device = DeviceKind::kAuto;
  std::string device_choice;  // why --device auto chose `device`
  int threads = 0;
  std::string blas_core = "auto";
};

// `mpiformer bench`: training steps timed after warm-up, on one synthetic
// batch of a shape or, with --data, on the batches train would take.
struct BenchConfig {
  // The model, optimizer, device and reducer flags, label smoothing and
  // seed; with --data also the data flags and --accum-steps, settled as
  // train settles them (settle_training_flags), so bench builds what train
  // would. Its steps, log and run directory are train's alone.
  TrainConfig run;
  // Without --data: the synthetic batch, the same every step.
  int batch = 8;
  int seq = 128;    // sequence length (lm/mlm), target length (seq2seq)
  int min_seq = 0;  // >0: lengths drawn uniformly from [min_seq, seq] (padding)
  int src_seq = 0;  // seq2seq source length; 0: same as seq
  int steps = 10;   // timed steps
  int warmup_steps = 3;
  double peak_tflops = 0.0;  // 0: estimate for the device
  bool profile = false;      // time per op family
};

}  // namespace mpiformer
