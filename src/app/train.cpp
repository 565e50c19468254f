// `mpiformer train`: the Trainer of src/train/ runs the whole loop.
#include "src/app/commands.h"
#include "src/train/trainer.h"

namespace mpiformer {

int run_train(const TrainConfig& cfg, Communicator& comm) {
  Trainer trainer(cfg, comm);
  return trainer.run();
}

}  // namespace mpiformer
