// How ranks agree on an error: the one idiom every command uses. A step runs
// (on every rank, or on rank 0 alone), a fault it throws becomes a Verdict
// (an exit code and the line that explains it), each rank prints its own
// line, and one collective tells every rank the largest code. So no rank
// ever waits in a later collective for a rank that has given up, and every
// rank leaves with the same exit code.
#pragma once

#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "src/core/error.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

// An exit code (0: go on) and the line that explains it.
struct Verdict {
  int code = 0;
  std::string message;
};

// The collective: prints this rank's message on stderr, and returns on every
// rank the largest code of all ranks' verdicts.
int agree(const Communicator& comm, const Verdict& mine);

// As agree, but only the lowest rank with a fault prints its line: one line
// for all, however many ranks met the fault (a full disk meets them all).
int agree_first(const Communicator& comm, Verdict mine);

// Rank 0's verdict, for every rank (the other ranks' verdicts are ignored).
int agree_on(const Communicator& comm, const Verdict& verdict);

// Whom a step's exception blames, and so how its line reads and its code.
enum class Blame {
  kOfRank,     // any: "[rank r] what", exit 1
  kOfInput,    // any: "mpiformer COMMAND: what", exit 2 (checking the given flags and files)
  kOfCommand,  // any: "mpiformer COMMAND: what", exit 1 (the command's one job failed)
  kByType,     // UsageError as kOfInput; CommandError "mpiformer what", exit 1; others as kOfRank
};

// Runs `step` here and turns what it throws into a verdict. A step that
// returns an int gives its code (0 without a fault).
template <class Fn>
Verdict attempt(const Communicator& comm, Fn&& step, Blame blame = Blame::kOfRank,
                const std::string& command = "") {
  const std::string rank = "[rank " + std::to_string(comm.rank()) + "] ";
  const std::string input = "mpiformer " + command + ": ";
  // kByType's reading of a fault is `typed` (its code and prefix).
  const auto told = [&](const std::string& what, Verdict typed) -> Verdict {
    switch (blame) {
      case Blame::kOfRank:
        return {kExitFailure, rank + what};
      case Blame::kOfInput:
        return {kExitUsage, input + what};
      case Blame::kOfCommand:
        return {kExitFailure, input + what};
      case Blame::kByType:
        break;
    }
    return {typed.code, typed.message + what};
  };
  try {
    if constexpr (std::is_same_v<decltype(step()), int>) {
      return {step(), ""};
    } else {
      step();
      return {};
    }
  } catch (const UsageError& e) {
    return told(e.what(), {kExitUsage, input});
  } catch (const CommandError& e) {
    return told(e.what(), {kExitFailure, "mpiformer "});
  } catch (const std::exception& e) {
    return told(*e.what() ? e.what() : "unknown error", {kExitFailure, rank});
  }
}

// Runs `what` on every rank; true on every rank when it succeeded on all.
// The lowest rank that failed prints "[rank r] message".
template <class Fn>
bool agreed(const Communicator& comm, Fn&& what) {
  return agree_first(comm, attempt(comm, std::forward<Fn>(what))) == 0;
}

// Runs `check` of the given flags and files on every rank; returns the agreed
// exit code (0: go on). Faults are blamed kByType. The ranks check the same
// inputs and so refuse alike: the lowest rank with a refusal (UsageError,
// exit 2) prints it once for all, not one line per rank.
template <class Fn>
int agree_on_inputs(const Communicator& comm, Fn&& check, const std::string& command) {
  Verdict mine = attempt(comm, std::forward<Fn>(check), Blame::kByType, command);
  const bool refused = mine.code == kExitUsage;
  const int speaker = comm.min_with_rank(refused ? 0 : 1).second;  // a collective
  if (refused && comm.rank() != speaker) mine.message.clear();
  return agree(comm, mine);
}

// Runs `step` on rank 0 alone; every rank learns the exit code (0: go on).
template <class Fn>
int agree_on_root(const Communicator& comm, Fn&& step, Blame blame, const std::string& command) {
  Verdict verdict;
  if (comm.is_root()) verdict = attempt(comm, std::forward<Fn>(step), blame, command);
  return agree(comm, verdict);
}

}  // namespace mpiformer
