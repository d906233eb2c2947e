// pipeline_stage.cpp — layer partitioning and the schedule executor.
#include "pipeline_stage.h"

#include <torch/autograd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <tuple>

#include "booster/dist/process_group.h"
#include "booster/logging.h"
#include "split_backward.h"

namespace booster::parallel {

std::vector<std::pair<int, int>> partition_layers(int n, int stages, bool balanced, const std::vector<int64_t>& weights) {
  if (stages < 1) throw std::invalid_argument("booster: pipeline partition: the number of stages must be >= 1");
  if (n < stages)
    throw std::invalid_argument("booster: the model has " + std::to_string(n) +
                                " pipeline layers (PipelineModule::pipeline_layers), fewer than pp_size * "
                                "num_model_chunks = " + std::to_string(stages) +
                                " stages; lower pp_size or num_model_chunks, or split the model into more layers");
  std::vector<std::pair<int, int>> out;
  if (!balanced) {
    const int base = n / stages, extra = n % stages;
    int begin = 0;
    for (int s = 0; s < stages; ++s) {
      const int len = base + (s < extra ? 1 : 0);
      out.emplace_back(begin, begin + len);
      begin += len;
    }
    return out;
  }
  if (static_cast<int>(weights.size()) != n)
    throw std::invalid_argument("booster: pipeline partition: one weight per layer needed");
  auto parts_needed = [&](int64_t bound) {
    int parts = 1;
    int64_t sum = 0;
    for (int64_t w : weights) {
      if (sum + w > bound) {
        ++parts;
        sum = 0;
      }
      sum += w;
    }
    return parts;
  };
  int64_t lo = *std::max_element(weights.begin(), weights.end());
  int64_t hi = std::accumulate(weights.begin(), weights.end(), int64_t{0});
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (parts_needed(mid) <= stages) hi = mid;
    else lo = mid + 1;
  }
  int begin = 0;
  int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    const int stages_after_current = stages - static_cast<int>(out.size()) - 1;
    if (i > begin && (sum + weights[i] > lo || n - i == stages_after_current)) {
      out.emplace_back(begin, i);
      begin = i;
      sum = 0;
    }
    sum += weights[i];
  }
  out.emplace_back(begin, n);
  return out;
}

PipelineRunner::PipelineRunner(std::vector<nn::PipelineLayer> layers, std::vector<std::pair<int, int>> chunk_ranges,
                               std::shared_ptr<dist::ProcessGroup> pp_group, ScheduleKind kind, bool enable_metadata_cache)
    : layers_(std::move(layers)),
      ranges_(std::move(chunk_ranges)),
      pp_group_(std::move(pp_group)),
      kind_(kind),
      metadata_cache_(enable_metadata_cache) {
  pp_ = pp_group_->size();
  rank_ = pp_group_->rank();
}

at::Tensor PipelineRunner::run_chunk(int chunk, at::Tensor x) const {
  for (int i = ranges_[chunk].first; i < ranges_[chunk].second; ++i) x = layers_[i].forward(x);
  return x;
}

std::vector<at::Tensor> PipelineRunner::chunk_parameters(int chunk) const {
  std::vector<at::Tensor> out;
  std::set<const void*> seen;
  for (int i = ranges_[chunk].first; i < ranges_[chunk].second; ++i)
    for (const auto& m : layers_[i].modules) {
      if (!m) continue;
      for (const auto& p : m->parameters(true))
        if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
    }
  return out;
}

namespace {

// Tags: one per (micro-batch, sending virtual stage, direction), unique within one run().
int message_tag(int microbatch, int virtual_stage, int stages, bool backward) {
  return (microbatch * stages + virtual_stage) * 2 + (backward ? 1 : 0);
}

// What every stage knows about a run before it starts (the metadata cache's key).
std::string run_key(const at::Tensor& inputs, const at::Tensor& targets, int microbatches, bool train) {
  std::string key = std::string(train ? "train" : "eval") + "/" + std::to_string(microbatches);
  for (const at::Tensor* t : {&inputs, &targets}) {
    key += "/" + std::to_string(static_cast<int>(t->scalar_type())) + ":";
    for (int64_t d : t->sizes()) key += std::to_string(d) + ",";
  }
  return key;
}

struct Slot {
  at::Tensor input;        // received activation (requires grad) or the micro-batch's inputs
  at::Tensor output;       // the chunk's output, or the scaled loss on the last virtual stage
  at::Tensor grad_output;  // after B: the output's gradient, for W (undefined on the last stage)
  std::shared_ptr<SplitBackward> split;  // after B on a stage with an input gradient: W's state
};

}  // namespace

