// MPIFORMER_KERNELS (kernels/kernel_switches.h).
#include "kernels/kernel_switches.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <stdexcept>

namespace mpiformer {

namespace {

constexpr const char* kVariable = "MPIFORMER_KERNELS";

// One family's two paths by name: older first, newer second.
struct Family {
  const char* name;
  const char* paths[2];
};
constexpr Family kFamilies[] = {
    {"layernorm", {"block", "warp"}},     {"layernorm_backward", {"block", "warp"}},
    {"loss", {"reread", "pipelined"}},    {"gemm", {"heuristic", "timed"}},
    {"attention", {"ragged", "dense"}},   {"exact", {"buffered", "direct"}},
    {"adamw", {"ranged", "vector"}},      {"dweight", {"whole", "split"}},
    {"dweight_stream", {"main", "side"}}, {"attention_plan", {"heuristic", "timed"}},
    {"dbias", {"epilogue", "columns"}},   {"dbias_out", {"gemm", "norm"}},
    {"dbias_in", {"gemm", "dgelu"}},
};

// The index of path `p` in family `f`, or -1.
int path_index(const Family& f, const std::string& p) {
  for (int i = 0; i < 2; ++i)
    if (p == f.paths[i]) return i;
  return -1;
}

std::string choices() {
  std::string text;
  for (const Family& f : kFamilies)
    text += std::string(text.empty() ? "" : ", ") + f.name + "=" + f.paths[0] + "|" + f.paths[1];
  return text + ", or candidates";
}

[[noreturn]] void refuse(const std::string& text, const std::string& part) {
  throw std::invalid_argument(std::string(kVariable) + " is '" + text + "': '" + part +
                              "' is not a switch; expected a comma-separated list of " + choices());
}

// Sets family `f` (kFamilies' index) to path `p` (0 older, 1 newer).
void set(KernelSwitches& s, int f, int p) {
  if (f == 0) s.layernorm = static_cast<KernelSwitches::LayerNorm>(p);
  if (f == 1) s.layernorm_backward = static_cast<KernelSwitches::LayerNorm>(p);
  if (f == 2) s.loss = static_cast<KernelSwitches::Loss>(p);
  if (f == 3) s.gemm = static_cast<KernelSwitches::Gemm>(p);
  if (f == 4) s.attention = static_cast<KernelSwitches::Attention>(p);
  if (f == 5) s.exact = static_cast<KernelSwitches::Exact>(p);
  if (f == 6) s.adamw = static_cast<KernelSwitches::AdamW>(p);
  if (f == 7) s.dweight = static_cast<KernelSwitches::DWeight>(p);
  if (f == 8) s.dweight_stream = static_cast<KernelSwitches::DWeightStream>(p);
  if (f == 9) s.attention_plan = static_cast<KernelSwitches::AttentionPlan>(p);
  if (f == 10) s.dbias = static_cast<KernelSwitches::DBias>(p);
  if (f == 11) s.dbias_out = static_cast<KernelSwitches::DBiasOut>(p);
  if (f == 12) s.dbias_in = static_cast<KernelSwitches::DBiasIn>(p);
}

int path_of(const KernelSwitches& s, int f) {
  if (f == 0) return static_cast<int>(s.layernorm);
  if (f == 1) return static_cast<int>(s.layernorm_backward);
  if (f == 2) return static_cast<int>(s.loss);
  if (f == 3) return static_cast<int>(s.gemm);
  if (f == 4) return static_cast<int>(s.attention);
  if (f == 5) return static_cast<int>(s.exact);
  if (f == 6) return static_cast<int>(s.adamw);
  if (f == 7) return static_cast<int>(s.dweight);
  if (f == 8) return static_cast<int>(s.dweight_stream);
  if (f == 9) return static_cast<int>(s.attention_plan);
  if (f == 10) return static_cast<int>(s.dbias);
  if (f == 11) return static_cast<int>(s.dbias_out);
  return static_cast<int>(s.dbias_in);
}

void apply(KernelSwitches& s, const std::string& text, const std::string& part) {
  if (part == "candidates") {
    for (int f = 0; f < static_cast<int>(std::size(kFamilies)); ++f) set(s, f, 1);
    return;
  }
  const size_t eq = part.find('=');
  if (eq == std::string::npos) refuse(text, part);
  const std::string family = part.substr(0, eq), path = part.substr(eq + 1);
  for (int f = 0; f < static_cast<int>(std::size(kFamilies)); ++f) {
    if (family != kFamilies[f].name) continue;
    const int p = path_index(kFamilies[f], path);
    if (p < 0) refuse(text, part);
    set(s, f, p);
    return;
  }
  refuse(text, part);
}

}  // namespace

KernelSwitches parse_kernel_switches(const std::string& text) {
  KernelSwitches s;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, comma - start);
    if (!part.empty()) apply(s, text, part);
    start = comma + 1;
  }
  return s;
}

KernelSwitches kernel_switches_from_environment() {
  const char* text = std::getenv(kVariable);
  return text ? parse_kernel_switches(text) : KernelSwitches{};
}

std::string describe(const KernelSwitches& switches) {
  std::string text;
  for (int f = 0; f < static_cast<int>(std::size(kFamilies)); ++f)
    text += std::string(text.empty() ? "" : ",") + kFamilies[f].name + "=" +
            kFamilies[f].paths[path_of(switches, f)];
  return text;
}

std::string describe(const CandidateCalls& calls) {
  static_assert(static_cast<size_t>(CandidateCalls::kFamilies) == std::size(kFamilies));
  std::string text;
  for (int f = 0; f < CandidateCalls::kFamilies; ++f) {
    if (calls.asked[f] == 0) continue;
    text += std::string(text.empty() ? "" : ", ") + kFamilies[f].name + "=" +
            kFamilies[f].paths[1] + " " + std::to_string(calls.ran[f]) + " of " +
            std::to_string(calls.asked[f]) + " calls";
  }
  return text;
}

}  // namespace mpiformer
