// How ranks agree on an error: the one idiom every command uses. A step runs
// (on every rank, or on rank 0 alone), a fault it throws becomes a Verdict
// (an exit code and the line that explains it), the chosen ranks print
// their lines, and one collective tells every rank the largest code. So no
// rank ever waits in a later collective for a rank that has given up, and
// every rank leaves with the same exit code. Three verbs:
//   attempt   runs a step on this rank and turns what it throws into a Verdict;
//   agree     (a collective) prints what the Speaker rule chooses and returns the largest code;
//   agree_on  (a collective) runs a step where the Speaker rule says, then agrees on it.
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

// Which ranks' lines are printed.
enum class Speaker {
  kEach,          // every rank with a line prints it
  kFirst,         // the lowest rank with a fault, for all (a full disk meets them all)
  kFirstRefusal,  // a refusal (exit 2) once, by the lowest rank refusing; other faults each
  kRoot,          // rank 0's verdict is every rank's; agree_on runs the step on rank 0 alone
};

// The collective: prints the lines `speaker` chooses on stderr, and returns
// on every rank the largest code of the verdicts it counts.
int agree(const Communicator& comm, Verdict mine, Speaker speaker = Speaker::kEach);

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

// Runs `step` on every rank (on rank 0 alone under Speaker::kRoot), blames
// its faults as `blame` says, and returns the agreed exit code (0: go on).
template <class Fn>
int agree_on(const Communicator& comm, Fn&& step, Speaker speaker = Speaker::kFirst,
             Blame blame = Blame::kOfRank, const std::string& command = "") {
  Verdict mine;
  if (speaker != Speaker::kRoot || comm.is_root())
    mine = attempt(comm, std::forward<Fn>(step), blame, command);
  return agree(comm, mine, speaker);
}

}  // namespace mpiformer
