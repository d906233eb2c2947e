// plot_test.cpp — `booster plot` (tools/booster/plot.cpp): the metrics.csv reader and its errors,
// the panel layout of the two examples' csv files, the gnuplot script, and the `booster` binary
// drawing real PNGs with Debian's gnuplot (signature, IHDR width/height, IEND checked).
#include "plot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace bt = booster::testing;
using booster::cli::Metrics;
using booster::cli::PlotError;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

const char* kGptCsv =
    "step,elapsed_s,train_loss,val_loss,val_bpb,lr,tokens_per_s,tokens_seen,eval_windows\n"
    "50,10.5,3.2,3.1,4.47,0.0003,11000.5,102400,64\n"
    "100,20.1,2.6,2.5,3.61,0.00028,11100,204800,64\n"
    "150,30.0,2.2,2.3,3.32,0.0002,11050,307200,64\n";
const char* kMnistCsv =
    "epoch,train_loss,test_accuracy,samples_per_s,epoch_seconds,lr\n"
    "1,0.5354,0.8867,2430,24.7,0.00090\n"
    "2,0.2901,0.8998,2424,24.7,0.00065\n";

std::string write_run(const bt::TempDir& dir, const std::string& name, const std::string& csv) {
  std::filesystem::create_directories(dir.file(name));
  std::ofstream(dir.file(name + "/metrics.csv")) << csv;
  return dir.file(name);
}

std::string read_error(const std::string& run) {
  try {
    booster::cli::read_metrics(run);
  } catch (const PlotError& e) {
    return e.what();
  }
  return "(no error)";
}

struct Png {
  bool signature = false, iend = false;
  uint32_t width = 0, height = 0;
  size_t bytes = 0;
};

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

Png read_png(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  Png p;
  p.bytes = s.size();
  if (s.size() < 33) return p;
  p.signature = s.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0 && s.compare(12, 4, "IHDR") == 0;
  p.width = be32(s, 16);
  p.height = be32(s, 20);
  p.iend = s.compare(s.size() - 8, 4, "IEND") == 0;
  return p;
}

}  // namespace

TEST(PlotMetrics, ReadsTheGptCsvAndDrawsLossBpbLrAndThroughput) {
  bt::TempDir dir;
  Metrics m = booster::cli::read_metrics(write_run(dir, "gpt_ddp", kGptCsv));
  EXPECT_EQ(m.label, "gpt_ddp");
  ASSERT_EQ(m.rows.size(), 3u);
  EXPECT_DOUBLE_EQ(m.rows[1][5], 0.00028);
  EXPECT_DOUBLE_EQ(m.rows[2][6], 11050);
  auto layout = booster::cli::plot_layout({m});
  EXPECT_EQ(layout.x, "step");
  ASSERT_EQ(layout.panels.size(), 4u);
  EXPECT_EQ(layout.panels[0].title, "loss");
  EXPECT_THAT(layout.panels[0].columns, ElementsAre("train_loss", "val_loss"));
  EXPECT_EQ(layout.panels[1].title, "bits per byte");
  EXPECT_EQ(layout.panels[2].title, "learning rate");
  EXPECT_THAT(layout.panels[3].columns, ElementsAre("tokens_per_s"));
  EXPECT_THAT(layout.skipped, ElementsAre("elapsed_s", "tokens_seen", "eval_windows"));
}

TEST(PlotMetrics, TheFashionMnistCsvGetsAnAccuracyPanelAndARunLabelPerLine) {
  bt::TempDir dir;
  Metrics a = booster::cli::read_metrics(write_run(dir, "ddp", kMnistCsv));
  Metrics b = booster::cli::read_metrics(write_run(dir, "zero's run", kMnistCsv) + "/metrics.csv");
  auto layout = booster::cli::plot_layout({a, b});
  EXPECT_EQ(layout.x, "epoch");
  ASSERT_EQ(layout.panels.size(), 4u);
  EXPECT_EQ(layout.panels[1].title, "accuracy");
  EXPECT_THAT(layout.panels[1].columns, ElementsAre("test_accuracy"));
  EXPECT_THAT(layout.skipped, ElementsAre("epoch_seconds"));
  std::string script = booster::cli::gnuplot_script({a, b}, layout, "/tmp/o'ut.png", 800, 600);
  EXPECT_THAT(script, HasSubstr("set terminal pngcairo size 800,600"));
  EXPECT_THAT(script, HasSubstr("set output '/tmp/o''ut.png'"));        // a quote doubled, as gnuplot reads it
  EXPECT_THAT(script, HasSubstr("set multiplot layout 2,2 title 'ddp vs zero''s run'"));
  EXPECT_THAT(script, HasSubstr("skip 1 using 1:3 with linespoints lw 2 title 'zero''s run: test_accuracy'"));
  EXPECT_THAT(script, HasSubstr("skip 1 using 1:6 with linespoints lw 2 title 'ddp: lr'"));
}

