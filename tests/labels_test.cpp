// Label lines (prepare --labels), the label vocabulary, and the micro/macro
// figures of a multi-label classifier.
#include "src/data/labels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "src/core/escape.h"
#include "src/io/label_names.h"
#include "src/scoring/loss_figures.h"

namespace mpiformer {
namespace {

// What parse_label_line says of `line`; "" when it takes it.
std::string label_line_error(const std::string& line) {
  try {
    parse_label_line(line);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(LabelLine, NamesWeightsAndColonsInNames) {
  const auto labels = parse_label_line("  devel::lang:python  a:0.25 b:1 c:0  ");
  ASSERT_EQ(labels.size(), 4u);
  EXPECT_EQ(labels[0].name, "devel::lang:python");  // ":python" is no weight
  EXPECT_EQ(labels[0].weight, 1.0f);
  EXPECT_EQ(labels[1].name, "a");
  EXPECT_EQ(labels[1].weight, 0.25f);
  EXPECT_EQ(labels[2].weight, 1.0f);
  EXPECT_EQ(labels[3].weight, 0.0f);
  EXPECT_TRUE(parse_label_line("").empty());
}

TEST(LabelLine, RefusesWhatCannotBeATarget) {
  EXPECT_EQ(label_line_error("a b:1.5"), "weight 1.5 of 'b' is not in [0, 1]");
  EXPECT_EQ(label_line_error("b:-0.5"), "weight -0.5 of 'b' is not in [0, 1]");
  EXPECT_EQ(label_line_error("a b a:0.5"), "label 'a' given twice");
  EXPECT_EQ(label_line_error(":0.5"), "':0.5' has no label name");
}

TEST(LabelLine, AWeightIsAPlainDecimalNumber) {
  const auto weight = [](const std::string& word) {
    const auto labels = parse_label_line(word);
    EXPECT_EQ(labels.size(), 1u);
    EXPECT_EQ(labels[0].name, "a");
    return labels[0].weight;
  };
  EXPECT_EQ(weight("a:.5"), 0.5f);
  EXPECT_EQ(weight("a:1."), 1.0f);
  EXPECT_EQ(weight("a:+0.5"), 0.5f);
  EXPECT_EQ(weight("a:5E-1"), 0.5f);
  EXPECT_EQ(weight("a:1e-400"), 0.0f);  // below a double's range: 0, as below a float's
  EXPECT_FALSE(std::signbit(weight("a:-0")));
  EXPECT_FALSE(std::signbit(weight("a:-0.0e5")));
  // A last part that is a word belongs to the name: debtags has interface::3d.
  for (const std::string name : {"interface::3d", "works-with::3dmodel", "devel::lang:c++"}) {
    const auto labels = parse_label_line(name);
    ASSERT_EQ(labels.size(), 1u);
    EXPECT_EQ(labels[0].name, name);
    EXPECT_EQ(labels[0].weight, 1.0f);
  }
}

TEST(LabelLine, RefusesAWeightThatIsNotOne) {
  EXPECT_EQ(label_line_error("a:1e400"), "weight 1e400 of 'a' is not in [0, 1]");
  EXPECT_EQ(label_line_error("a:1e5"), "weight 1e5 of 'a' is not in [0, 1]");
  EXPECT_EQ(label_line_error("a:0x1p-1"),
            "weight '0x1p-1' of 'a' is not a decimal number (such as 0.25)");
  EXPECT_EQ(label_line_error("a:0x8"),
            "weight '0x8' of 'a' is not a decimal number (such as 0.25)");
  EXPECT_EQ(label_line_error("a:0.5abc"),
            "weight '0.5abc' of 'a' is not a decimal number (such as 0.25)");
  EXPECT_EQ(label_line_error("a:."), "weight '.' of 'a' is not a decimal number (such as 0.25)");
  EXPECT_EQ(label_line_error("a:+-1"),
            "weight '+-1' of 'a' is not a decimal number (such as 0.25)");
  EXPECT_EQ(label_line_error("a:inf"),
            "weight 'inf' of 'a' is not a decimal number (such as 0.25)");
  EXPECT_EQ(label_line_error("a:NaN"),
            "weight 'NaN' of 'a' is not a decimal number (such as 0.25)");
  EXPECT_EQ(label_line_error("a:"), "'a:' has no weight after its ':'");
  EXPECT_EQ(label_line_error(":"), "':' has no label name");
}

TEST(LabelLine, RefusesANameThatIsNotText) {
  EXPECT_EQ(label_line_error(std::string("a\0b:0.5", 7)),
            "label 'a\\x00b' holds control character 0x00 at byte 2");
  EXPECT_EQ(label_line_error("\x7f"), "label '\\x7f' holds control character 0x7f at byte 1");
  EXPECT_EQ(label_line_error("ab\xff"), "label 'ab\\xff' is not UTF-8 (byte 0xff at byte 3)");
  EXPECT_EQ(label_line_error("caf\xc3\xa9 na\xc3\xafve"), "");
}

TEST(LabelNames, NonEmptyUtf8WithoutSpaceOrControls) {
  EXPECT_EQ(label_name_fault("devel::lang:python"), "");
  EXPECT_EQ(label_name_fault("\xe4\xb8\xad\xe6\x96\x87"), "");  // two CJK characters
  EXPECT_EQ(label_name_fault("\xf0\x9f\x90\x88"), "");          // U+1F408
  EXPECT_EQ(label_name_fault(""), "is empty");
  EXPECT_EQ(label_name_fault("cat dog"), "holds white space at byte 4");
  EXPECT_EQ(label_name_fault("a\nb"), "holds control character 0x0a at byte 2");
  EXPECT_EQ(label_name_fault("a\xc2\x85"), "holds control character U+0085 at byte 2");
  EXPECT_EQ(label_name_fault("\xc0\xaf"), "is not UTF-8 (byte 0xc0 at byte 1)");       // overlong
  EXPECT_EQ(label_name_fault("x\xed\xa0\x80"), "is not UTF-8 (byte 0xed at byte 2)");  // surrogate
  EXPECT_EQ(label_name_fault("\xe4\xb8"), "is not UTF-8 (byte 0xe4 at byte 1)");       // cut short
  EXPECT_EQ(escaped(std::string("a\0\xff b", 5)), "a\\x00\\xff b");
}

TEST(Escaped, ControlCharactersAndBrokenUtf8AsHexNewlineAsBackslashN) {
  EXPECT_EQ(escaped("plain text, 100%"), "plain text, 100%");
  EXPECT_EQ(escaped("x\x1b[2J\x1b]0;title\x07"), "x\\x1b[2J\\x1b]0;title\\x07");
  EXPECT_EQ(escaped("line\nfinal eval | acc 100%"), "line\\nfinal eval | acc 100%");
  EXPECT_EQ(escaped("tab\there\r\x7f"), "tab\\x09here\\x0d\\x7f");
  // Printable UTF-8 stays; C1 controls (CSI is U+009B) are escaped byte by byte.
  EXPECT_EQ(escaped("Gr\xc3\xbc\xc3\x9f"
                    "e \xe6\x97\xa5"),
            "Gr\xc3\xbc\xc3\x9f"
            "e \xe6\x97\xa5");
  EXPECT_EQ(escaped("a\xc2\x9b"
                    "31m"),
            "a\\xc2\\x9b31m");
  EXPECT_EQ(escaped("\xc0\xaf"), "\\xc0\\xaf");  // overlong
  EXPECT_EQ(escaped("\xe4\xb8"), "\\xe4\\xb8");  // cut short
  EXPECT_EQ(escaped(""), "");
}

TEST(LabelVocabulary, MostFrequentFirstTiesByName) {
  LabelVocabulary v;
  v.count(parse_label_line("b c"));
  v.count(parse_label_line("c a"));
  v.count(parse_label_line("c b:0.5"));
  v.finish();
  EXPECT_EQ(v.names(), (std::vector<std::string>{"c", "b", "a"}));
  EXPECT_EQ(v.id("a"), 2);
  EXPECT_EQ(v.id("z"), -1);
  EXPECT_EQ(split_label_names(join_label_names(v.names())), v.names());
}

TEST(LabelNames, ADifferentSetNamesTheFirstLabelThatDiffers) {
  const std::vector<std::string> abc{"a", "b", "c"};
  EXPECT_EQ(label_set_difference(abc, "A", abc, "B"), "");
  EXPECT_EQ(label_set_difference(abc, "A", {"a", "b", "d"}, "B"),
            "label 2 is 'c' in A and 'd' in B");
  EXPECT_EQ(label_set_difference(abc, "A", {"b", "a", "c"}, "B"),
            "label 0 is 'a' in A and 'b' in B");
  EXPECT_EQ(label_set_difference(abc, "A", {"a", "b"}, "B"),
            "3 label(s) in A, 2 in B (label 2 is 'c' in A alone)");
  EXPECT_EQ(label_set_difference({"a"}, "A", abc, "B"),
            "1 label(s) in A, 3 in B (label 1 is 'b' in B alone)");
}

TEST(LabelFigures, MicroPoolsMacroAveragesOccurringLabels) {
  // Three labels: [TP | FP | FN]. Label 2 never occurs: left out of macro.
  const std::vector<int64_t> counts = {3, 1, 0, /**/ 1, 0, 0, /**/ 0, 1, 0};
  const LabelFigures f = label_figures(counts);
  EXPECT_DOUBLE_EQ(f.micro_precision, 4.0 / 5.0);
  EXPECT_DOUBLE_EQ(f.micro_recall, 4.0 / 5.0);
  EXPECT_DOUBLE_EQ(f.micro_f1, 8.0 / 10.0);
  EXPECT_DOUBLE_EQ(f.macro_precision, (3.0 / 4.0 + 1.0) / 2.0);
  EXPECT_DOUBLE_EQ(f.macro_recall, (1.0 + 0.5) / 2.0);
  EXPECT_DOUBLE_EQ(f.macro_f1, (6.0 / 7.0 + 2.0 / 3.0) / 2.0);
  EXPECT_TRUE(std::isnan(label_figures({}).micro_f1));
  EXPECT_TRUE(std::isnan(label_figures({0, 0, 0}).macro_f1));
}

}  // namespace
}  // namespace mpiformer
