#include "src/app/arch_presets.h"

#include <sstream>
#include <stdexcept>

#include "src/core/error.h"

namespace mpiformer {

namespace {

using Flags = std::vector<std::pair<const char*, const char*>>;

Flags operator+(Flags a, const Flags& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The flags shared by the GPT-2 presets: pre-LN, learned positions, tied
// embeddings and no output bias as GPT-2 has them (analysis/export_hf.py
// needs that), then GPT-3's AdamW (beta2 0.95, weight decay 0.1, clipping
// at 1) and cosine decay to a tenth of the peak; warmup over GPT-3's 375M
// tokens at its 0.5M-token batch.
const Flags kGpt2Recipe = {{"max-len", "1024"},
                           {"dropout", "0.1"},
                           {"norm", "pre"},
                           {"positions", "learned"},
                           {"tied-embeddings", "true"},
                           {"output-bias", "false"},
                           {"activation", "gelu"},
                           {"label-smoothing", "0"},
                           {"schedule", "cosine"},
                           {"warmup", "715"},
                           {"beta1", "0.9"},
                           {"beta2", "0.95"},
                           {"adam-eps", "1e-08"},
                           {"weight-decay", "0.1"},
                           {"clip-norm", "1"}};

// The Transformer of "Attention is all you need": post-LN, sinusoidal
// positions, ReLU, shared embeddings, label smoothing 0.1, Adam (0.9, 0.98,
// 1e-9) with 4000 warmup steps and inverse square root decay, the peak
// being d_model^-0.5 x 4000^-0.5 (the presets' --lr). The presets give
// --layers 6, for both stacks, and --max-len 256 (seq2seq skips longer
// pairs, --too-long).
const Flags kVaswaniRecipe = {{"norm", "post"},
                              {"positions", "sinusoidal"},
                              {"tied-embeddings", "true"},
                              {"output-bias", "false"},
                              {"activation", "relu"},
                              {"label-smoothing", "0.1"},
                              {"schedule", "inverse-sqrt"},
                              {"warmup", "4000"},
                              {"beta1", "0.9"},
                              {"beta2", "0.98"},
                              {"adam-eps", "1e-09"}};

const std::vector<ArchPreset> kPresets = {
    {"gpt2-small",
     "GPT-2 small (Radford et al. 2019; 124M parameters with its 50257-token vocabulary); the "
     "optimizer and schedule of GPT-3 Small (Brown et al. 2020)",
     Flags{
         {"model", "lm"}, {"layers", "12"}, {"d-model", "768"}, {"heads", "12"}, {"d-ff", "3072"}} +
         kGpt2Recipe + Flags{{"lr", "6e-04"}, {"end-lr", "6e-05"}}},
    {"gpt2-medium",
     "GPT-2 medium (355M parameters with its vocabulary); the optimizer and schedule of GPT-3 "
     "Medium",
     Flags{{"model", "lm"},
           {"layers", "24"},
           {"d-model", "1024"},
           {"heads", "16"},
           {"d-ff", "4096"}} +
         kGpt2Recipe + Flags{{"lr", "3e-04"}, {"end-lr", "3e-05"}}},
    {"transformer-base", "Transformer base (Vaswani et al. 2017): 6 + 6 layers, the WMT recipe",
     Flags{{"model", "seq2seq"},
           {"layers", "6"},
           {"d-model", "512"},
           {"heads", "8"},
           {"d-ff", "2048"},
           {"max-len", "256"},
           {"dropout", "0.1"}} +
         kVaswaniRecipe + Flags{{"lr", "7e-04"}}},
    {"transformer-big",
     "Transformer big (Vaswani et al. 2017): 6 + 6 layers, the WMT English-German recipe",
     Flags{{"model", "seq2seq"},
           {"layers", "6"},
           {"d-model", "1024"},
           {"heads", "16"},
           {"d-ff", "4096"},
           {"max-len", "256"},
           {"dropout", "0.3"}} +
         kVaswaniRecipe + Flags{{"lr", "5e-04"}}},
    {"bert-base",
     "BERT base (Devlin et al. 2019; no segment embeddings, pooler or next-sentence task, GELU "
     "in its tanh form): post-LN, 15% of tokens masked, AdamW with 10000 warmup steps and "
     "linear decay",
     {{"model", "mlm"},         {"layers", "12"},
      {"d-model", "768"},       {"heads", "12"},
      {"d-ff", "3072"},         {"max-len", "512"},
      {"dropout", "0.1"},       {"norm", "post"},
      {"positions", "learned"}, {"tied-embeddings", "true"},
      {"output-bias", "true"},  {"activation", "gelu"},
      {"label-smoothing", "0"}, {"mlm-probability", "0.15"},
      {"lr", "1e-04"},          {"schedule", "polynomial"},
      {"poly-power", "1"},      {"end-lr", "0"},
      {"warmup", "10000"},      {"beta1", "0.9"},
      {"beta2", "0.999"},       {"adam-eps", "1e-06"},
      {"weight-decay", "0.01"}}},
    {"tiny",
     "a small model of any kind that learns in minutes on a laptop's CPU (a seq2seq model gets "
     "2 + 2 layers)",
     {{"layers", "2"},
      {"d-model", "128"},
      {"heads", "4"},
      {"d-ff", "512"},
      {"max-len", "128"},
      {"dropout", "0.1"},
      {"lr", "0.001"},
      {"schedule", "inverse-sqrt"},
      {"warmup", "100"}}},
};

constexpr size_t kTableWidth = 100;
constexpr size_t kIndent = 20;

// `words` filled into lines of kTableWidth, each after kIndent spaces but
// the first, which follows `first` (padded to kIndent).
std::string fill(const std::string& first, const std::vector<std::string>& words) {
  std::string text = "  " + first;
  text += std::string(text.size() < kIndent ? kIndent - text.size() : 1, ' ');
  size_t column = text.size();
  bool line_empty = true;
  for (const std::string& word : words) {
    if (!line_empty && column + 1 + word.size() > kTableWidth) {
      text += "\n" + std::string(kIndent, ' ');
      column = kIndent;
      line_empty = true;
    }
    if (!line_empty) {
      text += ' ';
      ++column;
    }
    text += word;
    column += word.size();
    line_empty = false;
  }
  return text + "\n";
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

std::string preset_names() {
  std::vector<std::string> names;
  for (const ArchPreset& p : kPresets) names.push_back(p.name);
  names.push_back("list");
  return list_choices(names);
}

}  // namespace

const std::vector<ArchPreset>& arch_presets() {
  return kPresets;
}

const ArchPreset* find_arch_preset(const std::string& name) {
  for (const ArchPreset& p : kPresets) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

std::string arch_preset_table() {
  std::string text =
      "\nPresets (--arch NAME; `--arch list` prints this table). A flag given on the command "
      "line or\nin --config wins over its preset's value, but --model must agree with a preset "
      "that names\na kind. --vocab comes from the shards; config.ini records the arch and every "
      "value.\n";
  for (const ArchPreset& p : kPresets) {
    text += fill(p.name, split_words(p.origin));
    std::vector<std::string> flags;
    for (const auto& [flag, value] : p.flags)
      flags.push_back("--" + std::string(flag) + " " + value);
    // A flag and its value stay on one line.
    text += fill("", flags);
  }
  return text;
}

std::set<std::string> apply_arch_preset(const FlagTable& table, const std::set<std::string>& given,
                                        const std::string& arch) {
  if (arch.empty()) return given;
  const ArchPreset* preset = find_arch_preset(arch);
  if (!preset) usage_error("--arch", "expected " + preset_names() + "; got " + quoted(arch));
  std::set<std::string> effective = given;
  for (const auto& [name, value] : preset->flags) {
    const Flag* flag = nullptr;
    for (const Flag& f : table.flags()) {
      if (f.name == name) flag = &f;
    }
    // A preset names only flags of train's table (a unit test checks each).
    if (!flag) throw std::logic_error("--arch " + arch + " sets --" + name + ", no flag of train");
    if (given.count(name)) {
      // The shape of a preset is that of its kind: a GPT-2 is no encoder.
      if (std::string(name) == "model" && flag->show() != value) {
        usage_error("--model", flag->show() + " contradicts --arch " + arch + ", whose model is " +
                                   value +
                                   "; drop --model, or choose a preset of that kind "
                                   "(tiny fits any)");
      }
      continue;
    }
    flag->parse(value);
    effective.insert(name);
  }
  return effective;
}

}  // namespace mpiformer
