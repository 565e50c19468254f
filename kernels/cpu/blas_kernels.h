// Which of OpenBLAS's kernel families runs the CPU backend's GEMMs.
//
// OpenBLAS (a DYNAMIC_ARCH build, as distributions ship it) picks a family
// for the CPU when the library loads, or the one OPENBLAS_CORETYPE names. A
// release older than the CPU does not recognise it and falls back to its
// generic SSE3 kernels ("Prescott"), several times slower on a CPU with
// AVX2 or AVX-512, and without a word. Since the choice is made at load
// time, a better one means starting the program again with
// OPENBLAS_CORETYPE set: select_blas_kernels() does that first thing in
// main, before MPI starts, on every rank alike.
//
// The family also decides the last bits of every GEMM, so runs are bitwise
// comparable only on one family (docs/DESIGN.md section 6): the start line,
// config.ini and metrics.h5 record which one ran (describe_blas_kernels).
#pragma once

#include <string>

namespace mpiformer {

// What this CPU (and its operating system, which must save the wider
// registers) can run.
struct CpuVectorSupport {
  bool avx = false;
  bool avx2_fma = false;
  bool avx512 = false;  // F, CD, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use
};
CpuVectorSupport cpu_vector_support();

// The family OpenBLAS loaded ("Haswell", "SkylakeX", "Prescott").
std::string blas_core();
// The library and its version ("OpenBLAS 0.3.21").
std::string blas_library();

// Whether `core` is one of OpenBLAS's generic fallbacks for x86-64 (SSE3
// and older), which it takes for a CPU it does not know.
bool is_generic_blas_core(const std::string& core);

// What to do about the kernels. requested: --blas-core ("auto" or a family
// name); coretype: the user's OPENBLAS_CORETYPE ("" when unset); loaded:
// blas_core(). switch_to is empty when the loaded family stays.
struct BlasKernelChoice {
  std::string switch_to;
  std::string reason;  // why this family, for the start line
};
BlasKernelChoice choose_blas_kernels(const std::string& requested, const std::string& coretype,
                                     const std::string& loaded, const CpuVectorSupport& cpu);

// Called first in main with the program's arguments and --blas-core's
// value ("auto" when not given). When choose_blas_kernels() asks for
// another family, sets OPENBLAS_CORETYPE and executes this program again
// with the same arguments, under its own name (once: the new process keeps
// what it loaded; kernels/cpu/program_restart.h).
// Returns when nothing is to change or the new start failed.
void select_blas_kernels(char** argv, const std::string& requested);

// What is wrong with --blas-core's value, "" when nothing: OpenBLAS did
// not load the family it names (a name it does not know, or kernels this
// CPU cannot run).
std::string blas_request_problem(const std::string& requested);

// "OpenBLAS 0.3.21, SkylakeX kernels (chosen by mpiformer: ...)".
std::string describe_blas_kernels();

}  // namespace mpiformer
