// pipeline_schedule.cpp — the 1F1B, interleaved, GPipe and ZB-V orders, and their simulation.
#include "booster/parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace booster::parallel {

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

// ZB-V for one rank, in the order of PyTorch's ScheduleZBVZeroBubble (Qi et al., section 6): the
// schedule for n = max(m, 2*pp - 1) micro-batches, with the actions of micro-batches >= m dropped.
// Chunk 0 is virtual stage rank, chunk 1 virtual stage 2*pp-1-rank.
std::vector<PipelineAction> zbv_schedule(int pp, int rank, int m) {
  const int n = std::max(m, 2 * pp - 1);
  std::vector<PipelineAction> ops;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  auto add = [&](Kind kind, int mb, int chunk) { ops.push_back({kind, mb, chunk}); };
  for (int i = 0; i < 2 * (pp - rank) - 1; ++i) add(Kind::kForward, f0++, 0);  // warm-up
  for (int i = 0; i < rank; ++i) {
    add(Kind::kForward, f1++, 1);
    add(Kind::kForward, f0++, 0);
  }
  for (int i = 0; i < pp - rank; ++i) {
    add(Kind::kForward, f1++, 1);
    add(Kind::kBackwardInput, b1, 1);
    add(Kind::kBackwardWeight, b1++, 1);
  }
  while (f1 < f0 || f0 < n) {  // steady state
    if (f0 < n) add(Kind::kForward, f0++, 0);
    add(Kind::kBackwardInput, b0, 0);
    add(Kind::kBackwardWeight, b0++, 0);
    add(Kind::kForward, f1++, 1);
    add(Kind::kBackwardInput, b1, 1);
    add(Kind::kBackwardWeight, b1++, 1);
  }
  int w0 = b0, w1 = b1;  // cool-down: B first, the W deferred into the bubble
  for (int i = 0; i < rank; ++i) {
    add(Kind::kBackwardInput, b0++, 0);
    add(Kind::kBackwardInput, b1++, 1);
  }
  for (int i = 0; i < pp - rank; ++i) {
    add(Kind::kBackwardInput, b0++, 0);
    add(Kind::kBackwardWeight, w0++, 0);
  }
  while (w1 < b1) add(Kind::kBackwardWeight, w1++, 1);
  while (w0 < b0) add(Kind::kBackwardWeight, w0++, 0);
  std::vector<PipelineAction> out;
  for (const auto& a : ops)
    if (a.microbatch < m) out.push_back(a);
  return out;
}

}  // namespace

int stage_rank(ScheduleKind kind, int pp, int virtual_stage) {
  if (kind == ScheduleKind::kZeroBubbleV) return virtual_stage < pp ? virtual_stage : 2 * pp - 1 - virtual_stage;
  return virtual_stage % pp;
}

int chunk_stage(ScheduleKind kind, int pp, int rank, int chunk) {
  if (kind == ScheduleKind::kZeroBubbleV) return chunk == 0 ? rank : 2 * pp - 1 - rank;
  return chunk * pp + rank;
}

ScheduleKind schedule_kind_from_name(const std::string& pp_style, int chunks) {
  if (pp_style == "interleaved") return ScheduleKind::kInterleaved;
  if (pp_style == "1f1b") return chunks > 1 ? ScheduleKind::kInterleaved : ScheduleKind::k1F1B;
  if (pp_style == "gpipe") return ScheduleKind::kGPipe;
  if (pp_style == "zbv") return ScheduleKind::kZeroBubbleV;
  throw std::invalid_argument("booster: unknown pp_style \"" + pp_style +
                              "\" (use \"1f1b\", \"interleaved\", \"zbv\" or \"gpipe\")");
}

