// `mpiformer train`: the Trainer of src/train/ runs the whole loop.
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/train/trainer.h"

namespace mpiformer {

int run_train(const TrainConfig& cfg, Communicator& comm) {
  Trainer trainer(cfg, comm, ConfigText{train_config_ini, train_config_from_ini});
  return trainer.run();
}

}  // namespace mpiformer
