#include "src/train/final_average.h"

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "src/core/run_log.h"
#include "src/io/checkpoint.h"
#include "src/io/checkpoint_average.h"
#include "src/parallel/agreement.h"

namespace mpiformer {

int write_final_average(const TrainConfig& cfg, const Communicator& comm,
                        const ConfigText& config_text) {
  const int asked = cfg.average_checkpoints;
  std::string line;
  const int code = agree_on(
      comm,
      [&] {
        std::vector<std::string> inputs = list_checkpoints(cfg.out_dir);  // newest first
        if (inputs.size() > static_cast<size_t>(asked)) inputs.resize(asked);
        const std::string out = (std::filesystem::path(cfg.out_dir) / "checkpoints" /
                                 ("average_last_" + std::to_string(asked) + ".h5"))
                                    .string();
        // One run's checkpoints are of one model, unless a resume changed a
        // flag that leaves the tensors as they were (--norm): then refuse.
        const auto differ = [&](const std::string& this_path, const std::string& this_ini,
                                const std::string& newest_path, const std::string& newest_ini) {
          return model_difference(config_text.read(this_ini, this_path).model,
                                  config_text.read(newest_ini, newest_path).model);
        };
        line = describe_average(average_checkpoints(inputs, out, differ));
        if (inputs.size() < static_cast<size_t>(asked)) {
          line += " (--average-checkpoints " + std::to_string(asked) + ", but the run has " +
                  std::to_string(inputs.size()) + ")";
        }
      },
      Speaker::kRoot, Blame::kOfRank, "train");
  if (code == 0 && comm.is_root()) {
    say(stdout, "average: %s\n", line.c_str());
    std::fflush(stdout);
  }
  return code;
}

}  // namespace mpiformer
