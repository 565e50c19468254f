// `mpiformer average`: rank 0 averages the checkpoints (src/io/checkpoint_average.h);
// under mpirun the other ranks only wait for its verdict.
#include <cstdio>
#include <string>
#include <vector>

#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/core/error.h"
#include "src/core/run_log.h"
#include "src/io/checkpoint.h"
#include "src/io/checkpoint_average.h"
#include "src/io/stop_cleanup.h"
#include "src/parallel/agreement.h"

namespace mpiformer {

namespace {

// RUNDIR's newest `last` checkpoints, newest first.
std::vector<std::string> newest_checkpoints(const std::string& rundir, int last) {
  const std::vector<std::string> found = list_checkpoints(rundir);
  if (found.size() < static_cast<size_t>(last)) {
    usage_error("--last", std::to_string(last) + ": " + rundir + "/checkpoints holds " +
                              std::to_string(found.size()) + " checkpoint(s) (step_*.h5)");
  }
  return std::vector<std::string>(found.begin(), found.begin() + last);
}

// Two checkpoints' models, as their config attributes describe them.
std::string config_model_difference(const std::string& this_path, const std::string& this_ini,
                                    const std::string& newest_path, const std::string& newest_ini) {
  return model_difference(train_config_from_ini(this_ini, this_path).model,
                          train_config_from_ini(newest_ini, newest_path).model);
}

}  // namespace

int run_average(const AverageConfig& cfg, Communicator& comm) {
  const ExitOnStop stop(comm.is_root() ? "mpiformer average: stopped by " : "",
                        comm.is_root() ? "; " + cfg.out + " was not written" : "");
  std::string line;
  const int code = agree_on(
      comm,
      [&] {
        const std::vector<std::string> inputs =
            cfg.run_dir.empty() ? cfg.inputs : newest_checkpoints(cfg.run_dir, cfg.last);
        try {
          line = describe_average(average_checkpoints(inputs, cfg.out, config_model_difference));
        } catch (const AverageInputError& e) {
          throw UsageError(e.what());  // the inputs' fault: exit 2
        }
      },
      Speaker::kRoot, Blame::kByType, "average");
  if (code == 0 && comm.is_root()) {
    say(stdout, "mpiformer average: %s\n", line.c_str());
    std::fflush(stdout);
  }
  return code;
}

}  // namespace mpiformer
