// estimate_main.cpp — `booster-estimate` (run as `booster estimate ...`): per-rank memory of every
// installed plugin's configurations for a model given by its parameter count on the command line
// (booster/estimate.h). For a model built in C++, run its trainer with --set booster.estimate=true
// instead: that measures the activations of one real micro-batch. A separate executable because it
// links LibTorch (plugins are LibTorch libraries); `booster estimate` execs it.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "booster/core/activation_estimate.h"
#include "booster/dist/environment.h"
#include "booster/dist/process_group.h"
#include "booster/estimate.h"

namespace {

// "124M", "1.3B", "51394560", "7e9" -> elements. Throws CLI::ValidationError.
int64_t parse_count(const std::string& text) {
  if (text.empty()) throw CLI::ValidationError("count", "empty");
  double scale = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': scale = 1e3; digits.pop_back(); break;
    case 'M': case 'm': scale = 1e6; digits.pop_back(); break;
    case 'B': case 'b': case 'G': case 'g': scale = 1e9; digits.pop_back(); break;
    default: break;
  }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != digits.size() || !(v >= 0) || !std::isfinite(v))
    throw CLI::ValidationError("count", "'" + text + "' is not a count (examples: 124M, 1.3B, 51394560)");
  return static_cast<int64_t>(std::llround(v * scale));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"booster estimate: per-rank memory of every installed plugin's configurations for a model of a given "
               "size (for a C++ trainer, run it with --set booster.estimate=true: it measures the activations)",
               "booster estimate"};
  std::string params_text, largest_param_text, largest_unit_text;
  int64_t units = 0, layers = 0;
  int world_size = 1;
  std::string precision = "fp32", optimizer = "adamw";
  double activation_mb = 0, memory_mb = 0;
  app.add_option("--params", params_text, "Parameters Ψ (elements): 124M, 1.3B, 51394560")->required();
  app.add_option("--largest_parameter", largest_param_text,
                 "Elements of the largest parameter tensor (optimizer temporaries; default: the largest unit)");
  app.add_option("--largest_unit", largest_unit_text,
                 "Elements of the largest shard unit (nn::Unit; default: Ψ / units, or Ψ without units)");
  app.add_option("--units", units, "nn::Units the model is wrapped in (0: none)")->check(CLI::NonNegativeNumber);
  app.add_option("--layers", layers, "Layers of a PipelineModule (0: not pipelined; no pipeline meshes)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--world_size", world_size, "Ranks to estimate for")->check(CLI::Range(1, 1 << 20));
  app.add_option("--precision", precision, "Training precision")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--optimizer", optimizer, "Optimizer (its state per parameter: adamw/adam 8 bytes, "
                                           "sgd_momentum 4, sgd 0)")
      ->check(CLI::IsMember({"adamw", "adam", "sgd_momentum", "sgd"}));
  app.add_option("--activation_mb", activation_mb, "Activations of one micro-batch on one rank, MiB (0: not counted)")
      ->check(CLI::NonNegativeNumber);
  // Activations from the transformer's shape (core/activation_estimate.h, Korthikanti et al. 2022),
  // with the recomputation the run will use, for one rank without tensor or sequence parallelism
  // (the plugins' mesh rows divide it).
  booster::TransformerShape shape;
  booster::ActivationOptions act;
  app.add_option("--num_layers", shape.layers, "Transformer blocks (with --hidden_size etc.: activations from the "
                                               "shape, Korthikanti et al.'s formula; instead of --activation_mb)");
  app.add_option("--hidden_size", shape.hidden, "Hidden size h");
  app.add_option("--num_heads", shape.heads, "Attention heads");
  app.add_option("--seq_length", shape.seq_length, "Tokens per sequence");
  app.add_option("--micro_batch_size", shape.micro_batch, "Sequences per micro-batch per data-parallel rank");
  app.add_option("--vocab_size", shape.vocab, "Vocabulary (the head's logits; 0: not counted)");
  app.add_option("--activation_checkpointing", act.checkpointing,
                 "Recomputation the run uses ([booster] activation_checkpointing)")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  app.add_option("--selective_ac_every", act.selective_every, "[booster] selective_ac_every (selective: every k-th block)")
      ->check(CLI::PositiveNumber);
  app.add_option("--memory_mb", memory_mb,
                 "Memory per rank to fit in, MiB (default: MemAvailable / world size, all ranks on this machine)")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    booster::EstimateRequest r;
    r.parameters = parse_count(params_text);
    if (r.parameters < 1) throw CLI::ValidationError("--params", "must be at least 1");
    r.units = units;
    r.largest_unit = largest_unit_text.empty() ? (units > 0 ? (r.parameters + units - 1) / units : r.parameters)
                                               : parse_count(largest_unit_text);
    r.largest_parameter = largest_param_text.empty() ? r.largest_unit : parse_count(largest_param_text);
    if (r.largest_unit > r.parameters || r.largest_parameter > r.parameters)
      throw CLI::ValidationError("--largest_unit/--largest_parameter", "cannot exceed --params");
    r.layers = layers;
    r.world_size = world_size;
    r.precision = precision;
    r.optimizer_state_bytes_per_parameter = optimizer == "sgd" ? 0 : optimizer == "sgd_momentum" ? 4 : 8;
    r.activation_bytes = static_cast<int64_t>(activation_mb * 1024 * 1024);
    const bool from_shape = app.count("--num_layers") + app.count("--hidden_size") + app.count("--num_heads") +
                                app.count("--seq_length") + app.count("--micro_batch_size") > 0;
    const bool shape_only = app.count("--vocab_size") + app.count("--activation_checkpointing") +
                                app.count("--selective_ac_every") > 0;
    std::string activation_note = r.activation_bytes > 0 ? "as given" : "not counted (--activation_mb, or the shape: "
                                                                        "--num_layers --hidden_size --num_heads "
                                                                        "--seq_length --micro_batch_size)";
    if (from_shape && activation_mb > 0)
      throw CLI::ValidationError("--activation_mb", "give either --activation_mb or the transformer's shape "
                                                    "(--num_layers ...), not both");
    if (shape_only && !from_shape)
      throw CLI::ValidationError("--activation_checkpointing/--selective_ac_every/--vocab_size", "these shape the formula's activations: "
                                 "give the transformer's shape too (--num_layers --hidden_size --num_heads --seq_length "
                                 "--micro_batch_size)");
    if (from_shape) {
      act.precision = precision;
      r.activation_bytes = booster::transformer_activation_bytes(shape, act);
      booster::ActivationOptions plain = act;
      plain.checkpointing = "none";
      char line[320];
      std::snprintf(line, sizeof line,
                    "%.1f MiB from the shape (Korthikanti et al. 2022; %lld layers, h %lld, %lld heads, s %lld, b %lld, "
                    "%s, activation_checkpointing %s; one rank's, the mesh rows divide it), %.1f MiB without "
                    "recomputation",
                    static_cast<double>(r.activation_bytes) / (1 << 20), static_cast<long long>(shape.layers),
                    static_cast<long long>(shape.hidden), static_cast<long long>(shape.heads),
                    static_cast<long long>(shape.seq_length), static_cast<long long>(shape.micro_batch),
                    precision.c_str(), act.checkpointing.c_str(),
                    static_cast<double>(booster::transformer_activation_bytes(shape, plain)) / (1 << 20));
      activation_note = line;
    }
    std::vector<std::string> no_args;
    auto world = booster::dist::launch_auto(no_args);  // one process: plugins need a world to be created
    const int64_t runtime = booster::resident_memory_bytes();
    const int64_t budget = memory_mb > 0 ? static_cast<int64_t>(memory_mb * 1024 * 1024)
                                         : booster::available_memory_bytes() / world_size;
    booster::EstimateTable table = booster::estimate_installed_plugins(r, world);
    std::cout << booster::format_estimate_table(r, table, runtime, budget)
              << "  runtime: this process's resident memory (LibTorch and Gloo loaded), the least a rank holds\n"
              << "  activations: " << activation_note << "\n";
    return 0;
  } catch (const CLI::Error& e) {
    std::cerr << "booster estimate: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "booster estimate: " << e.what() << "\n";
    return 1;
  }
}
