// MPIFORMER_KERNELS (kernels/kernel_switches.h): the families' defaults
// (newer paths where a GPU run chose them), each path by name, every newer
// path at once, and a refusal that names the variable, the bad part and
// the choices.
#include "kernels/kernel_switches.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace mpiformer {
namespace {

constexpr const char* kDefaults =
    "layernorm=warp,layernorm_backward=block,loss=reread,gemm=heuristic,attention=ragged,"
    "exact=direct,adamw=vector,dweight=whole,dweight_stream=main,attention_plan=heuristic,"
    "dbias=epilogue,dbias_out=gemm,dbias_in=gemm";

TEST(KernelSwitches, DefaultsUnlessNamed) {
  EXPECT_EQ(describe(KernelSwitches{}), kDefaults);
  EXPECT_EQ(describe(parse_kernel_switches("")), kDefaults);
  EXPECT_EQ(describe(parse_kernel_switches("layernorm=block")),
            "layernorm=block,layernorm_backward=block,loss=reread,gemm=heuristic,"
            "attention=ragged,exact=direct,adamw=vector,dweight=whole,dweight_stream=main,"
            "attention_plan=heuristic,dbias=epilogue,dbias_out=gemm,dbias_in=gemm");
  EXPECT_EQ(
      describe(parse_kernel_switches(",loss=pipelined,")),
      "layernorm=warp,layernorm_backward=block,loss=pipelined,gemm=heuristic,attention=ragged,"
      "exact=direct,adamw=vector,dweight=whole,dweight_stream=main,attention_plan=heuristic,"
      "dbias=epilogue,dbias_out=gemm,dbias_in=gemm");
  const KernelSwitches s = parse_kernel_switches("gemm=timed,layernorm_backward=warp");
  EXPECT_EQ(s.gemm, KernelSwitches::Gemm::kTimed);
  EXPECT_EQ(s.layernorm, KernelSwitches::LayerNorm::kWarp);
  EXPECT_EQ(s.layernorm_backward, KernelSwitches::LayerNorm::kWarp);
  EXPECT_EQ(s.loss, KernelSwitches::Loss::kReread);
  EXPECT_EQ(s.attention, KernelSwitches::Attention::kRagged);
  EXPECT_EQ(s.exact, KernelSwitches::Exact::kDirect);
  EXPECT_EQ(s.adamw, KernelSwitches::AdamW::kVector);
  EXPECT_EQ(s.dweight, KernelSwitches::DWeight::kWhole);
  EXPECT_EQ(s.dweight_stream, KernelSwitches::DWeightStream::kMain);
  EXPECT_EQ(s.attention_plan, KernelSwitches::AttentionPlan::kHeuristic);
  EXPECT_EQ(parse_kernel_switches("attention=dense").attention, KernelSwitches::Attention::kDense);
  EXPECT_EQ(parse_kernel_switches("exact=buffered").exact, KernelSwitches::Exact::kBuffered);
  EXPECT_EQ(parse_kernel_switches("adamw=ranged").adamw, KernelSwitches::AdamW::kRanged);
  EXPECT_EQ(parse_kernel_switches("dweight=split").dweight, KernelSwitches::DWeight::kSplit);
  EXPECT_EQ(parse_kernel_switches("dweight_stream=side").dweight_stream,
            KernelSwitches::DWeightStream::kSide);
  EXPECT_EQ(parse_kernel_switches("loss=pipelined").loss, KernelSwitches::Loss::kPipelined);
  EXPECT_EQ(parse_kernel_switches("attention_plan=timed").attention_plan,
            KernelSwitches::AttentionPlan::kTimed);
  EXPECT_EQ(s.dbias, KernelSwitches::DBias::kEpilogue);
  EXPECT_EQ(parse_kernel_switches("dbias=columns").dbias, KernelSwitches::DBias::kColumns);
  EXPECT_EQ(s.dbias_out, KernelSwitches::DBiasOut::kGemm);
  EXPECT_EQ(parse_kernel_switches("dbias_out=norm").dbias_out, KernelSwitches::DBiasOut::kNorm);
  EXPECT_EQ(s.dbias_in, KernelSwitches::DBiasIn::kGemm);
  EXPECT_EQ(parse_kernel_switches("dbias_in=dgelu").dbias_in, KernelSwitches::DBiasIn::kDGelu);
  EXPECT_EQ(parse_kernel_switches("layernorm=block").layernorm_backward,
            KernelSwitches::LayerNorm::kBlock);
}

TEST(KernelSwitches, CandidatesTurnsEveryFamilyAndLaterPartsWin) {
  EXPECT_EQ(describe(parse_kernel_switches("candidates")),
            "layernorm=warp,layernorm_backward=warp,loss=pipelined,gemm=timed,attention=dense,"
            "exact=direct,adamw=vector,dweight=split,dweight_stream=side,attention_plan=timed,"
            "dbias=columns,dbias_out=norm,dbias_in=dgelu");
  EXPECT_EQ(describe(parse_kernel_switches("candidates,gemm=heuristic")),
            "layernorm=warp,layernorm_backward=warp,loss=pipelined,gemm=heuristic,attention=dense,"
            "exact=direct,adamw=vector,dweight=split,dweight_stream=side,attention_plan=timed,"
            "dbias=columns,dbias_out=norm,dbias_in=dgelu");
  EXPECT_EQ(describe(parse_kernel_switches("loss=pipelined,loss=reread")), kDefaults);
  EXPECT_EQ(describe(parse_kernel_switches("exact=buffered,adamw=ranged,layernorm=block")),
            "layernorm=block,layernorm_backward=block,loss=reread,gemm=heuristic,"
            "attention=ragged,exact=buffered,adamw=ranged,dweight=whole,dweight_stream=main,"
            "attention_plan=heuristic,dbias=epilogue,dbias_out=gemm,dbias_in=gemm");
}

TEST(KernelSwitches, ARefusalNamesTheVariableThePartAndTheChoices) {
  for (const std::string bad :
       {"layernorm=fast", "bogus", "attention=cudnn", "loss", "=warp", "exact=float"}) {
    try {
      parse_kernel_switches("loss=pipelined," + bad);
      ADD_FAILURE() << bad << " was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "MPIFORMER_KERNELS is 'loss=pipelined," + bad + "': '" + bad +
                    "' is not a switch; expected a comma-separated list of layernorm=block|warp, "
                    "layernorm_backward=block|warp, loss=reread|pipelined, gemm=heuristic|timed, "
                    "attention=ragged|dense, "
                    "exact=buffered|direct, adamw=ranged|vector, dweight=whole|split, "
                    "dweight_stream=main|side, attention_plan=heuristic|timed, "
                    "dbias=epilogue|columns, dbias_out=gemm|norm, dbias_in=gemm|dgelu, or "
                    "candidates");
    }
  }
}

