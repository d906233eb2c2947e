// pipeline_schedule.cpp — the 1F1B, interleaved and GPipe orders, and their simulation.
#include "pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace booster::hybrid {

namespace {

using Kind = PipelineAction::Kind;

// Interleaved: the k-th forward (or backward) of a rank, in Megatron-LM's order: micro-batches in
// groups of pp, each group through chunk 0, then chunk 1, ... (backward: the last chunk first).
PipelineAction interleaved_action(int k, int pp, int chunks, bool forward) {
  const int in_group = k % (pp * chunks);
  int chunk = in_group / pp;
  if (!forward) chunk = chunks - 1 - chunk;
  const int microbatch = (k / (pp * chunks)) * pp + k % pp;
  return {forward ? Kind::kForward : Kind::kBackward, microbatch, chunk};
}

}  // namespace

ScheduleKind schedule_kind_from_name(const std::string& pp_style, int chunks) {
  if (pp_style == "interleaved") return ScheduleKind::kInterleaved;
  if (pp_style == "1f1b") return chunks > 1 ? ScheduleKind::kInterleaved : ScheduleKind::k1F1B;
  if (pp_style == "gpipe") return ScheduleKind::kGPipe;
  throw std::invalid_argument("booster: unknown pp_style \"" + pp_style + "\" (use \"1f1b\", \"interleaved\" or \"gpipe\")");
}

std::vector<PipelineAction> make_schedule(ScheduleKind kind, int pp, int rank, int microbatches, int chunks,
                                          bool forward_only) {
  if (pp < 1) throw std::invalid_argument("booster: pipeline schedule: pp_size must be >= 1");
  if (rank < 0 || rank >= pp)
    throw std::invalid_argument("booster: pipeline schedule: rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(pp) + ")");
  if (microbatches < 1) throw std::invalid_argument("booster: pipeline schedule: num_microbatches must be >= 1");
  if (chunks < 1) throw std::invalid_argument("booster: pipeline schedule: num_model_chunks must be >= 1");
  if (chunks > 1 && kind != ScheduleKind::kInterleaved)
    throw std::invalid_argument("booster: num_model_chunks = " + std::to_string(chunks) +
                                " needs pp_style = \"interleaved\"");
  if (kind != ScheduleKind::kGPipe && microbatches < pp)
    throw std::invalid_argument("booster: the " + std::string(kind == ScheduleKind::k1F1B ? "1f1b" : "interleaved") +
                                " schedule needs num_microbatches >= pp_size, got num_microbatches = " +
                                std::to_string(microbatches) + " < pp_size = " + std::to_string(pp) +
                                "; raise num_microbatches (or the batch size over microbatch_size) or lower pp_size");
  if (kind == ScheduleKind::kInterleaved && microbatches % pp != 0)
    throw std::invalid_argument("booster: the interleaved schedule needs num_microbatches divisible by pp_size, got " +
                                std::to_string(microbatches) + " micro-batches on pp_size = " + std::to_string(pp));

  std::vector<PipelineAction> out;
  if (kind == ScheduleKind::kInterleaved) {
    const int total = microbatches * chunks;
    int warmup = total;
    if (!forward_only && microbatches != pp) warmup = std::min(total, (pp - rank - 1) * 2 + (chunks - 1) * pp);
    for (int k = 0; k < warmup; ++k) out.push_back(interleaved_action(k, pp, chunks, true));
    if (forward_only) return out;
    const int remaining = total - warmup;
    for (int k = 0; k < remaining; ++k) {
      out.push_back(interleaved_action(k + warmup, pp, chunks, true));
      out.push_back(interleaved_action(k, pp, chunks, false));
    }
    for (int k = remaining; k < total; ++k) out.push_back(interleaved_action(k, pp, chunks, false));
    return out;
  }
  if (forward_only || kind == ScheduleKind::kGPipe) {
    for (int i = 0; i < microbatches; ++i) out.push_back({Kind::kForward, i, 0});
    if (!forward_only)
      for (int i = 0; i < microbatches; ++i) out.push_back({Kind::kBackward, i, 0});
    return out;
  }
  const int warmup = std::min(pp - rank - 1, microbatches);
  const int remaining = microbatches - warmup;
  for (int i = 0; i < warmup; ++i) out.push_back({Kind::kForward, i, 0});
  for (int i = 0; i < remaining; ++i) {
    out.push_back({Kind::kForward, warmup + i, 0});
    out.push_back({Kind::kBackward, i, 0});
  }
  for (int i = remaining; i < microbatches; ++i) out.push_back({Kind::kBackward, i, 0});
  return out;
}

double simulate(const std::vector<std::vector<PipelineAction>>& schedules, int pp, int microbatches, int chunks,
                double t_forward, double t_backward) {
  if (static_cast<int>(schedules.size()) != pp) throw std::logic_error("simulate: one schedule per rank needed");
  const int stages = pp * chunks;
  // finish[(kind, microbatch, virtual stage)] once done.
  std::map<std::tuple<int, int, int>, double> finish;
  std::vector<size_t> next(pp, 0);
  std::vector<double> free_at(pp, 0.0);
  bool any_backward = false;
  for (const auto& s : schedules)
    for (const auto& a : s) any_backward |= a.kind == Kind::kBackward;
  for (;;) {
    bool progressed = false, all_done = true;
    for (int r = 0; r < pp; ++r) {
      while (next[r] < schedules[r].size()) {
        all_done = false;
        const PipelineAction& a = schedules[r][next[r]];
        const int vs = a.chunk * pp + r;
        const bool fwd = a.kind == Kind::kForward;
        if (a.microbatch < 0 || a.microbatch >= microbatches || a.chunk < 0 || a.chunk >= chunks)
          throw std::logic_error("simulate: rank " + std::to_string(r) + " has an action out of range");
        if (finish.count({fwd ? 0 : 1, a.microbatch, vs}))
          throw std::logic_error("simulate: rank " + std::to_string(r) + " repeats an action");
        double ready = 0;
        bool ok = true;
        auto need = [&](int kind, int vstage) {
          auto it = finish.find({kind, a.microbatch, vstage});
          if (it == finish.end()) ok = false;
          else ready = std::max(ready, it->second);
        };
        if (fwd) {
          if (vs > 0) need(0, vs - 1);
        } else {
          need(0, vs);
          if (vs < stages - 1) need(1, vs + 1);
        }
        if (!ok) break;
        const double start = std::max(free_at[r], ready);
        free_at[r] = start + (fwd ? t_forward : t_backward);
        finish[{fwd ? 0 : 1, a.microbatch, vs}] = free_at[r];
        ++next[r];
        progressed = true;
      }
      if (next[r] < schedules[r].size()) all_done = false;
    }
    if (all_done) break;
    if (!progressed) {
      std::string stuck;
      for (int r = 0; r < pp; ++r)
        if (next[r] < schedules[r].size()) {
          const auto& a = schedules[r][next[r]];
          stuck += " rank " + std::to_string(r) + ": " + (a.kind == Kind::kForward ? "F" : "B") + "(mb " +
                   std::to_string(a.microbatch) + ", chunk " + std::to_string(a.chunk) + ")";
        }
      throw std::logic_error("simulate: the schedules deadlock;" + stuck);
    }
  }
  const size_t expected = static_cast<size_t>(microbatches) * stages * (any_backward ? 2 : 1);
  if (finish.size() != expected)
    throw std::logic_error("simulate: " + std::to_string(finish.size()) + " actions ran, expected " +
                           std::to_string(expected));
  return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace booster::hybrid
