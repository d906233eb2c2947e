// booster_lora.cpp — the Booster's LoRA entry points (booster.h: enable_lora, save_lora_as_pretrained,
// load_lora) and the optimizer filtering boost() applies to frozen parameters.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "booster/booster.h"
#include "booster/checkpoint/peft_lora.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/io/atomic_write.h"
#include "booster/logging.h"
#include "booster/nn/lora.h"
#include "booster_impl.h"

namespace booster {

nn::LoraReport Booster::enable_lora(torch::nn::Module& model, const nn::LoraConfig& config) {
  if (impl_->boosted.count(&model))
    throw std::logic_error("booster: enable_lora: this model was already boosted, so its optimizer cannot hold the "
                           "adapters; call enable_lora before boost()");
  nn::LoraReport report = nn::enable_lora(model, config);
  {
    const double pct = report.total_parameters > 0
                           ? 100.0 * static_cast<double>(report.trainable_parameters) / static_cast<double>(report.total_parameters)
                           : 0.0;
    char line[200];
    std::snprintf(line, sizeof line, "%zu layers, r = %lld, trainable parameters %lld of %lld (%.3f%%) on this rank",
                  report.modules.size(), static_cast<long long>(config.r),
                  static_cast<long long>(report.trainable_parameters), static_cast<long long>(report.total_parameters), pct);
    log::info(std::string("booster: LoRA: ") + line);
  }
  return report;
}

std::shared_ptr<const checkpoint::StateDictAdapter> Booster::lora_adapter_of(torch::nn::Module& module,
                                                                             const std::string& base, const char* what) {
  auto adapter = state_dict_adapter_of(module);
  if (!adapter)
    throw std::invalid_argument(std::string("booster: ") + what + ": the model has no state-dict adapter, which gives "
                                "the HuggingFace module names PEFT's files use; call set_state_dict_adapter(model, "
                                "make_state_dict_adapter(\"<architecture>\", config)) first");
  return checkpoint::lora_state_dict_adapter(module, base, *adapter);
}

namespace {
std::set<std::string> lora_tensor_names(torch::nn::Module& module) {
  std::set<std::string> names;
  for (const auto& m : nn::lora_modules(module))
    for (const char* t : {".lora_A.weight", ".lora_B.weight"}) names.insert(m.empty() ? std::string(t + 1) : m + t);
  return names;
}
}  // namespace

std::shared_ptr<const checkpoint::StateDictAdapter> Booster::without_lora(
    torch::nn::Module& module, std::shared_ptr<const checkpoint::StateDictAdapter> adapter) {
  if (!adapter || adapter->format().partial) return adapter;
  const std::set<std::string> lora = lora_tensor_names(module);
  if (lora.empty()) return adapter;
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters(true))
    if (!lora.count(item.key())) names.push_back(item.key());
  for (const auto& item : module.named_buffers(true)) names.push_back(item.key());
  adapter->check_covers(names);
  checkpoint::AdapterFormat format = adapter->format();
  format.partial = true;
  return adapter->with_format(format);
}

namespace {

// Removes dir's <name>.safetensors.index.json, the shard files its weight_map names, and the config
// file. Throws std::runtime_error naming a file that cannot be removed.
void remove_stage_files(const std::string& dir, const std::string& name, const std::string& config_file) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / (name + ".safetensors.index.json");
  std::set<std::string> files{index.string(), (fs::path(dir) / config_file).string()};
  std::ifstream in(index);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("weight_map") && j["weight_map"].is_object())
    for (const auto& item : j["weight_map"].items())
      if (item.value().is_string()) files.insert((fs::path(dir) / item.value().get<std::string>()).string());
  for (const std::string& f : files) {
    std::error_code ec;
    fs::remove(f, ec);
    if (ec) throw std::runtime_error("cannot remove '" + f + "': " + ec.message());
  }
}

}  // namespace

void Booster::merge_into_one_file(const std::string& dir, const checkpoint::StateDictAdapter& adapter) {
  const std::string name = adapter.format().weights_name;
  std::string error;
  if (impl_->world->rank() == 0 && std::filesystem::exists(dir + "/" + name + ".safetensors.index.json")) {
    try {
      checkpoint::StateDict state = checkpoint::load_state_dict(dir, name);
      // Inside an asynchronous save (checkpoint/async_save.h; hybrid_parallel writes its files
      // blocking) the directory is the save's own temporary set and is written into in place, not
      // replaced: the stage files, their index and the config go first.
      if (io::thread_write_interceptor()) remove_stage_files(dir, name, adapter.format().config_file);
      checkpoint::save_state_dict(dir, state, checkpoint::SaveOptions{}, name,
                                  {{adapter.format().config_file, adapter.config_json_text()}});
    } catch (const std::exception& e) {
      error = std::string("booster: save_lora_as_pretrained: merging the stages' files of ") + dir +
              " into one: " + e.what();
    }
  }
  if (impl_->world->size() > 1) error = impl_->world->broadcast_string(error, 0);
  if (!error.empty()) throw checkpoint::CheckpointError(error);
}

void Booster::check_no_lora_through(torch::nn::Module& module, const checkpoint::StateDictAdapter* adapter) {
  if (!adapter || adapter->format().partial) return;
  const std::vector<std::string> layers = nn::lora_modules(module);
  if (layers.empty()) return;
  throw checkpoint::CheckpointError("booster: the model has unmerged LoRA adapters on " + std::to_string(layers.size()) +
                                    " layers (" + layers.front() + (layers.size() > 1 ? ", ..." : "") + "), which " +
                                    adapter->architecture() + " has no tensors for: save them with "
                                    "save_lora_as_pretrained (PEFT's layout), or merge them into the weights first "
                                    "(nn::merge_lora); without an adapter save_model writes every tensor");
}

}  // namespace booster