PipelineResult PipelineRunner::run(const at::Tensor& inputs, const at::Tensor& targets, const PipelineCriterion& criterion,
                                   const Options& o) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int m = o.microbatches;
  const int chunks = this->chunks();
  const int stages = pp_ * chunks;
  for (const auto& [what, t] : {std::pair<const char*, const at::Tensor*>{"inputs", &inputs}, {"targets", &targets}}) {
    if (!t->defined() || t->dim() < 1 || t->size(0) % m != 0)
      throw std::invalid_argument(std::string("booster: execute_pipeline: ") + what + " of batch size " +
                                  (t->defined() && t->dim() >= 1 ? std::to_string(t->size(0)) : std::string("(none)")) +
                                  " do not split into num_microbatches = " + std::to_string(m) +
                                  " equal micro-batches; make the batch size a multiple of it (or set microbatch_size)");
  }
  if (o.train && !criterion) throw std::invalid_argument("booster: execute_pipeline: training needs a criterion");
  const auto schedule = make_schedule(kind_, pp_, rank_, m, chunks, !o.train);
  const auto in_parts = inputs.chunk(m, 0);
  const auto target_parts = targets.chunk(m, 0);
  std::map<std::pair<int, int>, Slot> slots;  // (microbatch, chunk)
  std::vector<std::pair<dist::Work, at::Tensor>> sends;
  std::vector<at::Tensor> outputs;
  at::Tensor loss_sum;
  compute_s_ = 0;
  using Kind = PipelineAction::Kind;
  int backwards_left = 0;  // the actions that accumulate weight gradients
  for (const auto& a : schedule) backwards_left += a.kind == Kind::kBackward || a.kind == Kind::kBackwardWeight;
  const auto rank_of = [&](int virtual_stage) { return stage_rank(kind_, pp_, virtual_stage); };
  // Messages between two virtual stages of this rank (zbv's pp-1 -> pp and back) stay in memory:
  // (microbatch, sending virtual stage, backward) -> the tensor.
  std::map<std::tuple<int, int, bool>, at::Tensor> local;
  std::vector<std::vector<at::Tensor>> chunk_params(chunks);
  for (int c = 0; c < chunks; ++c) chunk_params[c] = chunk_parameters(c);

  // Micro-batch 0 of each stream (sending virtual stage, direction) carries a shape/dtype header
  // (isend_tensor / recv_tensor) unless the metadata cache knows the shape; the later ones, of the
  // same shape (equal micro-batches), are plain isend / irecv into a tensor of the learned shape. Every
  // stream is consumed in micro-batch order, so when micro-batch i arrives the receive of i + 1 is
  // posted at once: the transfer then overlaps this rank's compute (one buffer ahead per stream).
  // Gloo transmits a send once its receive is posted; a receive posted first lets the sender write
  // at once from its own thread, instead of waiting for its I/O thread to be scheduled.
  struct Pending {
    int microbatch = -1;
    at::Tensor tensor;
    dist::Work work;
  };
  std::map<std::pair<int, bool>, Pending> ahead;  // (sending vs, backward) -> the posted receive
  // Received activations and gradients go to this stage's device. Point-to-point of device tensors
  // runs on the device backend (NCCL) or is staged through host memory (Gloo); the shared-memory
  // rings and the shape headers carry host copies.
  const c10::Device device = chunk_params[0].empty() ? inputs.device() : chunk_params[0].front().device();
  const std::string key = run_key(inputs, targets, m, o.train);
  const bool cached = metadata_cache_ && completed_keys_.count(key) > 0;
  std::map<std::pair<int, bool>, StreamMeta> learned;
  std::map<Stream, int64_t> sent_bytes;  // first run of the key: message size of each stream sent
  auto& send_rings = send_rings_[key];
  auto& recv_rings = recv_rings_[key];
  if (cached)
    for (const auto& [stream, meta] : stream_meta_[key]) {
      if (recv_rings.count(stream)) continue;
      Pending first{0, at::empty(meta.sizes, at::TensorOptions().dtype(meta.dtype).device(device)), {}};
      first.work = pp_group_->irecv(first.tensor, rank_of(stream.first), message_tag(0, stream.first, stages, stream.second));
      ahead[stream] = std::move(first);
    }
  auto receive = [&](int microbatch, int from_vs, bool backward) {
    const int peer = rank_of(from_vs);
    if (peer == rank_) {  // from this rank's other chunk, sent earlier in the schedule
      auto it = local.find({microbatch, from_vs, backward});
      if (it == local.end())
        throw std::logic_error("pipeline: virtual stage " + std::to_string(from_vs) + " has not produced micro-batch " +
                               std::to_string(microbatch) + " on this rank (schedule order)");
      at::Tensor t = std::move(it->second);
      local.erase(it);
      return t;
    }
    const std::pair<int, bool> stream{from_vs, backward};
    at::Tensor t;
    if (cached) {
      auto ring = recv_rings.find(stream);
      if (ring != recv_rings.end()) {
        const StreamMeta& meta = ring->second.meta;
        t = at::empty(meta.sizes, at::TensorOptions().dtype(meta.dtype));
        ring->second.ring.recv(t, pp_group_->timeout_s(), ring->second.peer_pid, ring->second.what);
        ++shm_messages_;
        return device.is_cpu() ? t : t.to(device);
      }
    }
    auto it = ahead.find(stream);
    if (it != ahead.end() && it->second.microbatch == microbatch) {
      it->second.work.wait();
      t = it->second.tensor;
    } else {
      t = pp_group_->recv_tensor(peer, message_tag(microbatch, from_vs, stages, backward));
      if (t.device() != device) t = t.to(device);
    }
    if (microbatch == 0) learned[stream] = StreamMeta{t.sizes().vec(), t.scalar_type()};
    if (microbatch + 1 < m) {
      Pending next{microbatch + 1, at::empty_like(t), {}};
      next.work = pp_group_->irecv(next.tensor, peer, message_tag(microbatch + 1, from_vs, stages, backward));
      ahead[stream] = std::move(next);
    } else {
      ahead.erase(stream);
    }
    return t;
  };
  auto send = [&](const at::Tensor& t, int microbatch, int from_vs, int to_vs, bool backward) {
    if (rank_of(to_vs) == rank_) {
      local[{microbatch, from_vs, backward}] = t;
      return;
    }
    const int tag = message_tag(microbatch, from_vs, stages, backward);
    // Micro-batch 0 with the header; the receiver learns the shape from it and posts the rest plain.
    const bool header = microbatch == 0 && !cached;
    if (cached) {
      auto ring = send_rings.find({from_vs, backward});
      if (ring != send_rings.end()) {
        ring->second.ring.send(t.device().is_cpu() ? t : t.to(at::kCPU), pp_group_->timeout_s(), ring->second.peer_pid,
                               ring->second.what);
        ++shm_messages_;
        return;
      }
    } else if (microbatch == 0) {
      sent_bytes[{from_vs, backward}] = static_cast<int64_t>(t.nbytes());
    }
    if (header) {
      at::Tensor host = t.device().is_cpu() ? t : t.to(at::kCPU);
      sends.emplace_back(pp_group_->isend_tensor(host, rank_of(to_vs), tag), host);
    } else {
      sends.emplace_back(pp_group_->isend(t, rank_of(to_vs), tag), t);
    }
  };
  std::optional<at::NoGradGuard> no_grad;
  if (!o.train) no_grad.emplace();
  for (const auto& a : schedule) {
    const int vs = chunk_stage(kind_, pp_, rank_, a.chunk);
    const bool first = vs == 0, last = vs == stages - 1;
    Slot& slot = slots[{a.microbatch, a.chunk}];
    if (a.kind == PipelineAction::Kind::kForward) {
      if (first) {
        slot.input = in_parts[a.microbatch];
      } else {
        slot.input = receive(a.microbatch, vs - 1, false);
        if (o.train && at::isFloatingType(slot.input.scalar_type())) slot.input.requires_grad_(true);
      }
      const auto t0 = Clock::now();
      at::Tensor out = run_chunk(a.chunk, slot.input);
      if (last) {
        if (o.return_outputs) outputs.push_back(out.detach());
        if (criterion && (o.train || o.return_loss)) {
          at::Tensor loss = criterion(out, target_parts[a.microbatch]);
          if (loss.numel() != 1)
            throw std::invalid_argument("booster: execute_pipeline: the criterion must return a scalar loss");
          at::Tensor l = loss.detach().to(at::kFloat).reshape({});
          loss_sum = loss_sum.defined() ? loss_sum + l : l;
          slot.output = o.train ? loss / m : at::Tensor();
        }
        compute_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
      } else {
        compute_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
        send(out.detach().contiguous(), a.microbatch, vs, vs + 1, false);
        slot.output = o.train ? out : at::Tensor();
      }
      if (!o.train) slots.erase({a.microbatch, a.chunk});
      continue;
    }
    if (a.kind == Kind::kBackwardWeight) {  // W: the weight gradients from B's kept graph, then free it
      --backwards_left;
      if (o.set_grad_sync) o.set_grad_sync(backwards_left == 0);
      const auto t0 = Clock::now();
      if (slot.split) {
        slot.split->weight_gradients();
      } else if (slot.output.defined() && slot.output.requires_grad() && !chunk_params[a.chunk].empty()) {
        if (last) torch::autograd::backward({slot.output}, {}, false, false, chunk_params[a.chunk]);
        else
          torch::autograd::backward({slot.output}, {slot.grad_output.to(slot.output.scalar_type())}, false, false,
                                    chunk_params[a.chunk]);
      }
      compute_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
      slots.erase({a.microbatch, a.chunk});
      continue;
    }
    at::Tensor grad;
    if (!last) grad = receive(a.microbatch, vs + 1, true);
    if (a.kind == Kind::kBackwardInput) {  // B: the input gradient only, sent on at once; W follows
      slot.grad_output = grad;
      if (first) continue;  // nothing to send: W runs the whole backward
      const auto t0 = Clock::now();
      at::Tensor g;
      if (slot.output.defined() && slot.output.requires_grad() && slot.input.requires_grad()) {
        slot.split = std::make_shared<SplitBackward>(slot.output, last ? at::Tensor() : grad.to(slot.output.scalar_type()),
                                                     slot.input, chunk_params[a.chunk]);
        g = slot.split->input_gradient();
        w_fallbacks_ += slot.split->split() ? 0 : 1;
      }
      compute_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
      if (!g.defined()) g = at::zeros_like(slot.input);
      send(g.to(slot.input.scalar_type()).contiguous(), a.microbatch, vs, vs - 1, true);
      continue;
    }
    // The whole backward.
    --backwards_left;
    if (o.set_grad_sync) o.set_grad_sync(backwards_left == 0);
    const auto t0 = Clock::now();
    if (slot.output.defined() && slot.output.requires_grad()) {
      if (last) torch::autograd::backward({slot.output});
      else torch::autograd::backward({slot.output}, {grad.to(slot.output.scalar_type())});
    }
    compute_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
    if (!first) {
      at::Tensor g = slot.input.grad();
      if (!g.defined()) g = at::zeros_like(slot.input);
      send(g.to(slot.input.scalar_type()).contiguous(), a.microbatch, vs, vs - 1, true);
    }
    slots.erase({a.microbatch, a.chunk});
  }
  for (auto& [work, tensor] : sends) work.wait();
  if (metadata_cache_ && !cached) {
    stream_meta_[key] = std::move(learned);
    completed_keys_.insert(key);
    // Device tensors between ranks on a device backend (NCCL) stay there: a ring would stage them
    // through host memory.
    if (device.is_cpu() || pp_group_->backend() == "gloo") setup_shared_memory(key, m, stream_meta_[key], sent_bytes);
  }
  wall_s_ = std::chrono::duration<double>(Clock::now() - start).count();

  PipelineResult result;
  result.is_last_stage = is_last_stage();
  if (result.is_last_stage) {
    if (o.return_loss && loss_sum.defined()) result.loss = loss_sum / m;
    if (o.return_outputs && !outputs.empty()) result.outputs = at::cat(outputs, 0);
  }
  return result;
}