TEST(KernelSwitches, ReadFromTheEnvironment) {
  ::unsetenv("MPIFORMER_KERNELS");
  EXPECT_EQ(describe(kernel_switches_from_environment()), kDefaults);
  ::setenv("MPIFORMER_KERNELS", "loss=pipelined", 1);
  EXPECT_EQ(
      describe(kernel_switches_from_environment()),
      "layernorm=warp,layernorm_backward=block,loss=pipelined,gemm=heuristic,attention=ragged,"
      "exact=direct,adamw=vector,dweight=whole,dweight_stream=main,attention_plan=heuristic,"
      "dbias=epilogue,dbias_out=gemm,dbias_in=gemm");
  ::setenv("MPIFORMER_KERNELS", "loss=fast", 1);
  EXPECT_THROW(kernel_switches_from_environment(), std::invalid_argument);
  ::unsetenv("MPIFORMER_KERNELS");
}

// The newer paths' calls name each family asked for, in the switches'
// order, by its newer path's name; nothing where none was asked for.
TEST(KernelSwitches, CandidateCallsNameTheFamiliesAskedFor) {
  CandidateCalls calls;
  EXPECT_EQ(describe(calls), "");
  calls.count(CandidateCalls::kDWeight, true);
  calls.count(CandidateCalls::kDWeight, false);
  calls.count(CandidateCalls::kDWeight, false);
  calls.count(CandidateCalls::kLayerNorm, true);
  calls.count(CandidateCalls::kAttention, false);
  EXPECT_EQ(describe(calls),
            "layernorm=warp 1 of 1 calls, attention=dense 0 of 1 calls, dweight=split 1 of 3 "
            "calls");
  calls.count(CandidateCalls::kLoss, true);
  calls.count(CandidateCalls::kAdamW, true);
  calls.count(CandidateCalls::kLayerNormBackward, false);
  calls.count(CandidateCalls::kDWeightStream, true);
  calls.count(CandidateCalls::kAttentionPlan, false);
  calls.count(CandidateCalls::kDBias, true);
  calls.count(CandidateCalls::kDBiasOut, true);
  calls.count(CandidateCalls::kDBiasOut, false);
  calls.count(CandidateCalls::kDBiasIn, true);
  EXPECT_EQ(describe(calls),
            "layernorm=warp 1 of 1 calls, layernorm_backward=warp 0 of 1 calls, loss=pipelined 1 "
            "of 1 calls, attention=dense 0 of 1 calls, adamw=vector 1 of 1 calls, dweight=split 1 "
            "of 3 calls, dweight_stream=side 1 of 1 calls, attention_plan=timed 0 of 1 calls, "
            "dbias=columns 1 of 1 calls, dbias_out=norm 1 of 2 calls, dbias_in=dgelu 1 of 1 "
            "calls");
}

}  // namespace
}  // namespace mpiformer
