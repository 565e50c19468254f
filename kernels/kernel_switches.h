// The developers' switches between a GPU kernel family's present path and
// a candidate that may replace it (MPIFORMER_KERNELS), so that one GPU run
// measures both side by side (scripts/gpu-check limit) before a candidate
// becomes the default. Each family keeps both paths, and both are tested
// against the CPU reference (tests/cuda_ops_test.cpp).
//
//   MPIFORMER_KERNELS=layernorm=warp,gemm=timed,exact=direct,dweight=split
//   MPIFORMER_KERNELS=candidates        every family on its candidate
//
// Unset or empty: every family on its present path. The CPU backend has
// one path per op and ignores the variable (its exact sum is direct).
#pragma once

#include <string>

namespace mpiformer {

struct KernelSwitches {
  // Layer norm and its residual add: block, a block of 256 threads per row
  // reading it three times (present); warp, a warp per row holding it in
  // registers, 16-byte loads, one read (kernels/layernorm_rows.h).
  enum class LayerNorm { kBlock, kWarp } layernorm = LayerNorm::kBlock;
  // The fused cross entropy: reread, a second pass over the row (from L2
  // when it is still there); staged, the row kept in shared memory between
  // the passes, so it is read from memory once.
  enum class Loss { kReread, kStaged } loss = Loss::kReread;
  // cuBLASLt's algorithm per GEMM shape: heuristic, its first suggestion;
  // timed, the fastest of its suggestions, timed once per shape: among
  // those that give the first suggestion's bits (the same bits either
  // way), or with --deterministic false among all (the bits then depend on
  // what won). See kernels/gemm_search.h.
  enum class Gemm { kHeuristic, kTimed } gemm = Gemm::kHeuristic;
  // cuDNN's attention on a batch of equal lengths: ragged, the packed
  // layout with per-sequence offsets and a padding mask, as every batch;
  // dense, the plain (b, s, h, d) layout without them.
  enum class Attention { kRagged, kDense } attention = Attention::kRagged;
  // The exact gradient sum (src/parallel/gradient_reducer.h): buffered, its
  // int64 buffer zeroed every step and each contribution added, then read
  // back into the gradients; direct, the first contribution written rather
  // than added, and one rank's single contribution rounded in place in the
  // gradients without touching the buffer. The same bits either way.
  enum class Exact { kBuffered, kDirect } exact = Exact::kBuffered;
  // AdamW, a block per range: ranged, a float of each buffer per thread
  // and step; vector, 16 bytes of each (kernels/cuda/adamw_kernels.cuh).
  // The same bits either way.
  enum class AdamW { kRanged, kVector } adamw = AdamW::kRanged;
  // The weight gradient's GEMM (dW += x^T dout over a micro-batch's
  // tokens): whole, one GEMM with the bias gradient fused; split, where
  // few output tiles would leave SMs idle, a batch of GEMMs over token
  // ranges, each with its bias gradient, whose sums are then added in
  // order (kernels/dweight_split.h). Other bits, as deterministic.
  enum class DWeight { kWhole, kSplit } dweight = DWeight::kWhole;
};

// How often each family's candidate ran, of the calls that asked for it;
// the rest took the present path (a size, shape or alignment the
// candidate does not take, or a batch it is not for). The GPU backend
// counts; bench reports it, and the GPU tests check that a candidate ran
// at all: one that never ran measured nothing. gemm and exact are not
// counted here: bench's gemm_search tells the timed search's shapes, and
// exact=direct, asked for, always runs.
struct CandidateCalls {
  // kernel_switches.cpp's families, in its order.
  enum Family { kLayerNorm, kLoss, kGemm, kAttention, kExact, kAdamW, kDWeight, kFamilies };
  long long asked[kFamilies] = {};
  long long ran[kFamilies] = {};
  void count(Family f, bool took) {
    ++asked[f];
    if (took) ++ran[f];
  }
};

// The switches `text` names (the syntax above). Throws
// std::invalid_argument naming the variable, the bad part and the choices.
KernelSwitches parse_kernel_switches(const std::string& text);

// MPIFORMER_KERNELS's switches (the present paths when it is unset).
KernelSwitches kernel_switches_from_environment();

// "layernorm=block,loss=reread,gemm=heuristic,attention=ragged,
// exact=buffered,adamw=ranged,dweight=whole": every family, for start
// lines and bench's JSON.
std::string describe(const KernelSwitches& switches);

// "layernorm=warp 49 of 49 calls, dweight=split 24 of 72 calls": each
// family asked for at least once; empty where none was.
std::string describe(const CandidateCalls& calls);

}  // namespace mpiformer
