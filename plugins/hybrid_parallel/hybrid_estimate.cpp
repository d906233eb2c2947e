// hybrid_estimate.cpp — hybrid_parallel's memory estimate rows (hybrid_estimate.h).
#include "hybrid_estimate.h"

#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "booster/parallel/pipeline_schedule.h"

namespace booster::hybrid {

using parallel::partition_layers;
using parallel::ScheduleKind;
using parallel::stage_rank;

std::vector<MemoryEstimate> hybrid_estimate_memory(const EstimateRequest& r, int64_t zero_bucket_elements) {
  if (r.precision == "fp16" && !torch::cuda::is_available()) return {};
  const int64_t bytes = precision_bytes(r.precision);
  std::vector<MemoryEstimate> out;
  struct SeqPar {
    std::string mode;  // "" | "split_gather" | "all_to_all"
    int sp = 1;        // all_to_all's sp_size (the mesh's sp dim)
  };
  for (int tp = 1; tp <= r.world_size; tp *= 2) {
    for (int pp = 1; tp * pp <= r.world_size; ++pp) {
      if (r.world_size % (tp * pp) != 0) continue;
      if (pp > 1 && pp > r.layers) continue;
      std::vector<SeqPar> variants;
      if (tp * pp > 1) variants.push_back({"", 1});
      if (pp == 1 && tp > 1) variants.push_back({"split_gather", 1});
      for (int sp = 2; pp == 1 && tp * sp <= r.world_size; sp *= 2)
        if (r.world_size % (tp * sp) == 0) variants.push_back({"all_to_all", sp});
      // The replicas that average gradients (and that ZeRO shards over): dp, times sp under all_to_all.
      const int replicas = r.world_size / (tp * pp);
      const double tp_share = (10.0 + 24.0 / tp) / 34.0;  // tensor parallelism alone
      for (bool zbv : {false, true}) {
        if (zbv && (pp == 1 || r.layers < 2 * pp)) continue;
        // This rank's share: the ranks' largest under the default (uniform) partition when the
        // layers' sizes are known, else Ψ / pp; over tp. zbv: the V's two stages per rank.
        int64_t stage = (r.parameters + pp - 1) / pp;
        if (pp > 1 && static_cast<int64_t>(r.layer_parameters.size()) == r.layers) {
          const ScheduleKind kind = zbv ? ScheduleKind::kZeroBubbleV : ScheduleKind::k1F1B;
          const int chunks = zbv ? 2 : 1;
          std::vector<int64_t> per_rank(static_cast<size_t>(pp), 0);
          const auto ranges = partition_layers(static_cast<int>(r.layers), pp * chunks, false, {});
          for (int v = 0; v < pp * chunks; ++v)
            for (int i = ranges[v].first; i < ranges[v].second; ++i)
              per_rank[static_cast<size_t>(stage_rank(kind, pp, v))] += r.layer_parameters[static_cast<size_t>(i)];
          stage = *std::max_element(per_rank.begin(), per_rank.end());
        }
        const int64_t local = (stage + tp - 1) / tp;
        const int64_t largest = (r.largest_parameter + tp - 1) / tp;
        // zero_stage 3's FlatParameter: the largest unit (the whole stage for a model without units).
        const int64_t unit = (std::min(r.largest_unit, stage) + tp - 1) / tp;
        const int microbatches = zbv ? 2 * pp : pp;  // the row's num_microbatches
        for (const SeqPar& v : variants) {
          if (zbv && !v.mode.empty()) continue;  // sequence parallelism runs with pp = 1
          for (int zero : {0, 1, 2, 3}) {
            if (zero >= 1 && replicas == 1) continue;  // ZeRO over one rank shards nothing: zero_stage 0's row
            // The plugin's refusals (hybrid_parallel_plugin.cpp, parse_options).
            if (zero == 2 && pp > 1) continue;
            MemoryEstimate e;
            if (zero == 0) {
              e = replicated_estimate(r, local, bytes, true, 0, largest);
            } else if (zero <= 2) {
              e = zero_estimate(r, zero, local, replicas, bytes, zero_bucket_elements, largest);
            } else {
              // fully_shard over dp: fp32 shards, gathered in the compute dtype; a pipeline stage's
              // micro-batches keep it gathered and accumulate their gradients unreduced.
              FullyShardedSchedule schedule;
              schedule.shard_group = replicas;
              schedule.gathered_bytes = bytes;
              schedule.keep_gathered = schedule.accumulate_gradients = pp > 1;
              e = fully_sharded_estimate(r, local, unit, schedule);
            }
            const double share = v.mode == "split_gather" ? 1.0 / tp : tp_share / v.sp;
            e.activations = static_cast<int64_t>(std::llround(static_cast<double>(r.activation_bytes) * share)) / pp;
            // dp traffic per step in units of this rank's part: 2 (allreduce, or ZeRO-1/2's reduce-scatter
            // and all-gather); ZeRO-3 3, and under a pipeline at most an all-gather per micro-batch's
            // forward and backward of each unit plus one reduce-scatter (2 without units: one gather).
            const double per_part = zero < 3 ? 2.0 : pp == 1 ? 3.0 : r.units > 0 ? 2.0 * microbatches + 1 : 2.0;
            e.communication_volume =
                replicas > 1 ? per_part * static_cast<double>(local) / static_cast<double>(r.parameters) : 0.0;
            e.data_parallel = false;
            e.pipeline = tp == 1 && v.mode.empty();
            e.configuration = "tp_size = " + std::to_string(tp) + ", pp_size = " + std::to_string(pp) +
                              (zbv ? ", pp_style = \"zbv\", num_model_chunks = 2" : "") +
                              ", zero_stage = " + std::to_string(zero) + ", precision = \"" + r.precision + "\"";
            e.options = {"tp_size=" + std::to_string(tp), "pp_size=" + std::to_string(pp),
                         "zero_stage=" + std::to_string(zero), "precision=\"" + r.precision + "\""};
            if (zbv) {
              e.options.push_back("pp_style=\"zbv\"");
              e.options.push_back("num_model_chunks=2");
              e.options.push_back("num_microbatches=" + std::to_string(microbatches));
            } else if (pp > 1) {
              e.options.push_back("num_microbatches=" + std::to_string(microbatches));
            }
            if (!v.mode.empty()) {
              e.configuration += ", sequence_parallelism_mode = \"" + v.mode + "\"" +
                                 (v.mode == "all_to_all" ? ", sp_size = " + std::to_string(v.sp) : std::string());
              e.options.push_back("enable_sequence_parallelism=true");
              e.options.push_back("sequence_parallelism_mode=\"" + v.mode + "\"");
              if (v.mode == "all_to_all") e.options.push_back("sp_size=" + std::to_string(v.sp));
            }
            e.note = e.pipeline ? "plus activation traffic (pp sends); train with booster.execute_pipeline"
                     : v.mode == "all_to_all"
                         ? "plus activation traffic (all-to-alls around attention" + std::string(tp > 1 ? ", tp collectives" : "") +
                               "); the model must be built for the mesh (sequence a multiple of sp_size, heads divisible by it)"
                     : v.mode == "split_gather"
                         ? "plus activation traffic (tp all-gathers and reduce-scatters); the model must be built for the "
                           "mesh (sequence a multiple of tp_size)"
                         : "plus activation traffic (tp allreduces, pp sends); the model must be built for the mesh";
            if (zero == 3 && r.units == 0) e.note += "; the model has no nn::Unit: each rank's part is one unit, gathered whole";
            place_on_device(r, e);  // again: the activations changed above (cuda: all in device memory)
            out.push_back(std::move(e));
          }
        }
      }
    }
  }
  return out;
}

}  // namespace booster::hybrid
