// auto_select.cpp — plugin = "auto"'s choice among the estimate rows (see booster/auto_select.h).
#include "booster/auto_select.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "booster/config.h"

namespace booster {
namespace {

int plugin_rank(const std::string& plugin) {
  static const char* kOrder[] = {"torch_ddp", "low_level_zero", "torch_fsdp", "gemini"};
  for (int i = 0; i < 4; ++i)
    if (plugin == kOrder[i]) return i;
  return 4;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string volume(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%gΨ", v);
  return buf;
}

}  // namespace

AutoSelection select_auto_configuration(const std::vector<MemoryEstimate>& rows, int64_t runtime_bytes,
                                        int64_t budget_bytes, const std::string& offload_dir,
                                        bool allow_pipeline) {
  struct Candidate {
    MemoryEstimate row;
    size_t index;  // order among the rows
    int64_t need;
  };
  std::vector<Candidate> candidates;
  AutoSelection out;
  for (size_t i = 0; i < rows.size(); ++i) {
    MemoryEstimate row = rows[i];
    const std::string name = row.plugin + " (" + row.configuration + ")";
    if (!row.data_parallel && !row.pipeline) {
      out.reasons.push_back(name + ": not considered (the model must be built for its mesh)");
      continue;
    }
    if (row.pipeline && !allow_pipeline) {
      out.reasons.push_back(name + ": not considered (data was sharded over the world before boost(): call "
                            "prepare_dataloader / data_parallel_group() after boost() to allow a pipeline mesh)");
      continue;
    }
    auto dir = std::find(row.options.begin(), row.options.end(), "offload_dir=\"\"");
    if (dir != row.options.end()) {
      if (offload_dir.empty()) {
        out.reasons.push_back(name + ": not considered (set auto.offload_dir to allow offloading to disk)");
        continue;
      }
      std::string escaped;
      for (char c : offload_dir) escaped += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      *dir = "offload_dir=\"" + escaped + "\"";
    }
    candidates.push_back({row, i, runtime_bytes + row.total()});
  }
  if (candidates.empty())
    throw ConfigError("plugin = \"auto\": no installed plugin offers a configuration it can choose (every estimate row "
                      "needs a model built for a mesh, or none was reported); set booster.plugin explicitly");
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    // Pipeline meshes last: their bubble ((p-1)/(m+p-1) of the step idle) and activation traffic are
    // not in the ZeRO volumes (ColossalAI's guide keeps hybrid parallelism for the largest models).
    if (a.row.pipeline != b.row.pipeline) return !a.row.pipeline;
    if (a.row.communication_volume != b.row.communication_volume)
      return a.row.communication_volume < b.row.communication_volume;
    if (plugin_rank(a.row.plugin) != plugin_rank(b.row.plugin))
      return plugin_rank(a.row.plugin) < plugin_rank(b.row.plugin);
    if (a.row.plugin != b.row.plugin) return a.row.plugin < b.row.plugin;
    return a.index < b.index;
  });
  const Candidate* chosen = nullptr;
  const Candidate* smallest = &candidates.front();
  for (const Candidate& c : candidates) {
    if (c.need < smallest->need) smallest = &c;
    const std::string line = c.row.plugin + " (" + c.row.configuration + "): needs " + mib(c.need) + " (" +
                             std::to_string(c.need) + " bytes), " + volume(c.row.communication_volume) + " per step";
    if (chosen) {
      out.reasons.push_back(line + (c.need <= budget_bytes ? ", fits, not needed" : ", does not fit"));
    } else if (c.need <= budget_bytes) {
      chosen = &c;
      out.reasons.push_back(line + ", fits: chosen");
    } else {
      out.reasons.push_back(line + ", does not fit");
    }
  }
  if (!chosen)
    throw ConfigError("plugin = \"auto\": no configuration fits in " + mib(budget_bytes) +
                      " per rank; the smallest need is " + mib(smallest->need) + " (" + smallest->row.plugin + ": " +
                      smallest->row.configuration + "). Raise auto.memory_budget_mb, use more ranks" +
                      (offload_dir.empty() ? ", or set auto.offload_dir to let Gemini keep its optimizer side on disk"
                                           : "") +
                      "; `booster estimate` lists every configuration's need");
  out.chosen = chosen->row;
  return out;
}

std::vector<MemoryEstimate> rows_for_communication_dtype(const std::vector<MemoryEstimate>& rows,
                                                         const std::string& dtype) {
  if (dtype.empty()) return rows;
  if (dtype != "bf16" && dtype != "fp8")
    throw std::invalid_argument("booster: auto.communication_dtype must be \"bf16\" or \"fp8\", got \"" + dtype + "\"");
  std::vector<MemoryEstimate> out;
  for (const MemoryEstimate& r : rows) {
    if (r.pipeline || !r.data_parallel) continue;
    const bool bucket_view =
        std::find(r.options.begin(), r.options.end(), "gradient_as_bucket_view=true") != r.options.end();
    const bool takes = (r.plugin == "torch_ddp" && (dtype == "fp8" || !bucket_view)) || r.plugin == "low_level_zero" ||
                       (dtype == "fp8" && (r.plugin == "torch_fsdp" || r.plugin == "gemini"));
    if (!takes) continue;
    MemoryEstimate e = r;
    e.options.push_back("communication_dtype=\"" + dtype + "\"");
    e.configuration += ", communication_dtype = \"" + dtype + "\"";
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace booster
