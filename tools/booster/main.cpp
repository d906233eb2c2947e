// main.cpp — entry point of the `booster` command-line tool. Each feature is a CLI11 subcommand:
// `booster run` (torchrun-like launcher: run_args.h parses, supervisor.h runs), `booster plot`
// (training curves, plot.h), `booster ckpt` and `booster estimate` (exec booster-ckpt /
// booster-estimate). Usage errors exit with 2, `--help` with 0; otherwise the subcommand's exit code.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

extern char** environ;

#include "hostfile.h"
#include "plot.h"
#include "run_args.h"
#include "supervisor.h"

namespace {

// This executable's path, symlinks resolved (/proc/self/exe); empty with `ec` set when unknown.
std::filesystem::path own_path(std::error_code& ec) { return std::filesystem::read_symlink("/proc/self/exe", ec); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"booster: command-line tool of the Booster C++ distributed training SDK", "booster"};
  app.require_subcommand(1);
  app.footer("\nRun 'booster SUBCOMMAND --help' for the options of a subcommand.");

  // `booster ckpt ...` and `booster estimate ...` exec booster-ckpt / booster-estimate from this
  // executable's own directory (never a PATH lookup, so the tools of one install or build tree stay
  // together): they link LibTorch, the launcher does not. /proc/self/exe has symlinks resolved, so a
  // symlinked `booster` works too.
  if (argc > 1 && (std::string(argv[1]) == "ckpt" || std::string(argv[1]) == "estimate")) {
    const std::string sub = argv[1];
    std::error_code ec;
    std::filesystem::path self = own_path(ec);
    if (ec) {
      std::cerr << "booster: cannot find its own directory to run booster-" << sub << " for 'booster " << sub
                << "' (/proc/self/exe: " << ec.message() << "); run booster-" << sub << " directly\n";
      return 127;
    }
    std::string tool = (self.parent_path() / ("booster-" + sub)).string();
    std::vector<char*> args{tool.data()};
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    execv(tool.c_str(), args.data());
    std::cerr << "booster: cannot run " << tool << " for 'booster " << sub << "': " << std::strerror(errno)
              << " (booster-" << sub << " belongs next to booster: reinstall, or build the booster_" << sub
              << " target)\n";
    return 127;  // as a shell does for a command it cannot run
  }
  app.add_subcommand("ckpt", "Inspect, convert or consolidate checkpoints (booster ckpt inspect|convert|consolidate --help)");
  app.add_subcommand("estimate", "Per-rank memory of every installed plugin's configurations for a model size (booster estimate --help)");

  booster::cli::RunOptions run_options;
  CLI::App* run = booster::cli::add_run_subcommand(app, run_options);
  booster::cli::PlotOptions plot_options;
  CLI::App* plot = booster::cli::add_plot_subcommand(app, plot_options);

  // CLI11 would only say "A subcommand is required" for a mistyped subcommand; name it instead.
  auto is_named = [&](CLI::App* sub) { return sub->check_name(argv[1]); };
  if (argc > 1 && argv[1][0] != '-' && app.get_subcommands(is_named).empty()) {
    std::cerr << "booster: unknown subcommand '" << argv[1] << "'\nRun with --help for more information.\n";
    return booster::cli::kRunUsageError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help (code 0) or the error
    return code == 0 ? 0 : booster::cli::kRunUsageError;
  }

  if (run->parsed()) {
    std::string problem = booster::cli::validate_run_options(run_options);
    if (!problem.empty()) {
      std::cerr << "booster run: " << problem << "\nRun with --help for more information.\n";
      return booster::cli::kRunUsageError;
    }
    if (!run_options.hostfile.empty()) {
      // --hostfile: one `booster run` per host through ssh, this executable on every host.
      try {
        const std::vector<std::string> hosts = booster::cli::select_hosts(
            booster::cli::read_hostfile(run_options.hostfile), run_options.include, run_options.exclude,
            run_options.nnodes_given ? run_options.nnodes : 0);
        std::error_code ec;
        const std::string self = own_path(ec).string();
        if (ec) throw std::runtime_error("cannot find this executable's path (/proc/self/exe: " + ec.message() + ")");
        const std::string cwd = std::filesystem::current_path(ec).string();
        if (ec) throw std::runtime_error("cannot find the current directory: " + ec.message());
        for (char** e = environ; *e; ++e) run_options.node_environment.emplace_back(*e);
        run_options.launcher_path = self;
        run_options.cwd = cwd;
        run_options.node_hosts = hosts;
        run_options.nnodes = static_cast<int>(hosts.size());
      } catch (const std::exception& e) {
        std::cerr << "booster run: " << e.what() << "\n";
        return booster::cli::kRunUsageError;
      }
    }
    std::cout.flush();
    return booster::cli::run_launcher(run_options);
  }
  if (plot->parsed()) return booster::cli::run_plot(plot_options);
  return booster::cli::kRunUsageError;
}
