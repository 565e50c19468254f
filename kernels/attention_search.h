// cuDNN attention's timed plan search (kernels/cuda/attention_cudnn.cpp,
// MPIFORMER_KERNELS attention_plan=timed), the parts that need no GPU:
// which plan a graph runs once searched, and what bench reports of the
// searches. Tested on the CPU (tests/gemm_search_test.cpp).
//
// A cuDNN graph's heuristics may offer several execution plans (engines
// and their knobs: tile sizes, pipelining). Without the search a graph
// runs the first one that builds, the heuristic's choice. With it, each
// graph's plans are timed once, on its second call and that call's own
// operands (a graph met once costs nothing), and the fastest runs from
// then on. As for the GEMMs (kernels/gemm_search.h), deterministic runs
// keep the heuristic plan's bits: a plan whose outputs' digest differs
// from the first's is set aside untimed.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/gemm_search.h"

namespace mpiformer::attention_search {

// The call of a graph that searches its plans.
constexpr int kSearchOnCall = 2;
// Each plan's timed runs, after an untimed one (whose outputs give the digest).
constexpr int kTimedRuns = 3;

using gemm_search::Trial;

// The plan a searched graph runs: plans[winner], where trials[i] is the
// trial of plans[i] (the heuristic's plan first); plans[0] where none won
// (gemm_search::winner's -1).
inline long long chosen_plan(const std::vector<long long>& plans, int winner) {
  return winner >= 0 ? plans[static_cast<size_t>(winner)] : plans.front();
}

// Every search of a run, for bench's "attention_search".
struct Tally {
  int graphs_timed = 0;    // graphs with more than one plan that ran, timed
  int single_plan = 0;     // graphs searched with one plan that ran: nothing to time
  int first_kept = 0;      // of the timed graphs, those whose first plan won
  int plans = 0;           // the plans the timed graphs ran
  int other_bits = 0;      // of those, set aside for other bits
  int over_workspace = 0;  // plans not run: more workspace than the reserved
  double first_ms = 0.0;   // the timed graphs' first plans, kTimedRuns runs each, summed
  double winner_ms = 0.0;  // their winners, the same way

  // One graph's search: its trials, the heuristic's plan first, and the
  // winner (gemm_search::winner over them); skipped: plans it did not run
  // for their workspace.
  void add(const std::vector<Trial>& trials, int winner, bool same_bits, int skipped) {
    over_workspace += skipped;
    int ran = 0;
    for (const Trial& t : trials) ran += t.ran ? 1 : 0;
    if (ran < 2 || winner < 0) {
      ++single_plan;
      return;
    }
    ++graphs_timed;
    plans += ran;
    for (size_t i = 1; i < trials.size(); ++i)
      if (same_bits && gemm_search::other_bits(trials, i)) ++other_bits;
    if (winner == 0) ++first_kept;
    first_ms += trials[0].ms;
    winner_ms += trials[static_cast<size_t>(winner)].ms;
  }

  // "timed 4 cuDNN attention graphs of 11 plans in all, keeping the bits of
  // each one's first plan (2 set aside for other bits); the first was
  // fastest in 1; the winners 0.912 ms against the first plans' 1.004
  // (0.908); 2 graphs had one plan; 1 plan over the reserved workspace"
  // (", any bits" where they need not match), or empty when no graph was
  // searched.
  std::string describe(bool same_bits) const {
    if (graphs_timed == 0 && single_plan == 0) return "";
    std::string text;
    char buf[256];
    if (graphs_timed > 0) {
      std::snprintf(buf, sizeof buf, "timed %d cuDNN attention graph%s of %d plans in all",
                    graphs_timed, graphs_timed == 1 ? "" : "s", plans);
      text = buf;
      if (same_bits) {
        std::snprintf(buf, sizeof buf,
                      ", keeping the bits of each one's first plan (%d set aside for other bits)",
                      other_bits);
        text += buf;
      } else {
        text += ", any bits";
      }
      std::snprintf(buf, sizeof buf,
                    "; the first was fastest in %d; the winners %.3f ms against the first plans' "
                    "%.3f (%.3f)",
                    first_kept, winner_ms, first_ms, first_ms > 0 ? winner_ms / first_ms : 0.0);
      text += buf;
    }
    if (single_plan > 0) {
      std::snprintf(buf, sizeof buf, "%s%d cuDNN attention graph%s had one plan",
                    text.empty() ? "" : "; ", single_plan, single_plan == 1 ? "" : "s");
      text += buf;
    }
    if (over_workspace > 0) {
      std::snprintf(buf, sizeof buf, "; %d plan%s over the reserved workspace", over_workspace,
                    over_workspace == 1 ? "" : "s");
      text += buf;
    }
    return text;
  }
};

}  // namespace mpiformer::attention_search
