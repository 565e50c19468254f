// Test helper for the end-to-end prepare tests (not installed): prints the
// text a shard set holds, so a script can compare it with the input.
//
//   decode_shards DIR [source|target] [--split train|valid|test]
//       decodes every sequence of DIR/train-*.h5, DIR/valid-*.h5 and
//       DIR/test-*.h5 (or of the one split), in that order, with the
//       tokenizer the shards carry; one line per sequence. seq2seq sets: the
//       side to print (default target; lm has only one).
//   decode_shards DIR --normalize FILE
//       prints decode(encode(line)) for every non-blank line of FILE with the
//       same tokenizer: the input as SentencePiece's normalisation leaves it.
//
// Checks on the way that every shard carries the same header and tokenizer
// as DIR/tokenizer.model. Exit 0, or 1 with one line on stderr.
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/data/tokenizer.h"
#include "src/io/shard.h"

namespace {

using namespace mpiformer;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void print_sequences(const TokenSequences& side, const Tokenizer& tokenizer) {
  for (size_t i = 0; i < side.count(); ++i) {
    const std::vector<int> ids(side.tokens.begin() + static_cast<ptrdiff_t>(side.offsets[i]),
                               side.tokens.begin() + static_cast<ptrdiff_t>(side.offsets[i + 1]));
    std::cout << tokenizer.decode(ids) << '\n';
  }
}

int decode_set(const std::string& dir, const std::string& side, const std::string& split) {
  const std::string model_bytes = read_file(dir + "/tokenizer.model");
  const auto tokenizer = Tokenizer::from_bytes(model_bytes);
  if (list_shards(dir, "train").empty()) throw std::runtime_error(dir + ": no train-*.h5 shards");
  std::vector<std::string> paths;
  for (const char* name : {"train", "valid", "test"}) {
    if (!split.empty() && split != name) continue;
    for (const std::string& p : list_shards(dir, name)) paths.push_back(p);
  }
  if (paths.empty()) throw std::runtime_error(dir + ": no " + split + "-*.h5 shards");

  std::string kind;
  for (const std::string& path : paths) {
    const Shard shard = read_shard(path);
    const ShardHeader& h = shard.header;
    if (h.tokenizer != model_bytes) {
      throw std::runtime_error(path + ": its tokenizer differs from tokenizer.model");
    }
    if (h.vocab_size != tokenizer->vocab_size()) {
      throw std::runtime_error(path + ": vocab_size " + std::to_string(h.vocab_size) +
                               " but the tokenizer has " + std::to_string(tokenizer->vocab_size()));
    }
    if (h.special.pad != 0 || h.special.bos != 1 || h.special.eos != 2 || h.special.unk != 3 ||
        h.special.mask != 4 || h.special.sep != 5) {
      throw std::runtime_error(path + ": special ids differ from 0..5");
    }
    if (!kind.empty() && h.kind != kind) {
      throw std::runtime_error(path + ": kind " + h.kind + " but earlier shards are " + kind);
    }
    kind = h.kind;
    if (kind == "lm" && side == "source") throw std::runtime_error(path + ": lm has no source");
    print_sequences(side == "source" ? shard.source : shard.target, *tokenizer);
  }
  return 0;
}

int normalize(const std::string& dir, const std::string& text_file) {
  const auto tokenizer = Tokenizer::from_bytes(read_file(dir + "/tokenizer.model"));
  std::ifstream in(text_file, std::ios::binary);
  if (!in) throw std::runtime_error(text_file + ": cannot read");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t\r\v\f") == std::string::npos) continue;
    std::cout << tokenizer->decode(tokenizer->encode(line)) << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 3 && args[1] == "--normalize") return normalize(args[0], args[2]);
    std::string side = "target", split;
    bool good = !args.empty();
    for (size_t i = 1; good && i < args.size(); ++i) {
      if (args[i] == "source" || args[i] == "target") {
        side = args[i];
      } else if (args[i] == "--split" && i + 1 < args.size()) {
        split = args[++i];
        good = split == "train" || split == "valid" || split == "test";
      } else {
        good = false;
      }
    }
    if (good) return decode_set(args[0], side, split);
    std::cerr << "usage: decode_shards DIR [source|target] [--split train|valid|test] | "
                 "decode_shards DIR --normalize FILE\n";
    return 2;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "decode_shards: " << e.what() << std::endl;
    return 1;
  }
}
