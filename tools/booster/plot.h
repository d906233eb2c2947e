// plot.h — `booster plot RUN_DIR [RUN_DIR...]`: training curves from the examples' metrics.csv as
// one PNG, drawn by gnuplot (Debian's gnuplot-nox, pngcairo terminal), several runs overlaid.
// No LibTorch here: the metrics reader and the script builder are unit-tested in-process
// (tests/unit/plot_test.cpp), the whole command by running the `booster` binary.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace booster::cli {

// A bad metrics.csv, a bad run directory, or gnuplot missing/failing. The message names the file
// (and line) and the fix.
struct PlotError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One run's metrics.csv: the header's column names and the rows, every field a finite number.
struct Metrics {
  std::string path;                       // the metrics.csv read
  std::string label;                      // the run's name in the legend (its directory's name)
  std::vector<std::string> columns;       // header names, in file order
  std::vector<std::vector<double>> rows;  // rows[i].size() == columns.size()
};

// Reads `run` — a run directory holding metrics.csv, or the path of a .csv file itself.
// Throws PlotError naming the file when it is missing or unreadable, empty, has no data row,
// a header with an empty or duplicate name or fewer than 2 columns, a row with a different number
// of fields than the header (line number given), or a field that is not a finite number.
Metrics read_metrics(const std::string& run);

// One picture panel: a y axis shared by the columns that measure the same thing.
struct Panel {
  std::string title;                 // "loss", "accuracy", "bits per byte", "learning rate", "throughput"
  std::vector<std::string> columns;  // the columns drawn in it, in the first run's order
  bool log_y = false;                // learning rates span decades after warm-up and decay
};

// The x column (the first column; every run must have the same one, "step" or "epoch" in the
// examples) and the panels to draw: loss (*loss), accuracy (*accuracy*, *acc), bits per byte
// (*bpb*), learning rate (lr, *_lr), throughput (*per_s). Other columns (elapsed time, counters)
// are left out and named in `skipped`. Throws PlotError when the runs' first columns differ or no
// column of any run falls into a panel.
struct PlotLayout {
  std::string x;
  std::vector<Panel> panels;
  std::vector<std::string> skipped;
};
PlotLayout plot_layout(const std::vector<Metrics>& runs);

// The gnuplot script that draws `layout` for `runs` into the PNG `out_png` of `width` x `height`
// pixels: one panel per layout panel in a grid (1x1, 1x2, 2x2, 2x3), one line per (run, column),
// titled "run: column" when several runs are drawn. Data are read from the runs' csv files.
std::string gnuplot_script(const std::vector<Metrics>& runs, const PlotLayout& layout, const std::string& out_png,
                           int width, int height);

struct PlotOptions {
  std::vector<std::string> runs;  // run directories (or metrics.csv paths), at least one
  std::string out;                // PNG to write; "" = RUN_DIR/metrics.png for one run, ./metrics.png for several
  int width = 1200;               // pixels
  int height = 800;               // pixels
  std::string gnuplot = "gnuplot";  // program, looked up in PATH if it has no '/'
};

// Adds the `plot` subcommand with its options to `app`. Returns the subcommand.
CLI::App* add_plot_subcommand(CLI::App& app, PlotOptions& options);

// Draws the PNG: reads every run, builds the layout and the script, runs gnuplot on it writing to
// a temporary file next to the output, and renames it into place (an existing PNG is replaced
// only by a complete one). Prints the output path and the skipped columns to stdout. Returns 0,
// or prints the error to stderr and returns 1 (bad metrics, gnuplot missing: the message says to
// install gnuplot-nox or pass --gnuplot, gnuplot failing: its exit status).
int run_plot(const PlotOptions& options);

}  // namespace booster::cli
