#include "src/train/stop_signals.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include "src/io/stop_cleanup.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

namespace {

volatile std::sig_atomic_t stop_signal = 0;

// A launcher that is ending the job (mpirun after its own SIGTERM or
// SIGINT) stops reading the ranks' output: a rank blocked writing a
// progress line into the full pipe or pseudo-terminal would never reach the
// step boundary. From a stop on, output there never blocks; a line that
// does not fit is lost, the checkpoint is not. Chosen when the handlers are
// installed (a terminal only under mpirun: a user's own terminal is shared
// with the shell), restored when they are removed.
constexpr int kOutputs[2] = {STDOUT_FILENO, STDERR_FILENO};
int unblock_flags[2] = {-1, -1};  // the fd's flags to restore; -1: leave the fd alone

void choose_outputs_to_unblock() {
  const bool under_mpirun = Communicator::started_by_mpirun();
  for (int i = 0; i < 2; ++i) {
    struct stat info {};
    unblock_flags[i] = -1;
    if (::fstat(kOutputs[i], &info) != 0) continue;
    const bool pipe = S_ISFIFO(info.st_mode) || S_ISSOCK(info.st_mode);
    if (pipe || (under_mpirun && ::isatty(kOutputs[i]))) {
      unblock_flags[i] = ::fcntl(kOutputs[i], F_GETFL);
    }
  }
}

// Async-signal-safe: fcntl only.
void stop_blocking_on_outputs() {
  for (int i = 0; i < 2; ++i) {
    if (unblock_flags[i] >= 0) ::fcntl(kOutputs[i], F_SETFL, unblock_flags[i] | O_NONBLOCK);
  }
}

void restore_outputs() {
  for (int i = 0; i < 2; ++i) {
    if (unblock_flags[i] >= 0) ::fcntl(kOutputs[i], F_SETFL, unblock_flags[i]);
    unblock_flags[i] = -1;
  }
}

extern "C" void note_stop_signal(int signal) {
  // Ctrl-C twice: the user does not want to wait for the step boundary.
  if (signal == SIGINT && stop_signal == SIGINT) {
    ::signal(SIGINT, SIG_DFL);
    ::raise(SIGINT);
  }
  if (signal != SIGUSR1) stop_blocking_on_outputs();
  stop_signal = signal;
}

}  // namespace

StopSignals::StopSignals() {
  stop_signal = 0;
  choose_outputs_to_unblock();
  struct sigaction action {};
  action.sa_handler = note_stop_signal;
  action.sa_flags = SA_RESTART;  // MPI and file calls carry on; the loop looks at the flag
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, &saved_term_);
  sigaction(SIGUSR1, &action, &saved_usr1_);
  sigaction(SIGINT, &action, &saved_int_);
  // A hang-up loses the run since its last checkpoint unless it stops like
  // TERM; but nohup asked for hang-ups to be ignored.
  struct sigaction hup {};
  sigaction(SIGHUP, nullptr, &hup);
  hup_handled_ = hup.sa_handler != SIG_IGN && sigaction(SIGHUP, &action, &saved_hup_) == 0;
  // A reader of the output that went away (a pipe to `tee` ended by the
  // same Ctrl-C) must not end the run before its checkpoint: writes fail
  // with EPIPE instead.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &saved_pipe_);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &saved_term_, nullptr);
  sigaction(SIGUSR1, &saved_usr1_, nullptr);
  sigaction(SIGINT, &saved_int_, nullptr);
  if (hup_handled_) sigaction(SIGHUP, &saved_hup_, nullptr);
  sigaction(SIGPIPE, &saved_pipe_, nullptr);
  restore_outputs();
}

int StopSignals::pending() {
  return stop_signal;
}

const char* StopSignals::name(int signal) {
  return stop_signal_name(signal);
}

}  // namespace mpiformer
