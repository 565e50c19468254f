// Flags that several commands take, bound to the configuration structs of
// src/core/config.h they share, and the checks that go with them.
#pragma once

#include <set>
#include <string>

#include "src/app/flags.h"
#include "src/core/config.h"

namespace mpiformer {

// The model's shape (train, bench).
void add_model_flags(FlagTable& t, ModelConfig* m,
                     const char* vocab_help = "vocabulary size, reserved ids included");

// --layers stands for both stacks of a seq2seq model unless --enc-layers or
// --dec-layers is given.
void apply_layers_shorthand(const std::set<std::string>& given, ModelConfig* m);

// Where the batches come from and how they are cut: --data and the batching
// flags (train; bench --data, which has no --synthetic tasks nor their
// --min-len). The caller names the group.
void add_data_flags(FlagTable& t, TrainConfig* c, bool synthetic_tasks);

// AdamW and the learning-rate schedule (train, bench).
void add_optim_flags(FlagTable& t, OptimConfig* o);
void validate_optim(const OptimConfig& o);

// --threads and --blas-core, which every command that computes takes.
void add_cpu_flags(FlagTable& t, int* threads, const char* threads_help, std::string* blas_core);
void validate_cpu(int threads, const std::string& blas_core);

// --device cpu|cuda|auto with `help` (what runs there).
void add_device_choice(FlagTable& t, DeviceKind* device, const char* help);
// --precision fp32|bf16|fp16 with `help`.
void add_precision_choice(FlagTable& t, Precision* precision, const char* help);
// Where and in what precision the model runs, with --threads and
// --blas-core (train, bench).
void add_device_flags(FlagTable& t, DeviceKind* device, Precision* precision, bool* tf32,
                      int* threads, std::string* blas_core, AttentionPath* attention);
void validate_device(DeviceKind device, Precision precision, bool tf32, int threads,
                     const std::string& blas_core, AttentionPath attention);
// --device auto: cuda where this build has the CUDA backend and the process
// sees a GPU, the CPU otherwise, `why` saying which held ("auto: 1 GPU
// visible"); cpu and cuda stay as asked (`why` empty).
DeviceKind resolve_device(DeviceKind asked, bool cuda_built, int visible_gpus, std::string* why);
// resolve_device on this machine, in place.
void settle_device(DeviceKind* device, std::string* why);
// The same rules of the values alone, with no look at this machine's
// devices and BLAS (a run's recorded configuration keeps them).
void validate_device_choice(DeviceKind device, Precision precision, bool tf32, int threads,
                            AttentionPath attention);

// The gradient all-reduce (train, bench).
void add_reducer_flags(FlagTable& t, float* bucket_mb, bool* overlap, GradSum* grad_sum,
                       Transport* transport, bool* deterministic);
void validate_transport(DeviceKind device, Transport transport);

// --recompute: what backward recomputes to save activation memory (train, bench).
void add_recompute_flag(FlagTable& t, Recompute* recompute);

}  // namespace mpiformer
