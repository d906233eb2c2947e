// auto_select.h — how plugin = "auto" picks its configuration at boost(): among every installed
// plugin's estimate rows (estimate.h) that keep the model as built (data_parallel, or pipeline:
// split into stages at boost()), the ones whose per-rank total fits the budget, the least
// communication volume per step (ZeRO paper, section 7: DDP and ZeRO-1/2 2Ψ, ZeRO-3 3Ψ; a pipeline
// mesh its dp gradient volume); ties go to the simpler strategy, in the order torch_ddp,
// low_level_zero, torch_fsdp, gemini, then other plugins by name, and within a plugin its own row
// order (each plugin lists its rows from the fastest to the most memory-frugal). Pipeline rows come
// after every data-parallel row: the pipeline bubble and the activation traffic are not in those
// volumes, so a pipeline mesh is chosen only when no data-parallel configuration fits (and the
// trainer must then run booster.execute_pipeline, as examples/gpt does when pp_size > 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "booster/core/memory_estimate.h"
#include "booster/export.h"

namespace booster {

struct AutoSelection {
  MemoryEstimate chosen;             // the row picked, its options completed (offload_dir filled in)
  std::vector<std::string> reasons;  // one line per candidate: need, fits or not, why not chosen
};

// rows: every plugin's estimate rows (plugin names filled in). runtime_bytes is added to each row's
// total; budget_bytes is per rank. A row with an option `offload_dir=""` (Gemini's offload row) is a
// candidate only when offload_dir is not empty, which is then put into it. allow_pipeline = false
// leaves the pipeline rows out (the trainer already sharded its data over the world: the Booster
// passes false when prepare_dataloader or data_parallel_group() was called before boost()). Throws
// ConfigError naming the budget, the smallest need and its configuration when nothing fits, or when
// no row is a candidate at all (the message lists the plugins and why).
BOOSTER_API AutoSelection select_auto_configuration(const std::vector<MemoryEstimate>& rows, int64_t runtime_bytes,
                                                    int64_t budget_bytes, const std::string& offload_dir,
                                                    bool allow_pipeline = true);

// [auto] communication_dtype: the rows of `rows` whose plugin can send that wire dtype, each with
// `communication_dtype="<dtype>"` added to its options and configuration. "bf16": torch_ddp (not its
// gradient_as_bucket_view rows: the buckets are then the gradients) and low_level_zero; "fp8":
// those (all rows) and torch_fsdp and gemini (dist/fp8.h); pipeline and tensor-parallel rows
// (hybrid_parallel) never. "" returns `rows` unchanged. Throws std::invalid_argument for another
// dtype. Communication volumes (elements) are unchanged; the bytes per element are the dtype's.
BOOSTER_API std::vector<MemoryEstimate> rows_for_communication_dtype(const std::vector<MemoryEstimate>& rows,
                                                                     const std::string& dtype);

}  // namespace booster
