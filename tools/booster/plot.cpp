// plot.cpp — `booster plot` (see plot.h): metrics.csv reader, panel layout, gnuplot script, and
// running gnuplot.
#include "plot.h"

#include <CLI/CLI.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

extern char** environ;

namespace booster::cli {
namespace {

namespace fs = std::filesystem;

std::string trim(const std::string& s) {
  const char* ws = " \t\r";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) out.push_back(trim(field));
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The panel a column belongs to, or "" when it is not drawn.
std::string panel_of(const std::string& column) {
  if (ends_with(column, "loss")) return "loss";
  if (contains(column, "accuracy") || ends_with(column, "acc")) return "accuracy";
  if (contains(column, "bpb")) return "bits per byte";
  if (column == "lr" || ends_with(column, "_lr")) return "learning rate";
  if (ends_with(column, "per_s")) return "throughput";
  return "";
}

// A gnuplot single-quoted string: backslashes are literal there, a quote is doubled.
std::string gnuplot_string(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

int column_index(const Metrics& run, const std::string& name) {
  for (size_t i = 0; i < run.columns.size(); ++i)
    if (run.columns[i] == name) return static_cast<int>(i) + 1;  // gnuplot counts from 1
  return 0;
}

std::string default_output(const PlotOptions& options) {
  if (!options.out.empty()) return options.out;
  if (options.runs.size() == 1) {
    fs::path run(options.runs[0]);
    if (fs::is_directory(run)) return (run / "metrics.png").string();
    return (run.parent_path() / "metrics.png").string();
  }
  return "metrics.png";
}

// Runs `program script` and waits. Throws PlotError when it cannot start or does not exit 0.
void run_gnuplot(const std::string& program, const std::string& script) {
  std::vector<char*> argv{const_cast<char*>(program.c_str()), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  int rc = program.find('/') == std::string::npos
               ? posix_spawnp(&pid, program.c_str(), nullptr, nullptr, argv.data(), environ)
               : posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0)
    throw PlotError("cannot run '" + program + "': " + std::strerror(rc) +
                    " (install gnuplot: apt-get install gnuplot-nox, or pass --gnuplot PATH)");
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw PlotError("waiting for gnuplot: " + std::string(std::strerror(errno)));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    throw PlotError("cannot run '" + program + "' (install gnuplot: apt-get install gnuplot-nox, or pass --gnuplot PATH)");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw PlotError("'" + program + "' failed on the script " + script + " (" +
                    (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                       : "signal " + std::to_string(WTERMSIG(status))) +
                    ")");
}

}  // namespace

Metrics read_metrics(const std::string& run) {
  fs::path path(run);
  Metrics m;
  m.path = path.string();
  if (!fs::exists(path))
    throw PlotError(m.path + ": no such run directory or file (pass a run directory holding metrics.csv, or the csv)");
  if (fs::is_directory(path)) path /= "metrics.csv";
  m.path = path.string();
  m.label = fs::absolute(path).lexically_normal().parent_path().filename().string();
  std::ifstream in(path);
  if (!fs::is_regular_file(path) || !in)
    throw PlotError(m.path + ": no such file (a run directory holds the metrics.csv the examples write; pass "
                             "the directory or the csv itself)");
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (trim(line).empty()) continue;
    std::vector<std::string> fields = split_csv(line);
    if (m.columns.empty()) {
      if (fields.size() < 2)
        throw PlotError(m.path + ":" + std::to_string(line_no) +
                        ": the header needs an x column and at least one value column, got '" + line + "'");
      std::set<std::string> seen;
      for (const auto& f : fields) {
        if (f.empty()) throw PlotError(m.path + ":" + std::to_string(line_no) + ": the header has an empty column name");
        if (!seen.insert(f).second)
          throw PlotError(m.path + ":" + std::to_string(line_no) + ": the header names column '" + f + "' twice");
      }
      m.columns = fields;
      continue;
    }
    if (fields.size() != m.columns.size())
      throw PlotError(m.path + ":" + std::to_string(line_no) + ": " + std::to_string(fields.size()) +
                      " fields, the header has " + std::to_string(m.columns.size()));
    std::vector<double> row;
    for (size_t i = 0; i < fields.size(); ++i) {
      const char* text = fields[i].c_str();
      char* end = nullptr;
      errno = 0;
      double v = std::strtod(text, &end);
      if (fields[i].empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
        throw PlotError(m.path + ":" + std::to_string(line_no) + ": column '" + m.columns[i] + "' holds '" +
                        fields[i] + "', not a finite number");
      row.push_back(v);
    }
    m.rows.push_back(std::move(row));
  }
  if (in.bad()) throw PlotError(m.path + ": read error: " + std::strerror(errno));
  if (m.columns.empty()) throw PlotError(m.path + ": the file is empty (no header)");
  if (m.rows.empty()) throw PlotError(m.path + ": a header but no data row yet (the run has not logged a step)");
  return m;
}

PlotLayout plot_layout(const std::vector<Metrics>& runs) {
  if (runs.empty()) throw PlotError("no run to plot");
  PlotLayout layout;
  layout.x = runs[0].columns[0];
  for (const auto& run : runs)
    if (run.columns[0] != layout.x)
      throw PlotError("runs with different x columns cannot share a picture: " + runs[0].path + " has '" + layout.x +
                      "', " + run.path + " has '" + run.columns[0] + "'");
  static const char* kOrder[] = {"loss", "accuracy", "bits per byte", "learning rate", "throughput"};
  std::set<std::string> skipped_seen;
  for (const char* title : kOrder) {
    Panel panel{title, {}};
    for (const auto& run : runs)
      for (size_t i = 1; i < run.columns.size(); ++i)
        if (panel_of(run.columns[i]) == title &&
            std::find(panel.columns.begin(), panel.columns.end(), run.columns[i]) == panel.columns.end())
          panel.columns.push_back(run.columns[i]);
    if (!panel.columns.empty()) layout.panels.push_back(std::move(panel));
  }
  for (const auto& run : runs)
    for (size_t i = 1; i < run.columns.size(); ++i)
      if (panel_of(run.columns[i]).empty() && skipped_seen.insert(run.columns[i]).second)
        layout.skipped.push_back(run.columns[i]);
  if (layout.panels.empty())
    throw PlotError("nothing to plot in " + runs[0].path +
                    ": no column named like a loss (*loss), accuracy, bits per byte (*bpb), learning rate (lr) "
                    "or throughput (*per_s)");
  return layout;
}

std::string gnuplot_script(const std::vector<Metrics>& runs, const PlotLayout& layout, const std::string& out_png,
                           int width, int height) {
  const size_t n = layout.panels.size();
  const int rows = n <= 2 ? 1 : 2;
  const int cols = n == 1 ? 1 : n <= 4 ? 2 : 3;
  std::string title = runs.size() == 1 ? runs[0].label : "";
  for (size_t r = 0; r < runs.size() && runs.size() > 1; ++r) title += (r ? " vs " : "") + runs[r].label;
  std::ostringstream s;
  s << "set terminal pngcairo size " << width << "," << height << " noenhanced\n"
    << "set output " << gnuplot_string(out_png) << "\n"
    << "set datafile separator ','\n"
    << "set grid\n"
    << "set key top right\n"
    << (layout.x == "epoch" ? "set xtics 1\n" : "")
    << "set multiplot layout " << rows << "," << cols << " title " << gnuplot_string(title) << "\n";
  for (const Panel& panel : layout.panels) {
    s << "set title " << gnuplot_string(panel.title) << "\n"
      << "set xlabel " << gnuplot_string(layout.x) << "\n";
    std::vector<std::string> lines;
    for (const auto& run : runs)
      for (const auto& column : panel.columns) {
        int y = column_index(run, column);
        if (y == 0) continue;
        std::string name = runs.size() > 1 ? run.label + ": " + column : column;
        lines.push_back(gnuplot_string(run.path) + " skip 1 using 1:" + std::to_string(y) + " with " +
                        (run.rows.size() <= 50 ? "linespoints" : "lines") + " lw 2 title " + gnuplot_string(name));
      }
    s << "plot ";
    for (size_t i = 0; i < lines.size(); ++i) s << (i ? ", \\\n     " : "") << lines[i];
    s << "\n";
  }
  s << "unset multiplot\nset output\n";
  return s.str();
}

CLI::App* add_plot_subcommand(CLI::App& app, PlotOptions& options) {
  CLI::App* plot = app.add_subcommand(
      "plot", "Draw training curves (loss, accuracy / bits per byte, learning rate, throughput) from metrics.csv "
              "into a PNG with gnuplot; several runs are overlaid");
  plot->add_option("runs", options.runs, "Run directories holding metrics.csv (or the csv files)")->required();
  plot->add_option("-o,--out", options.out, "PNG to write (default RUN_DIR/metrics.png for one run, ./metrics.png for several)");
  plot->add_option("--width", options.width, "Picture width in pixels")->check(CLI::Range(200, 10000));
  plot->add_option("--height", options.height, "Picture height in pixels")->check(CLI::Range(150, 10000));
  plot->add_option("--gnuplot", options.gnuplot, "gnuplot program (Debian: apt-get install gnuplot-nox)");
  return plot;
}

int run_plot(const PlotOptions& options) {
  std::string tmp_png, script_path;
  try {
    std::vector<Metrics> runs;
    for (const auto& run : options.runs) runs.push_back(read_metrics(run));
    PlotLayout layout = plot_layout(runs);
    fs::path out = fs::absolute(default_output(options));
    if (!fs::is_directory(out.parent_path()))
      throw PlotError("cannot write " + out.string() + ": " + out.parent_path().string() + " is not a directory");
    const std::string suffix = ".tmp." + std::to_string(getpid());
    tmp_png = out.string() + suffix;
    script_path = out.string() + ".gp" + suffix;
    {
      std::ofstream script(script_path);
      script << gnuplot_script(runs, layout, tmp_png, options.width, options.height);
      if (!script.flush()) throw PlotError("cannot write " + script_path + ": " + std::strerror(errno));
    }
    run_gnuplot(options.gnuplot, script_path);
    if (!fs::is_regular_file(tmp_png) || fs::file_size(tmp_png) == 0)
      throw PlotError("'" + options.gnuplot + "' wrote no picture (does it have the pngcairo terminal? Debian's "
                                              "gnuplot-nox has)");
    fs::rename(tmp_png, out);
    fs::remove(script_path);
    std::cout << "booster plot: wrote " << out.string() << " (" << runs.size() << " run" << (runs.size() > 1 ? "s" : "")
              << ", " << layout.panels.size() << " panels";
    if (!layout.skipped.empty()) {
      std::cout << "; not drawn:";
      for (const auto& c : layout.skipped) std::cout << " " << c;
    }
    std::cout << ")\n";
    return 0;
  } catch (const std::exception& e) {
    std::error_code ec;
    if (!tmp_png.empty()) fs::remove(tmp_png, ec);
    if (!script_path.empty()) fs::remove(script_path, ec);
    std::cerr << "booster plot: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace booster::cli
