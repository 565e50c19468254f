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
// from the first's is set aside untimed. A graph serves batches of many
// lengths, and two plans may agree on one (every sequence within one of
// their tiles, say) and not on another, so the winner's bits are checked
// against the heuristic plan's again on the first batch of other lengths
// and on each batch longer than any before, and where they differ the
// graph goes back to the heuristic's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/gemm_search.h"

namespace mpiformer::attention_search {

// The call of a graph that searches its plans.
constexpr int kSearchOnCall = 2;
// Each plan's timed runs, after an untimed one (whose outputs give the digest).
constexpr int kTimedRuns = 3;
// Graphs searched at most in a run; the rest keep the heuristic's plan.
constexpr int kMostSearches = 64;

using gemm_search::Trial;

// The plan a searched graph runs: plans[winner], where trials[i] is the
// trial of plans[i] (the heuristic's plan first); plans[0] where none won
// (gemm_search::winner's -1).
inline int64_t chosen_plan(const std::vector<int64_t>& plans, int winner) {
  return winner >= 0 ? plans[static_cast<size_t>(winner)] : plans.front();
}

// A batch's lengths, as far as a plan's bits may depend on them: a hash of
// its counts and longest sequences (a collision only skips a check), and
// its longest sequence.
struct BatchLengths {
  uint64_t hash = 0;
  int longest = 0;
};

// When a searched graph that runs another plan than the heuristic's checks
// its bits against the heuristic plan's again (deterministic runs): on the
// first batch of other lengths than the search's, and on every batch
// longer than all those seen so far (a sequence over more tiles than any
// before is where two plans' orders of summing part).
class BitsChecks {
 public:
  // The search's batch; same_bits false: the bits need not match, and no
  // check is ever due.
  void searched(const BatchLengths& batch, bool same_bits) {
    needed_ = same_bits;
    searched_hash_ = batch.hash;
    other_lengths_seen_ = false;
    longest_seen_ = batch.longest;
  }
  bool due(const BatchLengths& batch) const {
    return needed_ && ((!other_lengths_seen_ && batch.hash != searched_hash_) ||
                       batch.longest > longest_seen_);
  }
  // A batch whose check passed.
  void passed(const BatchLengths& batch) {
    other_lengths_seen_ = other_lengths_seen_ || batch.hash != searched_hash_;
    longest_seen_ = std::max(longest_seen_, batch.longest);
  }
  // The heuristic's plan is back: nothing more to check.
  void stop() { needed_ = false; }

 private:
  bool needed_ = false;
  uint64_t searched_hash_ = 0;
  bool other_lengths_seen_ = false;
  int longest_seen_ = 0;
};

// Whether a graph's search failed, and the graph keeps the heuristic's
// plan: that plan did not run, or was not timed (a run failed), or no plan
// qualified (trials[i] as for chosen_plan).
inline bool search_failed(const std::vector<Trial>& trials, int winner) {
  return trials.empty() || !trials[0].ran || trials[0].ms < 0.0f || winner < 0;
}

// Every search of a run, for bench's "attention_search".
struct Tally {
  int graphs_timed = 0;    // graphs with more than one plan that ran, timed
  int single_plan = 0;     // graphs searched with one plan that ran: nothing to time
  int failed = 0;          // searches where the heuristic's plan did not run or was not timed
  int first_kept = 0;      // of the timed graphs, those whose first plan won
  int plans = 0;           // the plans the timed graphs ran
  int other_bits = 0;      // of those, set aside for other bits
  int not_built = 0;       // plans not built, or with more workspace than the reserved
  int rejected = 0;        // winners whose bits differed from the first's on a later batch
  int past_most = 0;       // graphs past kMostSearches, not searched
  int any_bits = 0;        // searches where the bits need not match (--deterministic false)
  double first_ms = 0.0;   // the timed graphs' first plans, ms a run, summed
  double winner_ms = 0.0;  // their winners, the same way

  int searches() const { return graphs_timed + single_plan + failed; }

  // One graph's search: its trials, the heuristic's plan first, and the
  // winner (gemm_search::winner over them); not_built: plans it could
  // not run for that.
  void add(const std::vector<Trial>& trials, int winner, bool same_bits, int not_built_plans) {
    not_built += not_built_plans;
    int ran = 0;
    for (const Trial& t : trials) ran += t.ran ? 1 : 0;
    if (search_failed(trials, winner)) {
      ++failed;
      return;
    }
    if (!same_bits) ++any_bits;
    if (ran < 2) {
      ++single_plan;
      return;
    }
    ++graphs_timed;
    plans += ran;
    for (size_t i = 1; i < trials.size(); ++i)
      if (same_bits && gemm_search::other_bits(trials, i)) ++other_bits;
    if (winner == 0) ++first_kept;
    first_ms += trials[0].ms / kTimedRuns;
    winner_ms += trials[static_cast<size_t>(winner)].ms / kTimedRuns;
  }

  // "timed 4 cuDNN attention graphs of 11 plans in all, keeping the bits
  // of each one's first plan (2 set aside for other bits); the first was
  // fastest in 1; the winners 0.304 ms a run against the first plans'
  // 0.335 (0.908); 2 graphs had one plan" and, where there are any, the
  // failed searches, the plans not built, the winners whose bits differed
  // later, the graphs not searched; ", any bits" where the bits need not
  // match; empty when no graph was searched.
  std::string describe() const {
    std::string text;
    if (graphs_timed > 0) {
      text = "timed " + count(graphs_timed, "cuDNN attention graph") + " of " +
             std::to_string(plans) + " plans in all";
      text += any_bits > 0 ? ", any bits"
                           : ", keeping the bits of each one's first plan (" +
                                 std::to_string(other_bits) + " set aside for other bits)";
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "; the first was fastest in %d; the winners %.3f ms a run against the first "
                    "plans' %.3f (%.3f)",
                    first_kept, winner_ms, first_ms, first_ms > 0 ? winner_ms / first_ms : 0.0);
      text += buf;
    }
    append(text, single_plan, count(single_plan, "cuDNN attention graph") + " had one plan");
    append(text, failed,
           count(failed, "search", "searches") + " failed (the heuristic's plan kept)");
    append(text, not_built, count(not_built, "plan") + " not built or over the reserved workspace");
    append(text, rejected,
           count(rejected, "winner") +
               " gave other bits on a later batch (the heuristic's plan back)");
    append(text, past_most, count(past_most, "graph") + " past the most searches");
    return text;
  }

 private:
  // "1 graph", "2 graphs" (plural: the noun's, where not noun + "s").
  static std::string count(int n, const std::string& noun, const std::string& plural = "") {
    return std::to_string(n) + " " + (n == 1 ? noun : plural.empty() ? noun + "s" : plural);
  }
  static void append(std::string& text, int n, const std::string& part) {
    if (n > 0) text += (text.empty() ? "" : "; ") + part;
  }
};

}  // namespace mpiformer::attention_search
