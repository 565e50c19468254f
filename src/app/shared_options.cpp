#include "src/app/shared_options.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/blas_kernels.h"
#include "src/app/options.h"
#include "src/core/error.h"
#include "src/parallel/nccl_transport.h"

namespace mpiformer {

void add_model_flags(FlagTable& t, ModelConfig* m, const char* vocab_help) {
  t.group("Model");
  t.add_choice("model", &m->kind,
               {{"lm", ModelKind::kLm},
                {"seq2seq", ModelKind::kSeq2seq},
                {"mlm", ModelKind::kMlm},
                {"classify", ModelKind::kClassify}},
               "decoder-only LM, encoder-decoder, encoder-only masked LM, or encoder-only "
               "classifier");
  t.add("layers", &m->layers, "N", "layers (lm, mlm); for seq2seq both stacks unless given");
  t.add("enc-layers", &m->enc_layers, "N", "encoder layers (seq2seq)");
  t.add("dec-layers", &m->dec_layers, "N", "decoder layers (seq2seq)");
  t.add("d-model", &m->d_model, "D", "model width");
  t.add("heads", &m->heads, "H", "attention heads (must divide --d-model)");
  t.add("d-ff", &m->d_ff, "F", "hidden width of the MLP");
  t.add("max-len", &m->max_len, "L", "longest sequence (size of the positions table)");
  t.add("vocab", &m->vocab, "V", vocab_help);
  t.add("dropout", &m->dropout, "P", "dropout probability, in [0, 1)");
  t.add_choice("norm", &m->pre_norm, {{"pre", true}, {"post", false}},
               "layer norm before (pre) or after (post) each sublayer");
  t.add_choice("positions", &m->positions,
               {{"learned", PositionKind::kLearned}, {"sinusoidal", PositionKind::kSinusoidal}},
               "position embeddings");
  t.add("tied-embeddings", &m->tied_embeddings, "true|false",
        "share the input embedding with the output projection");
  t.add("output-bias", &m->output_bias, "true|false",
        "a bias on the output projection (false, as GPT-2: analysis/export_hf.py needs it)");
  t.add_choice("activation", &m->activation,
               {{"gelu", Activation::kGelu}, {"relu", Activation::kRelu}}, "MLP activation");
  t.add_choice(
      "attention-scale", &m->attention_scale,
      {{"standard", AttentionScale::kStandard}, {"log-length", AttentionScale::kLogLength}},
      "1/sqrt(d_head), or ln(n)/ln(ref-len)/sqrt(d_head) for n visible keys");
  t.add("attention-ref-len", &m->attention_ref_len, "N", "reference length of log-length scaling");
  t.group("Classifier (--model classify)");
  t.add("num-labels", &m->num_labels, "K", "labels (0: from the shards)");
  t.add_choice("pool", &m->pool, {{"cls", PoolKind::kCls}, {"mean", PoolKind::kMean}},
               "one vector per sequence: the first row (a CLS token or patch), or the mean");
  t.add_choice("loss", &m->loss,
               {{"softmax", ClassifyLoss::kSoftmax}, {"zlpr", ClassifyLoss::kZlpr}},
               "softmax: one label per example; zlpr: any number of labels, hard or soft");
  t.add("patch", &m->patch, "P", "image shards: P x P patches, one position each (ViT)");
  t.add("image-height", &m->image_height, "H", "image rows (0: from the shards)");
  t.add("image-width", &m->image_width, "W", "image columns (0: from the shards)");
  t.add("image-channels", &m->image_channels, "C", "image channels (0: from the shards)");
}

void validate_model(const ModelConfig& m, bool vocab_from_data) {
  require_between("--layers", m.layers, 1, kMaxLayers);
  require_between("--enc-layers", m.enc_layers, 1, kMaxLayers);
  require_between("--dec-layers", m.dec_layers, 1, kMaxLayers);
  require_between("--d-model", m.d_model, 1, kMaxWidth);
  require_between("--heads", m.heads, 1, kMaxWidth);
  if (m.d_model % m.heads != 0) {
    usage_error("--heads", "must divide --d-model (" + std::to_string(m.d_model) + "); got " +
                               std::to_string(m.heads));
  }
  require_between("--d-ff", m.d_ff, 1, kMaxWidth);
  require_between("--max-len", m.max_len, 4, kMaxWidth);
  require_between("--num-labels", m.num_labels, 0, kMaxWidth);
  require_between("--patch", m.patch, 0, kMaxPatch);
  require_between("--image-height", m.image_height, 0, kMaxImageSide);
  require_between("--image-width", m.image_width, 0, kMaxImageSide);
  require_between("--image-channels", m.image_channels, 0, kMaxPatch);
  const bool classify = m.kind == ModelKind::kClassify;
  if (!classify && m.patch > 0) usage_error("--patch", "only with --model classify");
  if (m.patch > 0 && m.positions != PositionKind::kLearned) {
    usage_error("--positions", "images have learned positions (ViT); drop --positions sinusoidal");
  }
  if (classify && m.num_labels == 1 && m.loss == ClassifyLoss::kSoftmax) {
    usage_error("--num-labels", "a softmax over one label learns nothing; give at least 2");
  }
  // Images have no vocabulary.
  if (!m.images() && !(m.vocab == 0 && vocab_from_data)) {
    const std::string fault = vocab_fault(m.vocab);
    if (!fault.empty()) usage_error("--vocab", fault);
  }
  require_unit_interval("--dropout", m.dropout);
  if (!(m.attention_ref_len > 1)) {
    usage_error("--attention-ref-len",
                "must be greater than 1; got " + format_number(m.attention_ref_len));
  }
}

void apply_layers_shorthand(const std::set<std::string>& given, ModelConfig* m) {
  if (m->kind != ModelKind::kSeq2seq || !given.count("layers")) return;
  if (!given.count("enc-layers")) m->enc_layers = m->layers;
  if (!given.count("dec-layers")) m->dec_layers = m->layers;
}

void add_data_flags(FlagTable& t, TrainConfig* c, bool synthetic_tasks) {
  t.add("data", &c->data_dir, "DIR", "directory of HDF5 token shards (`mpiformer prepare`)");
  if (synthetic_tasks) {
    t.add_choice("synthetic", &c->synthetic,
                 {{"reverse", SyntheticTask::kReverse},
                  {"copy", SyntheticTask::kCopy},
                  {"sort", SyntheticTask::kSort}},
                 "generated task instead of --data");
  }
  t.add("max-tokens", &c->max_tokens, "T", "padded tokens per micro-batch");
  t.add("max-sentences", &c->max_sentences, "N", "sequences per micro-batch (0: no limit)");
  t.add_increasing_list("buckets", &c->buckets, "LIST",
                        "length-bucket boundaries, e.g. 8,16,32 (default: from 8 growing x1.1 to "
                        "--max-len)");
  t.add_choice(
      "too-long", &c->too_long,
      {{"auto", TooLong::kAuto}, {"skip", TooLong::kSkip}, {"truncate", TooLong::kTruncate}},
      "sequences longer than --max-len (auto: skip for seq2seq, truncate for lm and mlm)");
  t.add_choice("sharding", &c->sharding, {{"data", Sharding::kData}, {"file", Sharding::kFile}},
               "data: every rank reads all shards and takes every W-th batch; file: each rank "
               "reads its own shard files");
  t.add("prefetch", &c->prefetch, "N", "batches the loader thread prepares ahead");
  if (synthetic_tasks) t.add("min-len", &c->min_len, "N", "shortest synthetic example");
  t.add("mlm-probability", &c->mlm_probability, "P", "mlm: share of tokens chosen for prediction");
}

void add_optim_flags(FlagTable& t, OptimConfig* o) {
  t.group("Optimizer");
  t.add("lr", &o->lr, "LR", "peak learning rate");
  t.add("warmup", &o->warmup, "W", "linear warmup steps");
  t.add_choice("schedule", &o->schedule,
               {{"constant", ScheduleKind::kConstant},
                {"polynomial", ScheduleKind::kPolynomial},
                {"inverse-sqrt", ScheduleKind::kInverseSqrt},
                {"cosine", ScheduleKind::kCosine}},
               "learning-rate schedule after warmup");
  t.add("end-lr", &o->end_lr, "LR", "polynomial and cosine: learning rate at the last step");
  t.add("poly-power", &o->poly_power, "P", "polynomial: decay power");
  t.add("beta1", &o->beta1, "B", "Adam beta1");
  t.add("beta2", &o->beta2, "B", "Adam beta2");
  t.add("adam-eps", &o->eps, "E", "Adam epsilon");
  t.add("weight-decay", &o->weight_decay, "WD", "decoupled weight decay");
  t.add_switch("decay-all", &o->decay_all, "also decay biases, norms and embeddings");
  t.add("clip-norm", &o->clip_norm, "C", "clip the global gradient norm to C (0: off)");
}

void validate_optim(const OptimConfig& o) {
  require_positive("--lr", o.lr);
  require_at_least("--warmup", o.warmup, 0);
  require_non_negative("--end-lr", o.end_lr);
  require_positive("--poly-power", o.poly_power);
  require_unit_interval("--beta1", o.beta1);
  require_unit_interval("--beta2", o.beta2);
  require_positive("--adam-eps", o.eps);
  require_non_negative("--weight-decay", o.weight_decay);
  require_non_negative("--clip-norm", o.clip_norm);
}

void add_cpu_flags(FlagTable& t, int* threads, const char* threads_help, std::string* blas_core) {
  t.add("threads", threads, "N", threads_help);
  t.add("blas-core", blas_core, "NAME|auto",
        "OpenBLAS's kernel family for the CPU (Haswell, SkylakeX, Zen, ...); auto: OpenBLAS's "
        "choice, or OPENBLAS_CORETYPE, unless it fell back to generic kernels on a CPU with "
        "AVX2 or AVX-512");
}

void validate_cpu(int threads, const std::string& blas_core) {
  require_at_least("--threads", threads, 0);
  const std::string problem = blas_request_problem(blas_core);
  if (!problem.empty()) usage_error("--blas-core", problem);
}

DeviceKind resolve_device(DeviceKind asked, bool cuda_built, int visible_gpus, std::string* why) {
  why->clear();
  if (asked != DeviceKind::kAuto) return asked;
  if (!cuda_built) {
    *why = "auto: this build has no CUDA backend";
    return DeviceKind::kCpu;
  }
  if (visible_gpus == 0) {
    *why = "auto: no GPU visible";
    return DeviceKind::kCpu;
  }
  *why = "auto: " + std::to_string(visible_gpus) + " GPU(s) visible";
  return DeviceKind::kCuda;
}

void settle_device(DeviceKind* device, std::string* why) {
  *device = resolve_device(*device, cuda_backend_built(), cuda_device_count(), why);
}

void add_device_choice(FlagTable& t, DeviceKind* device, const char* help) {
  t.add_choice(
      "device", device,
      {{"cpu", DeviceKind::kCpu}, {"cuda", DeviceKind::kCuda}, {"auto", DeviceKind::kAuto}}, help);
}

void add_precision_choice(FlagTable& t, Precision* precision, const char* help) {
  t.add_choice("precision", precision,
               {{"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16}},
               help);
}

void add_device_flags(FlagTable& t, DeviceKind* device, Precision* precision, bool* tf32,
                      int* threads, std::string* blas_core, AttentionPath* attention) {
  add_device_choice(t, device,
                    "where the model runs (auto: cuda where a GPU is visible, the CPU otherwise)");
  add_precision_choice(t, precision,
                       "precision of activations and GEMM inputs; master weights, Adam state, "
                       "gradient sums, layer-norm statistics, softmax and the loss stay fp32 "
                       "(fp16 adds dynamic loss scaling)");
  t.add_switch("tf32", tf32,
               "cuda, fp32: run the GEMMs on TF32 tensor cores (10-bit mantissas; fp32 is exact "
               "without it)");
  t.add_choice("attention", attention,
               {{"auto", AttentionPath::kAuto},
                {"cudnn", AttentionPath::kCudnn},
                {"plain", AttentionPath::kPlain}},
               "cuda, bf16/fp16: cuDNN's fused attention where it takes a case and the plain "
               "kernels otherwise (auto), cuDNN only (a case it refuses is an error), or the "
               "plain kernels only");
  add_cpu_flags(t, threads, "CPU threads per rank (0: the node's cores shared by its ranks)",
                blas_core);
}

void validate_device(DeviceKind device, Precision precision, bool tf32, int threads,
                     const std::string& blas_core, AttentionPath attention) {
  if (device == DeviceKind::kCuda) {
    if (!cuda_backend_built()) {
      usage_error("--device",
                  "cuda needs a build with the CUDA backend (nvcc found at configure "
                  "time); this build is CPU-only, use --device cpu");
    }
    if (cuda_device_count() == 0) {
      // SLURM and container runtimes say which GPUs a job may see here.
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      usage_error("--device", std::string("cuda requested but no GPU is visible to this process") +
                                  (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")"
                                           : std::string()));
    }
    if (const std::string problem = cuda_architectures_problem(); !problem.empty())
      usage_error("--device", problem);
  }
  validate_device_choice(device, precision, tf32, threads, attention);
  validate_cpu(threads, blas_core);
}

void validate_device_choice(DeviceKind device, Precision precision, bool tf32, int threads,
                            AttentionPath attention) {
  if (tf32 && (device != DeviceKind::kCuda || precision != Precision::kFp32)) {
    usage_error("--tf32", "only with --device cuda --precision fp32");
  }
  if (attention == AttentionPath::kCudnn) {
    if (device != DeviceKind::kCuda) usage_error("--attention", "cudnn needs --device cuda");
    if (precision == Precision::kFp32)
      usage_error("--attention",
                  "cudnn runs bf16 or fp16 (--precision); fp32 runs the plain kernels");
  }
  require_at_least("--threads", threads, 0);
}

void add_recompute_flag(FlagTable& t, Recompute* recompute) {
  t.add_choice("recompute", recompute,
               {{"none", Recompute::kNone},
                {"activation", Recompute::kActivation},
                {"layer", Recompute::kLayer}},
               "what backward recomputes: none keeps every layer's activations; activation "
               "makes the cheap ones again, each MLP's activation from its pre-activation and, in "
               "pre-LN models, each sub-layer's input norm from the stream (a pass over each, no "
               "GEMM rerun); layer keeps only each layer's input and reruns its forward in "
               "backward");
}

void add_reducer_flags(FlagTable& t, float* bucket_mb, bool* overlap, GradSum* grad_sum,
                       Transport* transport, bool* deterministic) {
  t.add("bucket-mb", bucket_mb, "MB",
        "gradient all-reduce bucket size in MiB (0: 25 over NCCL, 4 over MPI)");
  t.add_choice("overlap", overlap, {{"on", true}, {"off", false}},
               "start each bucket's all-reduce during backward (off: all after backward)");
  t.add_choice("grad-sum", grad_sum, {{"exact", GradSum::kExact}, {"float", GradSum::kFloat}},
               "exact: 64-bit fixed-point sums, bitwise the same for any number of ranks and "
               "micro-batches; float: fp32 sums, half the bytes");
  t.add_choice("transport", transport,
               {{"auto", Transport::kAuto}, {"nccl", Transport::kNccl}, {"mpi", Transport::kMpi}},
               "what carries the gradient all-reduce: nccl (device buffers, a GPU per rank), "
               "mpi (host buffers), auto (nccl when every rank has its own GPU)");
  t.add("deterministic", deterministic, "true|false",
        "GPU: only algorithms whose sums do not depend on timing (false: cuDNN's faster "
        "attention backward, whose bits change from run to run, and any GEMM algorithm a "
        "timed search picks)");
}

void validate_transport(DeviceKind device, Transport transport) {
  if (transport != Transport::kNccl) return;
  if (device != DeviceKind::kCuda) usage_error("--transport", "nccl needs --device cuda");
  if (!nccl_built()) {
    usage_error("--transport",
                "nccl needs a build with NCCL (found at configure time); use mpi or auto");
  }
}

std::string requested_blas_core(const std::vector<std::string>& args) {
  const std::string value = early_flag_value(args, "blas-core");
  return value.empty() ? "auto" : value;
}

}  // namespace mpiformer
