// Which OpenBLAS kernel family runs (kernels/cpu/blas_kernels.h): the
// decision for every case, and what this process loaded.
#include "kernels/cpu/blas_kernels.h"

#include <gtest/gtest.h>

#include <string>

namespace mpiformer {
namespace {

const CpuVectorSupport kAvx512{true, true, true};
const CpuVectorSupport kAvx2{true, true, false};
const CpuVectorSupport kAvxOnly{true, false, false};
const CpuVectorSupport kSse{false, false, false};

TEST(BlasKernels, GenericFallbacksAreRecognised) {
  for (const char* name : {"Prescott", "Core2", "Katmai", "Unknown", "prescott", "PENRYN"})
    EXPECT_TRUE(is_generic_blas_core(name)) << name;
  for (const char* name : {"Haswell", "SkylakeX", "Cooperlake", "Zen", "Sandybridge", "Nehalem"})
    EXPECT_FALSE(is_generic_blas_core(name)) << name;
}

TEST(BlasKernels, AGenericFallbackOnAWideCpuIsReplaced) {
  const BlasKernelChoice avx512 = choose_blas_kernels("auto", "", "Prescott", kAvx512);
  EXPECT_EQ(avx512.switch_to, "SkylakeX");
  EXPECT_NE(avx512.reason.find("generic Prescott"), std::string::npos) << avx512.reason;
  EXPECT_NE(avx512.reason.find("AVX-512"), std::string::npos) << avx512.reason;
  EXPECT_EQ(choose_blas_kernels("auto", "", "Core2", kAvx2).switch_to, "Haswell");
  EXPECT_EQ(choose_blas_kernels("auto", "", "Unknown", kAvx512).switch_to, "SkylakeX");
}

TEST(BlasKernels, OpenBlasKeepsWhatItChoseWellOrWhatCannotBeBettered) {
  // A family OpenBLAS recognised, even a narrower one, is its choice.
  EXPECT_EQ(choose_blas_kernels("auto", "", "Zen", kAvx512).switch_to, "");
  EXPECT_EQ(choose_blas_kernels("auto", "", "Cooperlake", kAvx512).switch_to, "");
  // No AVX2: the generic kernels are as good as any the CPU runs.
  EXPECT_EQ(choose_blas_kernels("auto", "", "Prescott", kAvxOnly).switch_to, "");
  EXPECT_EQ(choose_blas_kernels("auto", "", "Prescott", kSse).switch_to, "");
  EXPECT_EQ(choose_blas_kernels("auto", "", "Haswell", kAvx512).reason,
            "OpenBLAS's choice for this CPU");
}

TEST(BlasKernels, TheUsersCoreTypeIsKeptUnlessTheFlagNamesOne) {
  const BlasKernelChoice kept = choose_blas_kernels("auto", "Prescott", "Prescott", kAvx512);
  EXPECT_EQ(kept.switch_to, "");
  EXPECT_EQ(kept.reason, "OPENBLAS_CORETYPE=Prescott");
  EXPECT_EQ(choose_blas_kernels("Haswell", "Prescott", "Prescott", kAvx512).switch_to, "Haswell");
}

TEST(BlasKernels, TheFlagNamesAFamily) {
  EXPECT_EQ(choose_blas_kernels("Haswell", "", "Cooperlake", kAvx512).switch_to, "Haswell");
  // Already loaded (names are case-insensitive): nothing to start again for.
  const BlasKernelChoice same = choose_blas_kernels("skylakex", "", "SkylakeX", kAvx512);
  EXPECT_EQ(same.switch_to, "");
  EXPECT_EQ(same.reason, "--blas-core skylakex");
  // Kernels the CPU cannot run would die on an illegal instruction.
  EXPECT_EQ(choose_blas_kernels("SkylakeX", "", "Haswell", kAvx2).switch_to, "");
  EXPECT_EQ(choose_blas_kernels("Haswell", "", "Prescott", kAvxOnly).switch_to, "");
}

TEST(BlasKernels, WhatLoadedIsNamedAndAccepted) {
  const std::string core = blas_core();
  EXPECT_FALSE(core.empty());
  EXPECT_EQ(blas_library().rfind("OpenBLAS ", 0), 0u) << blas_library();
  EXPECT_NE(describe_blas_kernels().find(core + " kernels"), std::string::npos);
  EXPECT_EQ(blas_request_problem("auto"), "");
  EXPECT_EQ(blas_request_problem(core), "");
  const std::string unknown = blas_request_problem("NoSuchFamily");
  EXPECT_NE(unknown.find("runs its " + core + " kernels, not 'NoSuchFamily'"), std::string::npos)
      << unknown;
}

}  // namespace
}  // namespace mpiformer
