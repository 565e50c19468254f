// The developers' switches between a GPU kernel family's older path and
// a newer one that may replace it (MPIFORMER_KERNELS), so that one GPU run
// measures both side by side (scripts/gpu-check limit). The newer path is
// a candidate until a GPU run shows it faster with the bits it promises;
// then it becomes the default, and the older path stays selectable, so the
// next run still measures what it replaced. Both paths are tested against
// the CPU reference (tests/cuda_ops_test.cpp).
//
//   MPIFORMER_KERNELS=gemm=timed,attention=dense     candidates
//   MPIFORMER_KERNELS=layernorm=block,adamw=ranged   older paths
//   MPIFORMER_KERNELS=candidates        every family on its newer path
//
// Unset or empty: the defaults below (measured on an H200, 2026-11-29:
// docs/GPU_RESULTS.md). The CPU backend has one path per op and ignores
// the variable (its exact sum is direct).
#pragma once

#include <string>

namespace mpiformer {

struct KernelSwitches {
  // Layer norm's forward and its residual add: block, a block of 256
  // threads per row reading it three times; warp (default), a warp per row
  // holding it in registers, 16-byte loads, one read
  // (kernels/layernorm_rows.h).
  enum class LayerNorm { kBlock, kWarp } layernorm = LayerNorm::kWarp;
  // Layer norm's backward: block (default), 8 warps of two rows each, two
  // passes over a row; warp, a warp per row holding x and dout as stored
  // in registers, the next row's loads started while one is worked on
  // (and the next row's dx, where added to, brought into L2; a row's dx
  // loaded before its sums where the registers allow), dgamma and dbeta
  // summed in shared memory, so that two blocks fit on an SM, the blocks'
  // sums then added with 16 loads in flight a thread (a candidate:
  // its first form, the row and the sums in fp32 registers, one block per
  // SM, was slower than block on an H200).
  LayerNorm layernorm_backward = LayerNorm::kBlock;
  // The fused cross entropy: reread (default), a block of 256 threads per
  // row, a second pass over the row (from L2 when it is still there);
  // pipelined, a block of 1024 threads per SM looping over rows, each row
  // (its tail too) copied into shared memory (cp.async), and its target
  // read, while the one before is worked on, so that it is read from memory once
  // and the copies overlap the arithmetic, with the max and its first index
  // taken first rather than an online softmax and exp as the SFU's 2^x
  // (kernels/cuda/cross_entropy_kernels.cuh). Other bits, as
  // deterministic. A candidate.
  enum class Loss { kReread, kPipelined } loss = Loss::kReread;
  // cuBLASLt's algorithm per GEMM shape: heuristic (default), its first
  // suggestion; timed, the fastest of its suggestions, timed once per
  // shape: among those that give the first suggestion's bits (the same
  // bits either way), or with --deterministic false among all (the bits
  // then depend on what won). See kernels/gemm_search.h. A candidate: 2%
  // off GPT-2's GEMMs on an H200, but its timing stalls the step that meets
  // a shape the second time, which ragged training has not yet measured.
  enum class Gemm { kHeuristic, kTimed } gemm = Gemm::kHeuristic;
  // cuDNN's attention on a batch of equal lengths: ragged (default), the
  // packed layout with per-sequence offsets and a padding mask, as every
  // batch; dense, the plain (b, s, h, d) layout without them. A candidate:
  // faster, but a prepared run takes it only for a uniform class's full
  // batches (SideBound::one_length): bench's synthetic batch, and train's
  // buckets whose sequences all have one length (an image classifier's);
  // a ragged bucket's batches keep the ragged layout.
  enum class Attention { kRagged, kDense } attention = Attention::kRagged;
  // The exact gradient sum (src/parallel/gradient_reducer.h): buffered, its
  // int64 buffer zeroed every step and each contribution added, then read
  // back into the gradients; direct (default), the first contribution
  // written rather than added, and one rank's single contribution rounded
  // in place in the gradients without touching the buffer. The same bits
  // either way.
  enum class Exact { kBuffered, kDirect } exact = Exact::kDirect;
  // AdamW, a block per range: ranged, a float of each buffer per thread
  // and step; vector (default), 16 bytes of each
  // (kernels/cuda/adamw_kernels.cuh). The same bits either way.
  enum class AdamW { kRanged, kVector } adamw = AdamW::kVector;
  // The weight gradient's GEMM (dW += x^T dout over a micro-batch's
  // tokens): whole (default), one GEMM with the bias gradient fused;
  // split, where few output tiles would leave SMs idle, a batch of GEMMs
  // over token ranges, each with its bias gradient, whose sums are then
  // added in order (kernels/dweight_split.h). Other bits, as
  // deterministic. A candidate: no faster on an H200.
  enum class DWeight { kWhole, kSplit } dweight = DWeight::kWhole;
  // Where the weight gradient's GEMM runs: main (default), on the device's
  // stream after the dx GEMM; side, on a second stream beside the dx GEMM
  // (each with its own cuBLASLt workspace), joined before the op returns,
  // so that a weight gradient whose few output tiles leave SMs idle shares
  // the GPU with dx (gemm=timed times its trials with the side stream
  // idle). The same bits. A candidate.
  enum class DWeightStream { kMain, kSide } dweight_stream = DWeightStream::kMain;
  // cuDNN attention's execution plan per graph: heuristic (default), the
  // first of heuristic A's plans that builds; timed, the fastest of the
  // plans of heuristics A and B, timed once per graph on its second call:
  // among those that give the first plan's bits, checked again on a batch
  // of other lengths and on longer ones (the same bits either way), or
  // with --deterministic false among all. See kernels/attention_search.h. A candidate.
  enum class AttentionPlan { kHeuristic, kTimed } attention_plan = AttentionPlan::kHeuristic;
  // A layer's bias gradient (the sum over tokens of dout): epilogue
  // (default), from the weight gradient's GEMM (cuBLASLt's BGRADB);
  // columns, the GEMM alone and then a pass over dout that sums its
  // columns, 16 bytes a load, each column's tokens in order
  // (kernels/cuda/column_sums_kernels.cuh), for where the epilogue costs
  // the GEMM more than the pass (KernelTiming.CublasLtEpiloguesOnGpt2B32
  // times each GPT-2 GEMM with BGRADB and without). Other bits, as
  // deterministic. A candidate.
  enum class DBias { kEpilogue, kColumns } dbias = DBias::kEpilogue;
  // The bias gradient of a pre-norm sublayer's output projection (the
  // attention's, the MLP's second layer), the sum over tokens of the
  // residual stream's gradient: gemm (default), from that projection's
  // weight gradient, as dbias says; norm, summed by the sublayer's layer
  // norm backward, which reads that gradient anyway as the dx it adds to
  // (Ops::layernorm_backward's dx_sums), so that two of a block's four
  // weight gradients run without BGRADB and nothing is read again (without
  // dropout on the sublayer's output; with it, gemm). Other bits, as
  // deterministic. A candidate.
  enum class DBiasOut { kGemm, kNorm } dbias_out = DBiasOut::kGemm;
  // The bias gradient of an MLP's first layer (the sum over tokens of the
  // gradient at its pre-activation): gemm (default), from that layer's
  // weight gradient, as dbias says; dgelu, from the second layer's dx
  // GEMM, whose epilogue writes that gradient through GELU's backward and
  // sums it as it goes (cuBLASLt's DGELU_BGRAD, the sums in fp32;
  // FusedActivation::pre_bias_grad), so that the first layer's weight
  // gradient runs without BGRADB and nothing is read again (where cuBLASLt
  // has no such algorithm, or the activation is not GELU, a column-sum
  // pass over the gradient instead). Other bits, as deterministic: the
  // epilogue sums the gradient before it is rounded to bf16. A candidate.
  enum class DBiasIn { kGemm, kDGelu } dbias_in = DBiasIn::kGemm;
};

// How often each family's newer path ran, of the calls that asked for it;
// the rest took the older path (a size, shape or alignment the newer one
// does not take, or a batch it is not for). The GPU backend counts; bench
// reports it, and the GPU tests check that a newer path ran at all: one
// that never ran measured nothing. gemm and exact are not counted here:
// bench's gemm_search tells the timed search's shapes, and exact=direct,
// asked for, always runs.
struct CandidateCalls {
  // kernel_switches.cpp's families, in its order.
  enum Family {
    kLayerNorm,
    kLayerNormBackward,
    kLoss,
    kGemm,
    kAttention,
    kExact,
    kAdamW,
    kDWeight,
    kDWeightStream,
    kAttentionPlan,
    kDBias,
    kDBiasOut,
    kDBiasIn,
    kFamilies
  };
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

// MPIFORMER_KERNELS's switches (the defaults when it is unset).
KernelSwitches kernel_switches_from_environment();

// "layernorm=warp,layernorm_backward=block,loss=reread,gemm=heuristic,
// attention=ragged,exact=direct,adamw=vector,dweight=whole,dweight_stream=main,
// attention_plan=heuristic,dbias=epilogue,dbias_out=gemm,dbias_in=gemm"
// (the defaults):
// every family, for start lines and bench's JSON.
std::string describe(const KernelSwitches& switches);

// "layernorm=warp 49 of 49 calls, dweight=split 24 of 72 calls": each
// family asked for at least once; empty where none was.
std::string describe(const CandidateCalls& calls);

}  // namespace mpiformer
