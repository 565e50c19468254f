// bleu_tool [--tokens] [--full] HYP REF: the corpus BLEU of the hypotheses
// in HYP against the references in REF (line-aligned, UTF-8), for the
// end-to-end comparison with sacreBLEU (tests/e2e/bleu_sacrebleu.sh).
// Prints the score with 6 decimals; --full prints it with 17 significant
// digits and then the counts and the signature, one "name values" per line;
// --tokens first prints the 13a tokenization of every line of HYP, then of
// every line of REF, one per line.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "src/scoring/bleu.h"

namespace {

// The lines of a file, split at '\n' only (as sacreBLEU reads them); false
// when it cannot be read.
bool read_lines(const std::string& path, std::vector<std::string>& lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return !in.bad();
}

void print_four(const char* name, const int64_t* v) {
  std::printf("%s %lld %lld %lld %lld\n", name, static_cast<long long>(v[0]),
              static_cast<long long>(v[1]), static_cast<long long>(v[2]),
              static_cast<long long>(v[3]));
}

}  // namespace

int main(int argc, char** argv) {
  bool tokens = false, full = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tokens")
      tokens = true;
    else if (arg == "--full")
      full = true;
    else
      files.push_back(arg);
  }
  if (files.size() != 2) {
    std::cerr << "usage: bleu_tool [--tokens] [--full] HYP REF\n";
    return 2;
  }
  std::vector<std::string> hyps, refs;
  for (int k = 0; k < 2; ++k) {
    if (!read_lines(files[k], k == 0 ? hyps : refs)) {
      std::cerr << "bleu_tool: cannot read " << files[k] << '\n';
      return 1;
    }
  }
  if (hyps.size() != refs.size()) {
    std::cerr << "bleu_tool: " << hyps.size() << " hypotheses but " << refs.size()
              << " references\n";
    return 1;
  }

  if (tokens) {
    for (const std::string& line : hyps) std::printf("%s\n", mpiformer::tokenize_13a(line).c_str());
    for (const std::string& line : refs) std::printf("%s\n", mpiformer::tokenize_13a(line).c_str());
  }
  mpiformer::BleuCounts corpus;
  for (size_t i = 0; i < hyps.size(); ++i) corpus += mpiformer::count_sentence(hyps[i], refs[i]);
  const double bleu = mpiformer::bleu_score(corpus);
  if (!full) {
    std::printf("%.6f\n", bleu);
    return 0;
  }
  std::printf("bleu %.17g\n", bleu);
  print_four("matches", corpus.matches);
  print_four("totals", corpus.totals);
  std::printf("hyp_length %lld\nref_length %lld\nsignature %s\n",
              static_cast<long long>(corpus.hyp_length), static_cast<long long>(corpus.ref_length),
              mpiformer::bleu_signature());
  return 0;
}
