// The signals that stop a run at the next step boundary, with a checkpoint:
// SIGTERM (scancel, preemption, a time limit; mpirun passes its own TERM or
// INT on to the ranks as TERM), SIGUSR1 (SLURM's warning before the limit,
// forwarded by srun and mpirun), SIGINT (Ctrl-C) and SIGHUP (the terminal
// closed, the ssh session dropped; left ignored under nohup). A handler only records
// the signal; the loop agrees on it over the ranks at the next step boundary.
// A second SIGINT ends the process at once, as Ctrl-C does elsewhere.
// While a run trains, SIGPIPE is ignored, and after SIGTERM, SIGINT or
// SIGHUP output to a pipe no longer blocks (stop_signals.cpp says why).
#pragma once

#include <signal.h>

namespace mpiformer {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The last stop signal received, 0 if none.
  static int pending();
  // "SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP".
  static const char* name(int signal);

 private:
  struct sigaction saved_term_ {};
  struct sigaction saved_usr1_ {};
  struct sigaction saved_int_ {};
  struct sigaction saved_hup_ {};
  bool hup_handled_ = false;
  struct sigaction saved_pipe_ {};
};

}  // namespace mpiformer
