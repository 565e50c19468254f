// The op families' table that `bench --profile` and `generate --profile`
// print on stderr (stdout keeps a command's own output): the device time
// of a step by family, the step's time outside every op, and the costliest
// calls by sizes, with their TFLOP/s where the sizes tell their operations.
#pragma once

#include <string>
#include <vector>

#include "kernels/profiled_ops.h"

namespace mpiformer {

// The step's milliseconds outside every op family's: host work, waits, the
// all-reduce, the device idle between launches.  ms: per step, by OpFamily
double outside_ops_ms(const std::vector<double>& ms, double step_ms);

// ": 583 TFLOP/s", the rate of a call's operations over its time (device
// time: queued work included), or empty where call_flops does not tell
// them.
std::string call_rate(const ProfiledOps::CallTotal& total);

// The table of `steps` steps of step_ms each; ms: per step, by OpFamily;
// calls: over all the steps, the costliest first; outside: what the time
// outside the ops is made of ("host work, waits, all-reduce").
void print_profile(const std::vector<double>& ms, const std::vector<ProfiledOps::CallTotal>& calls,
                   long long steps, double step_ms, const char* outside);

}  // namespace mpiformer
