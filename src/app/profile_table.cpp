#include "src/app/profile_table.h"

#include <cstdio>
#include <string>

namespace mpiformer {

double outside_ops_ms(const std::vector<double>& ms, double step_ms) {
  double ops_ms = 0.0;
  for (double m : ms) ops_ms += m;
  return step_ms - ops_ms;
}

std::string call_rate(const ProfiledOps::CallTotal& total) {
  if (total.flops <= 0.0 || total.ms <= 0.0) return "";
  const double tflops = total.flops / total.ms * 1e-9;
  char text[48];
  std::snprintf(text, sizeof text, tflops >= 100.0 ? ": %.0f TFLOP/s" : ": %.3g TFLOP/s", tflops);
  return text;
}

void print_profile(const std::vector<double>& ms, const std::vector<ProfiledOps::CallTotal>& calls,
                   long long steps, double step_ms, const char* outside) {
  const double other_ms = outside_ops_ms(ms, step_ms);
  const auto share = [&](double part) { return step_ms > 0 ? 100.0 * part / step_ms : 0.0; };
  std::fprintf(stderr, "time per step by op family (device time, %.2f ms per step):\n", step_ms);
  for (int f = 0; f < static_cast<int>(OpFamily::kCount); ++f) {
    std::fprintf(stderr, "  %-12s %9.3f ms  %5.1f%%\n", to_string(static_cast<OpFamily>(f)), ms[f],
                 share(ms[f]));
  }
  std::fprintf(stderr, "  %-12s %9.3f ms  %5.1f%%  (%s)\n", "other", other_ms, share(other_ms),
               outside);
  // Where a family's time goes: its costliest calls by sizes.
  constexpr size_t kTopCalls = 16;
  std::fprintf(stderr, "costliest op calls (per step: ms, calls, share):\n");
  for (size_t i = 0; i < calls.size() && i < kTopCalls; ++i) {
    const double per_step = steps > 0 ? calls[i].ms / steps : 0.0;
    std::fprintf(stderr, "  %9.3f ms %6.1f  %5.1f%%  %s%s\n", per_step,
                 steps > 0 ? static_cast<double>(calls[i].count) / steps : 0.0, share(per_step),
                 calls[i].call.c_str(), call_rate(calls[i]).c_str());
  }
  std::fflush(stderr);
}

}  // namespace mpiformer
