// Reading prepare's text and carving it into splits (corpus.h): the lines of
// each file, the usable ones among them, how many each held-out split takes
// from the end of the input, classify's training labels, and the report of
// it all.
#include "src/app/prepare/corpus.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <utility>

namespace mpiformer::prepare {
namespace {

// Every line of a text file, without its line ending (LF or CRLF).
std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  if (in.bad()) throw std::runtime_error(path + ": read error");
  return lines;
}

// files.target: seq2seq's targets, or classify's labels.
Text text_of(const PrepareConfig& cfg, const SplitFiles& files) {
  Text t;
  t.input_path = files.input;
  if (cfg.kind == "seq2seq") t.target_path = files.target;
  if (cfg.kind == "classify") t.labels_path = files.target;
  return t;
}

// Reads a text; its usable sequences are found when both sides have the
// same number of lines (a mismatch is refused by validate_text).
void read_text(Text* t) {
  t->input = read_lines(t->input_path);
  if (t->seq2seq()) t->target = read_lines(t->target_path);
  if (!t->labels_path.empty()) t->labels = read_lines(t->labels_path);
  if (t->seq2seq() && t->target.size() != t->input.size()) return;
  for (size_t i = 0; i < t->input.size(); ++i) {
    if (!is_blank(t->input[i]) && !(t->seq2seq() && is_blank(t->target[i]))) {
      t->sequences.push_back(i);
    } else {
      ++t->blank;
    }
  }
}

// How many usable lines each split not given as files takes from the end of
// the input: as many as asked, but at most a tenth, so training always keeps
// most of them.
void carve(const PrepareConfig& cfg, Corpus* c) {
  const size_t most = c->main.sequences.size() / kHoldOut;
  if (!cfg.valid.given()) c->valid_carved = std::min(static_cast<size_t>(cfg.valid_lines), most);
  if (!cfg.test.given()) c->test_carved = std::min(static_cast<size_t>(cfg.test_lines), most);
}

// "1,000 (kjv.txt lines 29103-30102)"
std::string describe_span(const Span& span) {
  return grouped(static_cast<int64_t>(span.size())) + " (" + span.origin() + ")";
}

}  // namespace

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\v\f") == std::string::npos;
}

Corpus corpus_of(const PrepareConfig& cfg) {
  Corpus corpus;
  corpus.main = text_of(cfg, {cfg.input, cfg.kind == "classify" ? cfg.labels : cfg.target});
  if (cfg.valid.given()) corpus.valid_file = text_of(cfg, cfg.valid);
  if (cfg.test.given()) corpus.test_file = text_of(cfg, cfg.test);
  return corpus;
}

void read_corpus(const PrepareConfig& cfg, bool root, Corpus* c) {
  read_text(&c->main);
  carve(cfg, c);
  if (!root) return;
  if (cfg.valid.given()) read_text(&c->valid_file);
  if (cfg.test.given()) read_text(&c->test_file);
}

size_t too_long_to_train(const Span& train) {
  const Text& t = *train.text;
  size_t n = 0;
  for (size_t s = train.begin; s < train.end; ++s) {
    const size_t line = t.sequences[s];
    n += t.input[line].size() > kLongestTrainedLine ||
         (t.seq2seq() && t.target[line].size() > kLongestTrainedLine);
  }
  return n;
}

LabelVocabulary training_labels(const Corpus& c) {
  LabelVocabulary vocabulary;
  const Span train = c.train();
  for (size_t s = train.begin; s < train.end; ++s) {
    vocabulary.count(parse_label_line(c.main.labels[c.main.sequences[s]]));
  }
  vocabulary.finish();
  return vocabulary;
}

void report_corpus(const Corpus& c, Clock::time_point start, const Say& say) {
  const Text& t = c.main;
  std::string splits =
      "  splits: train " + describe_span(c.train()) + ", valid " + describe_span(c.valid());
  if (c.test().text) splits += ", test " + describe_span(c.test());
  say("read " + t.name() + ": " + grouped(static_cast<int64_t>(t.input.size())) + " " +
      t.units(t.input.size()) + ", " + grouped(static_cast<int64_t>(t.sequences.size())) +
      " usable (" + format_seconds(seconds_since(start)) + ")");
  say(splits);
}

}  // namespace mpiformer::prepare