TEST(PlotMetrics, MalformedOrMissingCsvIsAnErrorNamingTheFileAndLine) {
  bt::TempDir dir;
  EXPECT_THAT(read_error(dir.file("nope")), HasSubstr("nope: no such run directory or file"));
  std::filesystem::create_directories(dir.file("bare"));
  EXPECT_THAT(read_error(dir.file("bare")), HasSubstr("bare/metrics.csv: no such file"));
  EXPECT_THAT(read_error(write_run(dir, "empty", "")), HasSubstr("empty/metrics.csv: the file is empty"));
  EXPECT_THAT(read_error(write_run(dir, "header", "step,loss\n")), HasSubstr("no data row yet"));
  EXPECT_THAT(read_error(write_run(dir, "short", "step,loss\n1,2\n2\n")), HasSubstr("short/metrics.csv:3: 1 fields, the header has 2"));
  EXPECT_THAT(read_error(write_run(dir, "text", "step,loss\n1,abc\n")),
              HasSubstr("text/metrics.csv:2: column 'loss' holds 'abc', not a finite number"));
  EXPECT_THAT(read_error(write_run(dir, "nan", "step,loss\n1,nan\n")), HasSubstr("holds 'nan', not a finite number"));
  EXPECT_THAT(read_error(write_run(dir, "dup", "step,loss,loss\n1,2,3\n")), HasSubstr("names column 'loss' twice"));
  EXPECT_THAT(read_error(write_run(dir, "one", "step\n1\n")), HasSubstr("at least one value column"));

  Metrics step = booster::cli::read_metrics(write_run(dir, "gpt", kGptCsv));
  Metrics epoch = booster::cli::read_metrics(write_run(dir, "mnist", kMnistCsv));
  try {
    booster::cli::plot_layout({step, epoch});
    ADD_FAILURE() << "different x columns accepted";
  } catch (const PlotError& e) {
    EXPECT_THAT(e.what(), HasSubstr("different x columns"));
  }
  Metrics nothing = booster::cli::read_metrics(write_run(dir, "nothing", "step,elapsed_s\n1,2\n"));
  try {
    booster::cli::plot_layout({nothing});
    ADD_FAILURE() << "a csv without a known column accepted";
  } catch (const PlotError& e) {
    EXPECT_THAT(e.what(), HasSubstr("nothing to plot"));
  }
}

TEST(PlotCommand, DrawsAPngOfTheRequestedSizeForOneAndForTwoRuns) {
  bt::TempDir dir;
  std::string gpt = write_run(dir, "gpt", kGptCsv);
  auto one = bt::run_process({BOOSTER_CLI_PATH, "plot", gpt});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("wrote " + gpt + "/metrics.png"));
  EXPECT_THAT(one.output, HasSubstr("not drawn: elapsed_s tokens_seen eval_windows"));
  Png p = read_png(gpt + "/metrics.png");
  EXPECT_TRUE(p.signature);
  EXPECT_TRUE(p.iend);
  EXPECT_EQ(p.width, 1200u);
  EXPECT_EQ(p.height, 800u);
  EXPECT_GT(p.bytes, 10000u);  // axes, labels and four panels of lines, not an empty canvas

  std::string a = write_run(dir, "a", kMnistCsv), b = write_run(dir, "b", kMnistCsv);
  auto two = bt::run_process({BOOSTER_CLI_PATH, "plot", a, b, "--out", dir.file("cmp.png"), "--width", "640",
                              "--height", "480"});
  ASSERT_EQ(two.exit_code, 0) << two.output;
  Png q = read_png(dir.file("cmp.png"));
  EXPECT_TRUE(q.signature && q.iend);
  EXPECT_EQ(q.width, 640u);
  EXPECT_EQ(q.height, 480u);
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))  // no temporary left behind
    EXPECT_THAT(e.path().filename().string(), ::testing::Not(HasSubstr(".tmp.")));
}

TEST(PlotCommand, BadInputExitsOneWithTheReasonAndKeepsTheOldPicture) {
  bt::TempDir dir;
  std::string run = write_run(dir, "run", kGptCsv);
  ASSERT_EQ(bt::run_process({BOOSTER_CLI_PATH, "plot", run}).exit_code, 0);
  const auto before = std::filesystem::file_size(run + "/metrics.png");
  std::ofstream(run + "/metrics.csv", std::ios::app) << "200,1,2\n";
  auto bad = bt::run_process({BOOSTER_CLI_PATH, "plot", run});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("run/metrics.csv:5: 3 fields, the header has 9"));
  EXPECT_EQ(std::filesystem::file_size(run + "/metrics.png"), before);

  std::string good = write_run(dir, "good", kMnistCsv);
  auto no_gnuplot = bt::run_process({BOOSTER_CLI_PATH, "plot", good, "--gnuplot", "/nonexistent/gnuplot"});
  EXPECT_EQ(no_gnuplot.exit_code, 1);
  EXPECT_THAT(no_gnuplot.output, HasSubstr("apt-get install gnuplot-nox"));
  EXPECT_FALSE(std::filesystem::exists(good + "/metrics.png"));

  auto missing = bt::run_process({BOOSTER_CLI_PATH, "plot", dir.file("absent")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("absent: no such run directory or file"));
  auto usage = bt::run_process({BOOSTER_CLI_PATH, "plot"});
  EXPECT_EQ(usage.exit_code, 2);
}