void PipelineRunner::setup_shared_memory(const std::string& key, int microbatches,
                                         const std::map<Stream, StreamMeta>& received,
                                         const std::map<Stream, int64_t>& sent_bytes) {
  constexpr int64_t kMaxRingBytes = int64_t{256} << 20;
  const int stages = pp_ * chunks();
  const auto index = [](const Stream& s) { return 2 * s.first + (s.second ? 1 : 0); };
  const auto receiver_of = [&](const Stream& s) { return stage_rank(kind_, pp_, s.first + (s.second ? -1 : 1)); };
  const int64_t pid = getpid();
  static std::atomic<int64_t> counter{0};
  auto name_of = [](int64_t owner_pid, int64_t n) {
    return "/booster-pp-" + std::to_string(owner_pid) + "-" + std::to_string(n);
  };
  // Round 1: [host id, pid, then per stream index: (ring number or -1, message bytes)] from every rank.
  std::vector<int64_t> record(2 + 4 * static_cast<size_t>(stages), -1);
  record[0] = shm_host_id();
  record[1] = pid;
  std::map<Stream, Channel> created;
  std::string failure;
  for (const auto& [stream, meta] : received) {
    int64_t bytes = static_cast<int64_t>(c10::elementSize(meta.dtype));
    for (int64_t d : meta.sizes) bytes *= d;
    if (bytes <= 0 || bytes * microbatches > kMaxRingBytes) continue;
    const int64_t n = counter++;
    std::string error;
    ShmRing ring = ShmRing::create(name_of(pid, n), microbatches, bytes, &error);
    if (!ring.valid()) {
      failure = error;
      continue;
    }
    record[2 + 2 * index(stream)] = n;
    record[3 + 2 * index(stream)] = bytes;
    created[stream].ring = std::move(ring);
    created[stream].meta = meta;
  }
  const auto all = pp_group_->all_gather_int64(record);
  // Round 2: per stream index, 1 when this rank (its sender) mapped the receiver's ring.
  std::vector<int64_t> opened(2 * static_cast<size_t>(stages), 0);
  auto& sends = send_rings_[key];
  for (const auto& [stream, bytes] : sent_bytes) {
    const auto& peer = all[static_cast<size_t>(receiver_of(stream))];
    const int64_t n = peer[2 + 2 * index(stream)];
    if (peer[0] != record[0] || n < 0 || peer[3 + 2 * index(stream)] != bytes) continue;
    std::string error;
    ShmRing ring = ShmRing::open(name_of(peer[1], n), microbatches, bytes, &error);
    if (!ring.valid()) {
      failure = error;
      continue;
    }
    const int to = receiver_of(stream);
    sends[stream] = Channel{std::move(ring), static_cast<int>(peer[1]),
                            std::string(stream.second ? "gradients" : "activations") + " to pipeline rank " +
                                std::to_string(to),
                            {}};
    opened[static_cast<size_t>(index(stream))] = 1;
  }
  const auto confirmed = pp_group_->all_gather_int64(opened);
  auto& receives = recv_rings_[key];
  for (auto& [stream, channel] : created) {
    ShmRing::unlink(name_of(pid, record[2 + 2 * index(stream)]));
    const int from = stage_rank(kind_, pp_, stream.first);
    if (confirmed[static_cast<size_t>(from)][static_cast<size_t>(index(stream))] != 1) continue;
    channel.peer_pid = static_cast<int>(all[static_cast<size_t>(from)][1]);
    channel.what = std::string(stream.second ? "gradients" : "activations") + " from virtual stage " +
                   std::to_string(stream.first) + " (pipeline rank " + std::to_string(from) + ")";
    receives[stream] = std::move(channel);
  }
  if (!failure.empty())
    booster::log::warn("pipeline: a shared-memory ring could not be set up (" + failure +
                       "); those activations and gradients keep going through Gloo");
}

}  // namespace booster::parallel
