// OpenBLAS's kernel family (kernels/cpu/blas_kernels.h).
#include "kernels/cpu/blas_kernels.h"

#include <cblas.h>
#include <strings.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cpu/program_restart.h"

// Declared by OpenBLAS's cblas.h in recent releases; not by every one.
extern "C" char* openblas_get_corename(void);

namespace mpiformer {

namespace {

// Set for the second start: the family the first asked for, and why.
constexpr const char* kChosenVariable = "MPIFORMER_BLAS_CHOSEN";
// Set to 1, the first start starts again even when the family stays, as on
// a machine where OpenBLAS falls back: a check that nothing a run does
// depends on whether it started again (tests/e2e/process_name.sh).
constexpr const char* kRestartAlwaysVariable = "MPIFORMER_BLAS_RESTART_ALWAYS";

// Why the family that runs was chosen (select_blas_kernels).
std::string& chosen_reason() {
  static std::string reason;
  return reason;
}

bool same_name(const std::string& a, const std::string& b) {
  return a.size() == b.size() && ::strcasecmp(a.c_str(), b.c_str()) == 0;
}

// The widest registers a family's kernels use, for families this CPU may
// not run (an illegal instruction otherwise); the rest need SSE3 at most.
enum class Needs { kNothing, kAvx, kAvx2Fma, kAvx512, kFma4 };

Needs needs_of(const std::string& core) {
  for (const char* name : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (same_name(core, name)) return Needs::kAvx512;
  for (const char* name : {"Haswell", "Zen"})
    if (same_name(core, name)) return Needs::kAvx2Fma;
  if (same_name(core, "Sandybridge")) return Needs::kAvx;
  for (const char* name : {"Bulldozer", "Piledriver", "Steamroller", "Excavator"})
    if (same_name(core, name)) return Needs::kFma4;
  return Needs::kNothing;
}

bool cpu_has_fma4() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("fma4");
#else
  return false;
#endif
}

bool cpu_runs(Needs needs, const CpuVectorSupport& cpu) {
  switch (needs) {
    case Needs::kAvx512:
      return cpu.avx512;
    case Needs::kAvx2Fma:
      return cpu.avx2_fma;
    case Needs::kAvx:
      return cpu.avx;
    case Needs::kFma4:
      return cpu_has_fma4();
    case Needs::kNothing:
      break;
  }
  return true;
}

}  // namespace

CpuVectorSupport cpu_vector_support() {
  CpuVectorSupport cpu;
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's checks include the operating system's saving of the registers
  // (XGETBV), as OpenBLAS's do.
  __builtin_cpu_init();
  cpu.avx = __builtin_cpu_supports("avx");
  cpu.avx2_fma = cpu.avx && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx512 = cpu.avx2_fma && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return cpu;
}

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

// "OpenBLAS 0.3.21" from "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...".
std::string blas_library() {
  const char* config = openblas_get_config();
  if (!config) return "OpenBLAS";
  const std::string text(config);
  const size_t second = text.find(' ', text.find(' ') + 1);
  return text.substr(0, second);
}

bool is_generic_blas_core(const std::string& core) {
  for (const char* name : {"Prescott", "Core2", "Penryn", "Dunnington", "Katmai", "Coppermine",
                           "Northwood", "Banias", "Unknown"}) {
    if (same_name(core, name)) return true;
  }
  return false;
}

BlasKernelChoice choose_blas_kernels(const std::string& requested, const std::string& coretype,
                                     const std::string& loaded, const CpuVectorSupport& cpu) {
  if (requested != "auto") {
    // A family this CPU cannot run would end in an illegal instruction:
    // keep what loaded, and check_blas_request refuses the flag.
    if (same_name(loaded, requested) || !cpu_runs(needs_of(requested), cpu))
      return {"", "--blas-core " + requested};
    return {requested, "--blas-core " + requested};
  }
  if (!coretype.empty()) return {"", "OPENBLAS_CORETYPE=" + coretype};
  const char* best = cpu.avx512 ? "SkylakeX" : cpu.avx2_fma ? "Haswell" : nullptr;
  if (!is_generic_blas_core(loaded) || best == nullptr)
    return {"", "OpenBLAS's choice for this CPU"};
  return {best, std::string("chosen by mpiformer: OpenBLAS took its generic ") + loaded +
                    " kernels on a CPU with " + (cpu.avx512 ? "AVX-512" : "AVX2") +
                    "; --blas-core NAME overrides"};
}

void select_blas_kernels(char** argv, const std::string& requested) {
  if (const char* chosen = std::getenv(kChosenVariable)) {
    // The second start: "FAMILY<tab>why" from the first. OpenBLAS may still
    // have taken another family (a name it does not know); say so.
    const std::string text(chosen);
    const size_t tab = text.find('\t');
    const std::string asked = text.substr(0, tab);
    chosen_reason() = tab == std::string::npos ? text : text.substr(tab + 1);
    if (!same_name(blas_core(), asked))
      chosen_reason() = "asked for " + asked + " kernels, which OpenBLAS did not load";
    ::unsetenv(kChosenVariable);
    keep_process_name();
    return;
  }
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const BlasKernelChoice choice =
      choose_blas_kernels(requested, coretype ? coretype : "", blas_core(), cpu_vector_support());
  chosen_reason() = choice.reason;
  // MPIFORMER_BLAS_RESTART_ALWAYS=1: the family that loaded, through a new start.
  const char* always = std::getenv(kRestartAlwaysVariable);
  const bool forced = choice.switch_to.empty() && always && std::string(always) == "1";
  const std::string family = forced ? blas_core() : choice.switch_to;
  if (family.empty()) return;
  const std::string previous = coretype ? coretype : "";
  ::setenv("OPENBLAS_CORETYPE", family.c_str(), 1);
  ::setenv(kChosenVariable, (family + "\t" + choice.reason).c_str(), 1);
  restart_program(argv);
  // Still here: run on what loaded, and say why.
  const std::string why = std::strerror(errno);
  if (coretype)
    ::setenv("OPENBLAS_CORETYPE", previous.c_str(), 1);
  else
    ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv(kChosenVariable);
  chosen_reason() =
      forced ? choice.reason + "; starting again failed: " + why
             : "OpenBLAS's choice; starting again with " + family + " kernels failed: " + why;
}

std::string blas_request_problem(const std::string& requested) {
  if (requested == "auto" || same_name(blas_core(), requested)) return "";
  if (!cpu_runs(needs_of(requested), cpu_vector_support()))
    return "this CPU cannot run OpenBLAS's " + requested +
           " kernels (they need instructions it lacks); auto chooses for it";
  return blas_library() + " runs its " + blas_core() + " kernels, not '" + requested +
         "': a name it does not know (such as Haswell, SkylakeX, Zen or Sandybridge; "
         "OPENBLAS_VERBOSE=2 shows what it loads)";
}

std::string describe_blas_kernels() {
  const std::string& reason = chosen_reason();
  return blas_library() + ", " + blas_core() + " kernels" +
         (reason.empty() ? "" : " (" + reason + ")");
}

}  // namespace mpiformer