std::vector<PipelineAction> make_schedule(ScheduleKind kind, int pp, int rank, int microbatches, int chunks,
                                          bool forward_only) {
  if (pp < 1) throw std::invalid_argument("booster: pipeline schedule: pp_size must be >= 1");
  if (rank < 0 || rank >= pp)
    throw std::invalid_argument("booster: pipeline schedule: rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(pp) + ")");
  if (microbatches < 1) throw std::invalid_argument("booster: pipeline schedule: num_microbatches must be >= 1");
  if (chunks < 1) throw std::invalid_argument("booster: pipeline schedule: num_model_chunks must be >= 1");
  if (kind == ScheduleKind::kZeroBubbleV) {
    if (chunks != 2)
      throw std::invalid_argument("booster: pp_style = \"zbv\" needs num_model_chunks = 2 (the V placement holds "
                                  "exactly 2 model chunks per rank), got num_model_chunks = " + std::to_string(chunks) +
                                  "; set num_model_chunks = 2");
    if (pp < 2)
      throw std::invalid_argument("booster: pp_style = \"zbv\" needs pp_size > 1, got pp_size = " + std::to_string(pp) +
                                  "; raise pp_size or use another pp_style");
    std::vector<PipelineAction> out = zbv_schedule(pp, rank, microbatches);
    if (forward_only)  // forwards depend only on forwards: the training order without B and W is valid
      out.erase(std::remove_if(out.begin(), out.end(), [](const PipelineAction& a) { return a.kind != Kind::kForward; }),
                out.end());
    return out;
  }
  if (chunks > 1 && kind != ScheduleKind::kInterleaved)
    throw std::invalid_argument("booster: num_model_chunks = " + std::to_string(chunks) +
                                " needs pp_style = \"interleaved\" (or \"zbv\" with 2)");
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
                double t_forward, double t_backward, double t_weight, ScheduleKind placement) {
  if (static_cast<int>(schedules.size()) != pp) throw std::logic_error("simulate: one schedule per rank needed");
  const int stages = pp * chunks;
  // finish[(what, microbatch, virtual stage)] once done; what: 0 forward, 1 input gradient (a whole
  // backward or B), 2 weight gradients (a whole backward or W).
  std::map<std::tuple<int, int, int>, double> finish;
  std::vector<size_t> next(pp, 0);
  std::vector<double> free_at(pp, 0.0);
  bool any_backward = false;
  for (const auto& s : schedules)
    for (const auto& a : s) any_backward |= a.kind != Kind::kForward;
  auto name = [](Kind k) {
    switch (k) {
      case Kind::kForward: return "F";
      case Kind::kBackward: return "B";
      case Kind::kBackwardInput: return "I";
      default: return "W";
    }
  };
  for (;;) {
    bool progressed = false, all_done = true;
    for (int r = 0; r < pp; ++r) {
      while (next[r] < schedules[r].size()) {
        all_done = false;
        const PipelineAction& a = schedules[r][next[r]];
        if (a.microbatch < 0 || a.microbatch >= microbatches || a.chunk < 0 || a.chunk >= chunks)
          throw std::logic_error("simulate: rank " + std::to_string(r) + " has an action out of range");
        const int vs = chunk_stage(placement, pp, r, a.chunk);
        const std::vector<int> produces = a.kind == Kind::kForward         ? std::vector<int>{0}
                                          : a.kind == Kind::kBackward      ? std::vector<int>{1, 2}
                                          : a.kind == Kind::kBackwardInput ? std::vector<int>{1}
                                                                           : std::vector<int>{2};
        for (int p : produces)
          if (finish.count({p, a.microbatch, vs}))
            throw std::logic_error("simulate: rank " + std::to_string(r) + " repeats an action (" + name(a.kind) +
                                   " of micro-batch " + std::to_string(a.microbatch) + ", chunk " +
                                   std::to_string(a.chunk) + ")");
        double ready = 0;
        bool ok = true;
        auto need = [&](int what, int vstage) {
          auto it = finish.find({what, a.microbatch, vstage});
          if (it == finish.end()) ok = false;
          else ready = std::max(ready, it->second);
        };
        if (a.kind == Kind::kForward) {
          if (vs > 0) need(0, vs - 1);
        } else if (a.kind == Kind::kBackwardWeight) {
          if (!finish.count({1, a.microbatch, vs}))  // W before its B on the same rank can never run
            throw std::logic_error("simulate: rank " + std::to_string(r) + " runs W of micro-batch " +
                                   std::to_string(a.microbatch) + ", chunk " + std::to_string(a.chunk) +
                                   " before its B");
          need(1, vs);
        } else {
          need(0, vs);
          if (vs < stages - 1) need(1, vs + 1);
        }
        if (!ok) break;
        const double start = std::max(free_at[r], ready);
        const double took = a.kind == Kind::kForward ? t_forward : a.kind == Kind::kBackwardWeight ? t_weight : t_backward;
        free_at[r] = start + took;
        for (int p : produces) finish[{p, a.microbatch, vs}] = free_at[r];
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
          stuck += " rank " + std::to_string(r) + ": " + name(a.kind) + "(mb " + std::to_string(a.microbatch) +
                   ", chunk " + std::to_string(a.chunk) + ")";
        }
      throw std::logic_error("simulate: the schedules deadlock;" + stuck);
    }
  }
  const size_t expected = static_cast<size_t>(microbatches) * stages * (any_backward ? 3 : 1);
  if (finish.size() != expected)
    throw std::logic_error("simulate: " + std::to_string(finish.size()) + " results, expected " +
                           std::to_string(expected) + " (an action is missing, or a B has no W)");
  return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace booster::parallel
