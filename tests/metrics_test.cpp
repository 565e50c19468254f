// metrics.h5: rows read back exactly, a resumed run keeps the rows up to its
// step and records it, and a file that is not ours is refused untouched.
#include "src/io/metrics.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "src/io/atomic_file.h"
#include "src/io/hdf5_file.h"
#include "tests/damaged_file.h"

namespace mpiformer {
namespace {

namespace fs = std::filesystem;

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("mpiformer_metrics_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "metrics.h5").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // By default a file with every column (a multi-label classifier's label
  // figures and a seq2seq --valid-bleu's bleu); `optional` false: neither.
  static RunAttributes attrs(int world_size, bool optional = true) {
    return {"[model]\nkind = classify\n",
            "classify",
            world_size,
            "2 x cpu",
            "mpiformer x",
            "abc123",
            "",
            optional,
            optional};
  }
  // Row of step s: every column a distinct function of s.
  static TrainRow train_row(int64_t s) {
    TrainRow r;
    r.step = s;
    r.loss = 1.0 / (s + 3);
    r.tokens = 1000 + s;
    r.accuracy = 0.01 * s;
    r.lr = 1e-3 * s;
    r.grad_norm = 0.5 + s;
    r.tokens_per_s = 1e6 + s;
    r.step_ms = 20.0 + s;
    r.padding_efficiency = 0.9;
    r.loss_scale = 1.0;
    r.nll = 1.5 / (s + 3);
    r.elapsed_s = 2.0 * s;
    r.epoch = 0.125 * s;
    r.comm_wait_ms = 0.25 * s;
    r.hidden_share = 0.5;
    r.labels.micro_f1 = 0.75;  // a multi-label classifier's figure; the others stay NaN
    return r;
  }
  static EvalRow eval_row(int64_t s) {
    EvalRow r;
    r.step = s;
    r.loss = 2.5;
    r.perplexity = 12.182493960703473;
    r.accuracy = 0.25;
    r.tokens = 777;
    r.nll = 2.5;
    r.elapsed_s = 2.0 * s + 1;
    r.bleu = 31.25;
    return r;
  }
  static std::vector<std::string> lines_of(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  static std::string contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(MetricsTest, RowsAndAttributesReadBackExactly) {
  {
    MetricsLog log(path_, attrs(4), -1);
    for (int64_t s = 10; s <= 30; s += 10) log.append(train_row(s));
    TrainRow no_epoch = train_row(40);
    no_epoch.epoch = std::nan("");  // a synthetic task counts none
    log.append(no_epoch);
    log.append(eval_row(20));
  }
  ASSERT_TRUE(is_metrics_file(path_));
  const MetricsTable t = read_metrics(path_);
  EXPECT_EQ(t.attrs.world_size, 4);
  EXPECT_EQ(t.attrs.config, attrs(4).config);
  EXPECT_EQ(t.attrs.git_commit, "abc123");
  EXPECT_TRUE(t.resumed_at_steps.empty());
  EXPECT_EQ(t.train_columns, (std::vector<std::string>{"step",
                                                       "loss",
                                                       "tokens",
                                                       "accuracy",
                                                       "lr",
                                                       "grad_norm",
                                                       "tokens_per_s",
                                                       "step_ms",
                                                       "padding_efficiency",
                                                       "loss_scale",
                                                       "nll",
                                                       "elapsed_s",
                                                       "epoch",
                                                       "comm_wait_ms",
                                                       "hidden_share",
                                                       "micro_precision",
                                                       "micro_recall",
                                                       "micro_f1",
                                                       "macro_precision",
                                                       "macro_recall",
                                                       "macro_f1"}));
  ASSERT_EQ(t.train_rows.size(), 4u);
  const TrainRow r = train_row(20);
  std::vector<double> row = t.train_rows[1];
  ASSERT_EQ(row.size(), 21u);
  EXPECT_EQ(row[17], 0.75);  // micro_f1
  for (int nan_column : {15, 16, 18, 19, 20}) EXPECT_TRUE(std::isnan(row[nan_column]));
  row.resize(15);
  const std::vector<double> expected_row = {
      20,  r.loss, 1020, r.accuracy, r.lr, r.grad_norm, r.tokens_per_s, r.step_ms, 0.9,
      1.0, r.nll,  40,   2.5,        5,    0.5};
  EXPECT_EQ(row, expected_row);
  EXPECT_TRUE(std::isnan(t.train_rows[3][12]));
  EXPECT_EQ(t.eval_columns,
            (std::vector<std::string>{"step", "loss", "perplexity", "accuracy", "tokens", "nll",
                                      "elapsed_s", "micro_precision", "micro_recall", "micro_f1",
                                      "macro_precision", "macro_recall", "macro_f1", "bleu"}));
  ASSERT_EQ(t.eval_rows.size(), 1u);
  std::vector<double> eval = t.eval_rows[0];
  ASSERT_EQ(eval.size(), 14u);
  for (size_t c = 7; c < 13; ++c) EXPECT_TRUE(std::isnan(eval[c]));
  EXPECT_EQ(eval[13], 31.25);  // bleu
  eval.resize(7);
  EXPECT_EQ(eval, (std::vector<double>{20, 2.5, 12.182493960703473, 0.25, 777, 2.5, 41}));

  // metrics.jsonl: the same rows, one JSON object a line, NaN as null.
  const std::vector<std::string> lines = lines_of((dir_ / "metrics.jsonl").string());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[1].rfind("{\"group\": \"train\", \"step\": 20, \"loss\": 0.043478260869565216, "
                           "\"tokens\": 1020, ",
                           0),
            0u)
      << lines[1];
  const std::string train_tail =
      "\"epoch\": 2.5, \"comm_wait_ms\": 5, \"hidden_share\": 0.5, "
      "\"micro_precision\": null, \"micro_recall\": null, \"micro_f1\": 0.75, ";
  EXPECT_NE(lines[1].find(train_tail), std::string::npos) << lines[1];
  EXPECT_NE(lines[3].find("\"epoch\": null"), std::string::npos) << lines[3];
  EXPECT_EQ(lines[4],
            "{\"group\": \"eval\", \"step\": 20, \"loss\": 2.5, \"perplexity\": "
            "12.182493960703473, \"accuracy\": 0.25, \"tokens\": 777, \"nll\": 2.5, "
            "\"elapsed_s\": 41, \"micro_precision\": null, \"micro_recall\": null, "
            "\"micro_f1\": null, \"macro_precision\": null, \"macro_recall\": null, "
            "\"macro_f1\": null, \"bleu\": 31.25}");
}

// Other models than multi-label classifiers have no label figures, and runs
// without --valid-bleu no bleu: their files and lines hold no such columns,
// and readers see them as NaN.
TEST_F(MetricsTest, OnlyAMultiLabelClassifierHasLabelColumns) {
  {
    MetricsLog log(path_, attrs(1, /*optional=*/false), -1);
    log.append(train_row(10));
    log.append(eval_row(10));
  }
  {
    hdf5::Session session;
    const hid_t file = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    EXPECT_GT(H5Lexists(file, "/train/hidden_share", H5P_DEFAULT), 0);
    for (const char* name :
         {"/train/micro_f1", "/train/macro_recall", "/eval/micro_precision", "/eval/bleu"})
      EXPECT_EQ(H5Lexists(file, name, H5P_DEFAULT), 0) << name;
    H5Fclose(file);
  }
  const MetricsTable t = read_metrics(path_);
  EXPECT_FALSE(t.attrs.label_figures);
  ASSERT_EQ(t.train_rows.size(), 1u);
  ASSERT_EQ(t.train_rows[0].size(), 21u);
  EXPECT_EQ(t.train_rows[0][14], 0.5);  // hidden_share
  EXPECT_TRUE(std::isnan(t.train_rows[0][17]));
  for (const std::string& line : lines_of((dir_ / "metrics.jsonl").string()))
    EXPECT_EQ(line.find("micro"), std::string::npos) << line;
  const std::string classifier = (dir_ / "classifier.h5").string();
  { MetricsLog log(classifier, attrs(1), -1); }
  EXPECT_TRUE(read_metrics(classifier).attrs.label_figures);
}

// A file of version 1 lacks the columns after loss_scale (train) and tokens
// (eval): it reads with NaN there, and a resumed run carries it into version 3.
TEST_F(MetricsTest, AFileWithoutTheNewerColumnsReadsThemAsNaN) {
  {
    MetricsLog log(path_, attrs(1), -1);
    for (int64_t s = 1; s <= 3; ++s) log.append(train_row(s));
    log.append(eval_row(2));
  }
  {
    hdf5::Session session;
    const hid_t file = H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    for (const char* name :
         {"/train/nll", "/train/elapsed_s", "/train/epoch", "/train/comm_wait_ms",
          "/train/hidden_share", "/eval/nll", "/eval/elapsed_s"})
      ASSERT_GE(H5Ldelete(file, name, H5P_DEFAULT), 0) << name;
    // ... and version 2's label figures.
    for (const char* group : {"/train/", "/eval/"})
      for (const char* column : {"micro_precision", "micro_recall", "micro_f1", "macro_precision",
                                 "macro_recall", "macro_f1"})
        ASSERT_GE(H5Ldelete(file, (std::string(group) + column).c_str(), H5P_DEFAULT), 0);
    H5Fclose(file);
  }
  const MetricsTable old = read_metrics(path_);
  ASSERT_EQ(old.train_rows.size(), 3u);
  ASSERT_EQ(old.train_rows[0].size(), 21u);
  EXPECT_EQ(old.train_rows[2][1], train_row(3).loss);
  EXPECT_TRUE(std::isnan(old.train_rows[2][10]));
  EXPECT_TRUE(std::isnan(old.train_rows[2][17]));
  EXPECT_TRUE(std::isnan(old.eval_rows[0][6]));
  {
    MetricsLog log(path_, attrs(1), 2);
    EXPECT_EQ(log.elapsed_before(), 0.0);  // not recorded then
    log.append(train_row(3));
  }
  const MetricsTable t = read_metrics(path_);
  ASSERT_EQ(t.train_rows.size(), 3u);
  EXPECT_TRUE(std::isnan(t.train_rows[1][11]));
  EXPECT_EQ(t.train_rows[2][11], 6.0);
}

TEST_F(MetricsTest, ResumingKeepsTheRowsUpToTheResumedStep) {
  {
    MetricsLog log(path_, attrs(2), -1);
    for (int64_t s = 1; s <= 7; ++s) log.append(train_row(s));
    log.append(EvalRow{4, 1, 2, 3, 4, 0, 0, {}});
    log.append(EvalRow{6, 1, 2, 3, 4, 0, 0, {}});
  }
  {
    // Resumed from the checkpoint of step 5 on one rank: steps 6 and 7 are redone.
    MetricsLog log(path_, attrs(1), 5);
    EXPECT_EQ(log.elapsed_before(), 10.0);  // step 5's elapsed_s: the clock goes on
    log.append(train_row(6));
  }
  { MetricsLog log(path_, attrs(3), 6); }
  const MetricsTable t = read_metrics(path_);
  EXPECT_EQ(t.resumed_at_steps, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(t.attrs.world_size, 3);
  ASSERT_EQ(t.train_rows.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(t.train_rows[i][0], static_cast<double>(i + 1));
  ASSERT_EQ(t.eval_rows.size(), 1u);
  EXPECT_EQ(t.eval_rows[0][0], 4.0);
  EXPECT_FALSE(fs::exists(temporary_name(path_)));
  // metrics.jsonl follows: steps 1-6 and the eval of step 4.
  const std::vector<std::string> lines = lines_of((dir_ / "metrics.jsonl").string());
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[5].rfind("{\"group\": \"train\", \"step\": 6,", 0), 0u) << lines[5];
  EXPECT_EQ(lines[6].rfind("{\"group\": \"eval\", \"step\": 4,", 0), 0u) << lines[6];
  EXPECT_FALSE(fs::exists(temporary_name((dir_ / "metrics.jsonl").string())));
}

TEST_F(MetricsTest, ResumingWithoutAFileStartsOne) {
  { MetricsLog log(path_, attrs(1), 12); }
  EXPECT_TRUE(read_metrics(path_).train_rows.empty());
}

// A writer killed while it wrote leaves the file marked as open for SWMR
// writing: it reads back (as an SWMR reader), and damaged it is refused at
// once, the reader's checksum retries bounded, where HDF5's own would never
// end. A damaged file that was closed is refused the same way.
TEST_F(MetricsTest, ADamagedFileIsRefusedAlsoWhenMarkedAsBeingWritten) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The writer, killed: no destructor, no close, no exit handlers.
    auto* log = new MetricsLog(path_, attrs(1), -1);
    for (int64_t s = 1; s <= 5; ++s) log->append(train_row(s));
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  {
    hdf5::Session session;  // a plain reader is refused: the file is being written
    EXPECT_FALSE(hdf5::open_read_only(path_).ok());
  }
  EXPECT_EQ(read_metrics(path_).train_rows.size(), 5u);
  const std::string closed = (dir_ / "closed.h5").string();
  { MetricsLog log(closed, attrs(1), -1); }
  for (const std::string& path : {path_, closed}) {
    // Every object header but the root group's.
    ASSERT_GT(damage_blocks(path, "OHDR", 16, 1), 0);
    // In a child process: HDF5 1.10 keeps a reference after a failed
    // metadata read and reports a loop when it shuts down at exit (the
    // program never shuts it down: hdf5::initialize_library).
    EXPECT_EXIT(
        {
          try {
            read_metrics(path);
          } catch (const MetricsError& e) {
            std::fprintf(stderr, "%s\n", e.what());
            std::_Exit(0);
          }
          std::_Exit(1);
        },
        ::testing::ExitedWithCode(0), "^[^\n]*: truncated or corrupt \\(HDF5 could not ")
        << path;
  }
}

TEST_F(MetricsTest, TheRunIdIsAnAttribute) {
  RunAttributes a = attrs(1);
  a.run_id = "0123456789abcdef";
  { MetricsLog log(path_, a, -1); }
  EXPECT_EQ(read_metrics(path_).attrs.run_id, "0123456789abcdef");
  { MetricsLog log(path_, attrs(1), -1); }  // a file of a version without ids
  EXPECT_EQ(read_metrics(path_).attrs.run_id, "");
}

// Either file of a resumed run rebuilds the other: no row is lost or doubled.
TEST_F(MetricsTest, AMissingFileIsRebuiltFromTheOther) {
  const std::string json = (dir_ / "metrics.jsonl").string();
  {
    MetricsLog log(path_, attrs(1), -1);
    for (int64_t s = 1; s <= 4; ++s) log.append(train_row(s));
    log.append(eval_row(2));
    log.append(eval_row(4));
  }
  const MetricsTable all = read_metrics(path_);
  // Equal, NaN where NaN: the figures a row lacks.
  const auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) return false;
    for (size_t c = 0; c < a.size(); ++c)
      if (!(a[c] == b[c] || (std::isnan(a[c]) && std::isnan(b[c])))) return false;
    return true;
  };
  for (const char* gone : {"metrics.h5", "metrics.jsonl"}) {
    SCOPED_TRACE(gone);
    fs::remove(dir_ / gone);
    {
      MetricsLog log(path_, attrs(1), 3);
      EXPECT_EQ(log.note(), std::string(gone) + " was missing: rebuilt from " +
                                (gone[8] == 'h' ? "metrics.jsonl" : "metrics.h5") +
                                " (3 train and 1 eval row(s) through step 3)");
      EXPECT_EQ(log.elapsed_before(), 6.0);
      log.append(train_row(4));
      log.append(eval_row(4));
    }
    const MetricsTable t = read_metrics(path_);
    ASSERT_EQ(t.train_rows.size(), 4u);
    for (size_t r = 0; r < 4; ++r) EXPECT_TRUE(same(t.train_rows[r], all.train_rows[r])) << r;
    ASSERT_EQ(t.eval_rows.size(), 2u);
    EXPECT_TRUE(same(t.eval_rows[0], all.eval_rows[0]));
    const MetricsTable from_lines = read_metrics_jsonl(json);
    EXPECT_EQ(from_lines.train_rows.size(), 4u);
    EXPECT_EQ(from_lines.eval_rows.size(), 2u);
  }
  fs::remove(path_);
  fs::remove(json);
  MetricsLog log(path_, attrs(1), 3);
  EXPECT_EQ(log.note(),
            "no metrics.h5 or metrics.jsonl to carry: the rows through step 3 are not in this "
            "directory");
}

TEST_F(MetricsTest, LinesReaderSkipsAnUnfinishedLastLineAndNamesABadOne) {
  const std::string json = (dir_ / "metrics.jsonl").string();
  std::ofstream(json) << "{\"group\": \"train\", \"step\": 5, \"loss\": 2.5, \"lr\": null}\n"
                      << "{\"group\": \"eval\", \"step\": 5, \"perplexity\": 12}\n"
                      << "{\"group\": \"train\", \"step\": 10, \"lo";
  const MetricsTable t = read_metrics_jsonl(json);
  ASSERT_EQ(t.train_rows.size(), 1u);
  EXPECT_EQ(t.train_rows[0][0], 5.0);
  EXPECT_EQ(t.train_rows[0][1], 2.5);
  EXPECT_TRUE(std::isnan(t.train_rows[0][4]));  // lr: null
  EXPECT_TRUE(std::isnan(t.train_rows[0][2]));  // tokens: not in the line
  ASSERT_EQ(t.eval_rows.size(), 1u);
  EXPECT_EQ(t.eval_rows[0][2], 12.0);
  std::ofstream(json) << "{\"group\": \"train\", \"step\": 5}\nnot a row\n{\"group\": \"train\"}\n";
  try {
    read_metrics_jsonl(json);
    FAIL() << "a line that is not a row was read";
  } catch (const MetricsError& e) {
    EXPECT_EQ(std::string(e.what()), json + ": line 2 is not a metrics row");
  }
}

TEST_F(MetricsTest, RefusesWhatIsNotAMetricsFileAndLeavesItAlone) {
  std::ofstream(path_) << "someone's notes";
  try {
    MetricsLog log(path_, attrs(1), 0);
    FAIL() << "a text file was accepted";
  } catch (const MetricsError& e) {
    EXPECT_EQ(std::string(e.what()),
              path_ + ": not an HDF5 file; move it away or choose another --out");
  }
  EXPECT_EQ(contents(path_), "someone's notes");
  EXPECT_FALSE(is_metrics_file(path_));

  fs::remove(path_);
  fs::create_directories(path_);
  EXPECT_THROW(MetricsLog(path_, attrs(1), -1), MetricsError);
  try {
    read_metrics((dir_ / "missing.h5").string());
    FAIL() << "a missing file was read";
  } catch (const MetricsError& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos);
  }
}

}  // namespace
}  // namespace mpiformer
