// `mpiformer train`: the trainer of src/train/ runs the whole loop.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/train/trainer.h"

namespace mpiformer {

namespace {

// An integer from the environment, 0 when unset.
int64_t env_integer(const char* name) {
  const char* text = std::getenv(name);
  return text ? std::atoll(text) : 0;
}

// The end-to-end tests' faults (tests/e2e/faults.sh, faults_checkpoint.sh, resume.sh,
// precision.sh),
// read once here; the trainer only sees the struct.
FaultInjection faults_from_environment() {
  FaultInjection f;
  // The stop tests: the last rank signals itself after this step.
  f.signal_after_step = env_integer("MPIFORMER_TEST_SIGNAL_AFTER_STEP");
  // The loss-scaling tests: the last rank's gradients overflow at this step.
  f.overflow_at_step = env_integer("MPIFORMER_TEST_OVERFLOW_AT_STEP");
  // The divergence tests: the last rank's gradients are NaN at step S
  // (MPIFORMER_TEST_NAN_AT_STEP=S) or at the N steps from S (S:N).
  f.nan_at_step = env_integer("MPIFORMER_TEST_NAN_AT_STEP");
  if (const char* text = std::getenv("MPIFORMER_TEST_NAN_AT_STEP")) {
    const char* colon = std::strchr(text, ':');
    f.nan_steps = colon ? std::atoll(colon + 1) : 1;
  }
  // The divergence tests: check as a GPU step in fp32 or bf16 does.
  f.deferred_divergence_check = env_integer("MPIFORMER_TEST_DEFERRED_DIVERGENCE_CHECK") != 0;
  // The checkpoint tests: rank R fails in the middle of the collective write
  // of step S's checkpoint (MPIFORMER_TEST_FAIL_IN_CHECKPOINT=S:R, R 0 when left out).
  if (const char* text = std::getenv("MPIFORMER_TEST_FAIL_IN_CHECKPOINT")) {
    f.fail_in_checkpoint_step = std::atoll(text);
    const char* colon = std::strchr(text, ':');
    f.fail_in_checkpoint_rank = colon ? std::atoi(colon + 1) : 0;
  }
  // The crash tests: rank 0 kills itself in the middle of the write of step
  // S's checkpoint (MPIFORMER_TEST_KILL_IN_CHECKPOINT=S).
  if (const char* text = std::getenv("MPIFORMER_TEST_KILL_IN_CHECKPOINT"); text && *text) {
    f.kill_in_checkpoint_step = std::atoll(text);
  }
  return f;
}

}  // namespace

int run_train(const TrainConfig& cfg, Communicator& comm) {
  return train(cfg, comm, ConfigText{train_config_ini, train_config_from_ini},
               faults_from_environment());
}

}  // namespace mpiformer
