// process_group_scatter.cpp — reduce-scatter and all-gather of dist::ProcessGroup, pairwise over
// Gloo point-to-point, and the bf16 allreduce built from them. LibTorch 2.11's Gloo has both
// collectives and bf16 itself; these are faster at 16 and 128 MiB (docs/benchmarks.md, collectives).
//
// Direct (pairwise) exchange, every message posted at once: for reduce-scatter rank r sends range p
// of its input to every rank p != r and receives range r from every other rank; for all-gather it
// sends its range to every other rank, received straight into that rank's range of the output. Each
// rank sends and receives (N-1)/N of the buffer, as a ring would (Thakur, Rabenseifner and Gropp,
// "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005), without a ring's
// N-1 dependent steps, so the operation is asynchronous like the others. Ranges may differ in size
// (MPI_Reduce_scatter's recvcounts, MPI_Allgatherv's counts). A reduce-scatter range travels in
// pieces of kPieceBytes, so wait() sums piece k while later pieces are still arriving. When the
// output shares no memory with the input, one peer's range is received straight into the output
// (a 2-rank reduce-scatter allocates nothing); the others get buffers of their own. Ranges are
// sent in their own dtype (bf16 travels as bf16); reduce-scatter sums in float32 for floating types
// narrower than it (the sum of the N ranges in rank order, so the result does not depend on arrival
// order), in the dtype otherwise.
// Messages use internal tags above every user and isend_tensor tag, so they never match user
// point-to-point; all ranks issue collectives in the same order, so messages between two ranks on
// one tag match in that order. The all-gather half of a bf16 allreduce is posted by a helper thread
// once the reduce-scatter half is done, at a moment that differs between ranks: it takes a tag of
// its own, from a sequence number every rank assigns in issue order.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "booster/dist/process_group.h"
#include "process_group_impl.h"

namespace booster::dist {

namespace {

constexpr int kReduceScatterTag = (1 << 30) + 1;
constexpr int kAllGatherTag = (1 << 30) + 2;
constexpr int kAllToAllTag = (1 << 30) + 3;
// Tags of the all-gather halves of bf16 allreduces: kAllreduceGatherTag + (sequence mod 2^20).
constexpr int kAllreduceGatherTag = (1 << 30) + (1 << 20);
constexpr int64_t kAllreduceGatherTags = 1 << 20;
// Reduce-scatter ranges travel in pieces of this many bytes (the last piece of a range shorter).
constexpr int64_t kPieceBytes = 1 << 20;

void check_contiguous(const at::Tensor& t, const char* op) {
  if (!t.defined()) throw DistError(std::string("booster: ") + op + ": tensor is undefined");
  if (!t.is_contiguous())
    throw DistError(std::string("booster: ") + op +
                    ": tensor must be contiguous (call .contiguous() and copy the result back)");
}

at::ScalarType accumulation_dtype(at::ScalarType t) {
  return (t == at::kBFloat16 || t == at::kHalf) ? at::kFloat : t;
}

// Start of each rank's range: offsets[r] = counts[0] + ... + counts[r-1]; offsets[size] = total.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) offsets[r + 1] = offsets[r] + counts[r];
  return offsets;
}

void check_counts(const std::vector<int64_t>& counts, int size, int64_t numel, const char* op) {
  if (static_cast<int>(counts.size()) != size)
    throw DistError(std::string("booster: ") + op + " needs one count per rank (" + std::to_string(size) + "), got " +
                    std::to_string(counts.size()));
  int64_t total = 0;
  for (int64_t c : counts) {
    if (c < 0) throw DistError(std::string("booster: ") + op + ": negative count " + std::to_string(c));
    total += c;
  }
  if (total != numel)
    throw DistError(std::string("booster: ") + op + ": the counts add up to " + std::to_string(total) +
                    " elements but the buffer has " + std::to_string(numel));
}

// dst = a (op) b, elementwise; dst may be a or b.
void combine(at::Tensor& dst, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG: at::add_out(dst, a, b); break;
    case ReduceOp::MAX: at::maximum_out(dst, a, b); break;
    case ReduceOp::MIN: at::minimum_out(dst, a, b); break;
    case ReduceOp::PRODUCT: at::mul_out(dst, a, b); break;
  }
}

void average(at::Tensor& t, int size) {
  if (at::isFloatingType(t.scalar_type())) t.div_(size);
  else t.div_(size, "trunc");
}

// What a collective needs of its group, by value: the all-gather half of a bf16 allreduce runs in
// wait(), which needs no ProcessGroup object alive (as c10d's works).
struct GroupRef {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // null: a group of one rank
  int rank = 0;
  int size = 1;
  std::shared_ptr<detail::Health> health;
  bool world = false;
};

GroupRef ref_of(const ProcessGroup::Impl& g) { return GroupRef{g.pg, g.rank, g.size, g.health, g.world}; }

// Whether every work of `works` has completed (no blocking).
bool all_completed(const std::vector<Work>& works) {
  for (const auto& w : works)
    if (!w.is_completed()) return false;
  return true;
}

// A Work with no backend work of its own whose wait() runs `finish` and whose is_completed() asks
// `ready`; a DistError from `finish` gets the group's health check appended.
Work composite_work(const GroupRef& g, const std::string& what, std::function<void()> finish,
                    std::function<bool()> ready) {
  auto impl = std::make_shared<Work::Impl>();
  impl->what = what;
  impl->ready = std::move(ready);
  impl->health = g.health;
  impl->world = g.world;
  impl->finish = [finish = std::move(finish), health = g.health, world = g.world]() {
    try {
      finish();
    } catch (const DistError& e) {
      throw DistError(std::string(e.what()) + (health ? health->diagnose(world) : std::string()));
    }
  };
  return Work(impl);
}

// Reduce-scatter of `flat` (ranges of `counts`) into `out` (counts[rank] elements; may be this
// rank's range of `flat` itself).
Work reduce_scatter_ranges(const GroupRef& g, const at::Tensor& flat, const std::vector<int64_t>& counts,
                           at::Tensor out, ReduceOp op, const std::string& what);
// All-gather of the ranges of `counts` in `flat`, on `tag`; `count` = it is a collective of its own
// for the health check (not the second half of an allreduce).
Work all_gather_ranges(const GroupRef& g, const at::Tensor& flat, const std::vector<int64_t>& counts, int tag,
                       const std::string& what, bool count = true);

}  // namespace

// Even split of numel over size ranks, the first numel % size ranks one element more.
std::vector<int64_t> ProcessGroup::even_counts(int64_t numel, int size) {
  std::vector<int64_t> counts(static_cast<size_t>(size), numel / size);
  for (int64_t r = 0; r < numel % size; ++r) ++counts[static_cast<size_t>(r)];
  return counts;
}

Work ProcessGroup::reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_contiguous(output, "reduce_scatter_tensor");
  check_contiguous(input, "reduce_scatter_tensor");
  if (input.numel() != output.numel() * impl_->size || output.scalar_type() != input.scalar_type())
    throw DistError("booster: reduce_scatter_tensor needs an input of numel " +
                    std::to_string(output.numel() * impl_->size) + " and the output's dtype, got numel " +
                    std::to_string(input.numel()));
  if (detail::needs_staging(*impl_, input))
    return detail::staged({output, input}, {true, false}, [this, op](std::vector<at::Tensor>& h) {
      return reduce_scatter_tensor(h[0], h[1], op);
    });
  if (detail::on_device_backend(*impl_, input)) {
    c10d::ReduceScatterOptions o;
    o.reduceOp = detail::device_reduce_op(op);
    at::Tensor in = input;
    auto w = impl_->pg->_reduce_scatter_base(output, in, o);
    return detail::make_work(w, [in]() {}, detail::describe("reduce_scatter", input), impl_.get());
  }
  std::vector<int64_t> counts(static_cast<size_t>(impl_->size), output.numel());
  return reduce_scatter_ranges(ref_of(*impl_), input.view({-1}), counts, output.view({-1}), op,
                               detail::describe("reduce_scatter", input));
}

Work ProcessGroup::reduce_scatter_tensor_consuming(at::Tensor& output, at::Tensor& input, ReduceOp op) {
  return reduce_scatter_tensor(output, input, op);  // the pairwise exchange never writes its input
}

Work ProcessGroup::reduce_scatter_in_place(at::Tensor& buffer, const std::vector<int64_t>& counts, ReduceOp op) {
  check_contiguous(buffer, "reduce_scatter_in_place");
  check_counts(counts, impl_->size, buffer.numel(), "reduce_scatter_in_place");
  if (detail::needs_staging(*impl_, buffer))
    return detail::staged({buffer}, {true}, [this, counts, op](std::vector<at::Tensor>& h) {
      return reduce_scatter_in_place(h[0], counts, op);
    });
  const std::vector<int64_t> offsets = offsets_of(counts);
  at::Tensor flat = buffer.view({-1});
  at::Tensor mine = flat.narrow(0, offsets[static_cast<size_t>(impl_->rank)], counts[static_cast<size_t>(impl_->rank)]);
  if (detail::on_device_backend(*impl_, buffer)) {
    // NCCL: a reduce-scatter of the ranges (c10d runs one ncclReduce per rank when they differ in size).
    std::vector<at::Tensor> outputs{mine};
    std::vector<std::vector<at::Tensor>> inputs(1);
    for (int r = 0; r < impl_->size; ++r)
      inputs[0].push_back(flat.narrow(0, offsets[static_cast<size_t>(r)], counts[static_cast<size_t>(r)]));
    c10d::ReduceScatterOptions o;
    o.reduceOp = detail::device_reduce_op(op);
    auto w = impl_->pg->reduce_scatter(outputs, inputs, o);
    return detail::make_work(w, [outputs, inputs]() {}, detail::describe("reduce_scatter_in_place", buffer), impl_.get());
  }
  return reduce_scatter_ranges(ref_of(*impl_), flat, counts, mine, op, detail::describe("reduce_scatter_in_place", buffer));
}

Work ProcessGroup::all_gather_into_tensor(at::Tensor& output, const at::Tensor& input) {
  check_contiguous(output, "all_gather_into_tensor");
  const int size = impl_->size, rank = impl_->rank;
  if (output.numel() != input.numel() * size || output.scalar_type() != input.scalar_type())
    throw DistError("booster: all_gather_into_tensor needs an output of numel " + std::to_string(input.numel() * size) +
                    " and the input's dtype, got numel " + std::to_string(output.numel()));
  if (detail::needs_staging(*impl_, output))
    return detail::staged({output, input}, {true, false}, [this](std::vector<at::Tensor>& h) {
      return all_gather_into_tensor(h[0], h[1]);
    });
  if (detail::on_device_backend(*impl_, output)) {
    at::Tensor in = input.contiguous();
    auto w = impl_->pg->_allgather_base(output, in);
    return detail::make_work(w, [in]() {}, detail::describe("all_gather_into_tensor", input), impl_.get());
  }
  auto flat = output.view({-1});
  const int64_t n = input.numel();
  at::Tensor mine = flat.narrow(0, static_cast<int64_t>(rank) * n, n);
  at::Tensor in = input.reshape({-1});
  if (in.data_ptr() != mine.data_ptr()) {
    // An input overlapping the output elsewhere is copied first (source and destination of a copy
    // must not overlap).
    const char* ob = static_cast<const char*>(output.data_ptr());
    const char* ib = static_cast<const char*>(in.data_ptr());
    if (ib < ob + output.nbytes() && ob < ib + in.nbytes()) in = in.clone();
    mine.copy_(in);
  }
  std::vector<int64_t> counts(static_cast<size_t>(size), n);
  return all_gather_ranges(ref_of(*impl_), flat, counts, kAllGatherTag, detail::describe("all_gather_into_tensor", input));
}

Work ProcessGroup::all_gather_in_place(at::Tensor& buffer, const std::vector<int64_t>& counts) {
  check_contiguous(buffer, "all_gather_in_place");
  check_counts(counts, impl_->size, buffer.numel(), "all_gather_in_place");
  if (detail::needs_staging(*impl_, buffer))
    return detail::staged({buffer}, {true}, [this, counts](std::vector<at::Tensor>& h) {
      return all_gather_in_place(h[0], counts);
    });
  if (detail::on_device_backend(*impl_, buffer)) {
    // NCCL: an all-gather into the ranges (c10d broadcasts each range when they differ in size).
    const std::vector<int64_t> offsets = offsets_of(counts);
    at::Tensor flat = buffer.view({-1});
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < impl_->size; ++r)
      outputs[0].push_back(flat.narrow(0, offsets[static_cast<size_t>(r)], counts[static_cast<size_t>(r)]));
    std::vector<at::Tensor> inputs{outputs[0][static_cast<size_t>(impl_->rank)].clone()};
    auto w = impl_->pg->allgather(outputs, inputs);
    return detail::make_work(w, [outputs, inputs]() {}, detail::describe("all_gather_in_place", buffer), impl_.get());
  }
  return all_gather_ranges(ref_of(*impl_), buffer.view({-1}), counts, kAllGatherTag, detail::describe("all_gather_in_place", buffer));
}

Work ProcessGroup::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                     const std::vector<int64_t>& output_counts, const std::vector<int64_t>& input_counts) {
  check_contiguous(output, "all_to_all_single");
  check_contiguous(input, "all_to_all_single");
  check_counts(output_counts, impl_->size, output.numel(), "all_to_all_single (output)");
  check_counts(input_counts, impl_->size, input.numel(), "all_to_all_single (input)");
  if (output.scalar_type() != input.scalar_type())
    throw DistError(std::string("booster: all_to_all_single needs the input's dtype for the output, got ") +
                    c10::toString(output.scalar_type()) + " and " + c10::toString(input.scalar_type()));
  if (detail::needs_staging(*impl_, input))
    return detail::staged({output, input}, {true, false}, [this, output_counts, input_counts](std::vector<at::Tensor>& h) {
      return all_to_all_single(h[0], h[1], output_counts, input_counts);
    });
  if (detail::on_device_backend(*impl_, input)) {
    at::Tensor in = input;
    std::vector<int64_t> oc = output_counts, ic = input_counts;
    auto w = impl_->pg->alltoall_base(output, in, oc, ic);
    return detail::make_work(w, [in]() {}, detail::describe("all_to_all_single", input), impl_.get());
  }
  const GroupRef g = ref_of(*impl_);
  const std::string what = detail::describe("all_to_all_single", input);
  const std::vector<int64_t> in_off = offsets_of(input_counts), out_off = offsets_of(output_counts);
  const at::Tensor in_flat = input.view({-1});
  at::Tensor out_flat = output.view({-1});
  const size_t me = static_cast<size_t>(g.rank);
  if (output_counts[me] != input_counts[me])
    throw DistError("booster: all_to_all_single: this rank sends itself " + std::to_string(input_counts[me]) +
                    " elements but expects " + std::to_string(output_counts[me]));
  if (g.health && g.world) g.health->note_collective();
  auto works = std::make_shared<std::vector<Work>>();
  if (g.pg && g.size > 1) {
    for (int p = 0; p < g.size; ++p) {
      if (p == g.rank) continue;
      const size_t q = static_cast<size_t>(p);
      if (input_counts[q] > 0)
        works->push_back(detail::post_p2p(g.pg, true, in_flat.narrow(0, in_off[q], input_counts[q]), p, kAllToAllTag, what));
      if (output_counts[q] > 0)
        works->push_back(
            detail::post_p2p(g.pg, false, out_flat.narrow(0, out_off[q], output_counts[q]), p, kAllToAllTag, what));
    }
  }
  if (output_counts[me] > 0) out_flat.narrow(0, out_off[me], output_counts[me]).copy_(in_flat.narrow(0, in_off[me], input_counts[me]));
  return composite_work(g, what, [works, in_flat]() {
    for (auto& w : *works) w.wait();
  }, [works]() { return all_completed(*works); });
}

namespace {

Work reduce_scatter_ranges(const GroupRef& g, const at::Tensor& flat, const std::vector<int64_t>& counts,
                           at::Tensor out, ReduceOp op, const std::string& what) {
  const int size = g.size, rank = g.rank;
  const std::vector<int64_t> offsets = offsets_of(counts);
  const int64_t n = counts[static_cast<size_t>(rank)];
  const at::Tensor own = flat.narrow(0, offsets[static_cast<size_t>(rank)], n);
  const bool in_place = own.data_ptr() == out.data_ptr();
  // direct: the rank whose range is received straight into `out` instead of a buffer of its own
  // (the first rank in rank order other than this one), when `out` shares no memory with `flat`;
  // -1 otherwise. The sum starts from the first two ranks' ranges, so `out` is read before written.
  const auto* flat_begin = static_cast<const char*>(flat.data_ptr());
  const auto* out_begin = static_cast<const char*>(out.data_ptr());
  const bool disjoint = out_begin + out.nbytes() <= flat_begin || flat_begin + flat.nbytes() <= out_begin;
  const int direct = (disjoint && size > 1 && g.pg && n > 0) ? (rank == 0 ? 1 : 0) : -1;
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(flat.element_size()));
  auto pieces_of = [piece](int64_t count) { return (count + piece - 1) / piece; };
  if (g.health && g.world) g.health->note_collective();
  // received[p]: range `rank` of rank p's input (undefined for p == rank); recv_works[k][p]: its piece k.
  auto received = std::make_shared<std::vector<at::Tensor>>(static_cast<size_t>(size));
  auto recv_works = std::make_shared<std::vector<std::vector<Work>>>(static_cast<size_t>(pieces_of(n)),
                                                                     std::vector<Work>(static_cast<size_t>(size)));
  auto send_works = std::make_shared<std::vector<Work>>();
  if (g.pg && size > 1) {
    for (int p = 0; p < size; ++p)
      if (p != rank && n > 0) (*received)[static_cast<size_t>(p)] = p == direct ? out : at::empty({n}, flat.options());
    int64_t most = 0;
    for (int64_t c : counts) most = std::max(most, pieces_of(c));
    for (int64_t k = 0; k < most; ++k) {
      for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        const int64_t count_p = counts[static_cast<size_t>(p)];
        if (k * piece < count_p) {
          const int64_t len = std::min(piece, count_p - k * piece);
          send_works->push_back(detail::post_p2p(g.pg, true, flat.narrow(0, offsets[static_cast<size_t>(p)] + k * piece, len),
                                                 p, kReduceScatterTag, what));
        }
        if (k * piece < n) {
          const int64_t len = std::min(piece, n - k * piece);
          (*recv_works)[static_cast<size_t>(k)][static_cast<size_t>(p)] = detail::post_p2p(
              g.pg, false, (*received)[static_cast<size_t>(p)].narrow(0, k * piece, len), p, kReduceScatterTag, what);
        }
      }
    }
  }
  auto ready = [recv_works, send_works]() {
    for (const auto& piece_works : *recv_works)
      if (!all_completed(piece_works)) return false;
    return all_completed(*send_works);
  };
  return composite_work(g, what, [received, recv_works, send_works, own, out, n, piece, rank, size, op, in_place,
                                  direct]() mutable {
    const at::ScalarType acc_dtype = accumulation_dtype(out.scalar_type());
    const bool widen = acc_dtype != out.scalar_type();
    at::Tensor acc_buffer =
        widen && n > 0 ? at::empty({std::min(piece, n)}, out.options().dtype(acc_dtype)) : at::Tensor();
    for (int64_t k = 0; k * piece < n; ++k) {
      const int64_t begin = k * piece, len = std::min(piece, n - begin);
      for (auto& w : (*recv_works)[static_cast<size_t>(k)]) w.wait();
      auto part = [&](int r) {
        return r == rank ? own.narrow(0, begin, len) : (*received)[static_cast<size_t>(r)].narrow(0, begin, len);
      };
      at::Tensor out_k = out.narrow(0, begin, len);
      if (widen) {
        at::Tensor acc = acc_buffer.narrow(0, 0, len);
        acc.copy_(part(0));
        for (int r = 1; r < size; ++r) combine(acc, acc, part(r).to(acc_dtype), op);
        if (op == ReduceOp::AVG) average(acc, size);
        out_k.copy_(acc);
        continue;
      }
      if (direct >= 0) {
        // out_k holds range `direct` (rank 0 or 1): out_k = x0 op x1, then op x2, ... in rank order.
        if (direct == 0) combine(out_k, out_k, part(1), op);
        else combine(out_k, part(0), out_k, op);
        for (int r = 2; r < size; ++r) combine(out_k, out_k, part(r), op);
        if (op == ReduceOp::AVG) average(out_k, size);
        continue;
      }
      // Same dtype: the ranges in rank order, accumulated in a received buffer until this rank's
      // range is reached, from then on in the output.
      at::Tensor acc;
      for (int r = 0; r < size; ++r) {
        const at::Tensor x = part(r);
        if (!acc.defined()) {
          if (r == rank && !in_place) out_k.copy_(x);
          acc = r == rank ? out_k : x;
          continue;
        }
        at::Tensor dst = (r == rank || acc.data_ptr() == out_k.data_ptr()) ? out_k : acc;
        combine(dst, acc, x, op);
        acc = dst;
      }
      if (op == ReduceOp::AVG) average(out_k, size);
    }
    for (auto& w : *send_works) w.wait();
    received->clear();
  }, ready);
}

Work all_gather_ranges(const GroupRef& g, const at::Tensor& flat, const std::vector<int64_t>& counts, int tag,
                       const std::string& what, bool count) {
  const std::vector<int64_t> offsets = offsets_of(counts);
  if (count && g.health && g.world) g.health->note_collective();
  auto works = std::make_shared<std::vector<Work>>();
  if (g.pg && g.size > 1) {
    const at::Tensor mine = flat.narrow(0, offsets[static_cast<size_t>(g.rank)], counts[static_cast<size_t>(g.rank)]);
    for (int p = 0; p < g.size; ++p) {
      if (p == g.rank) continue;
      if (mine.numel() > 0) works->push_back(detail::post_p2p(g.pg, true, mine, p, tag, what));
      if (counts[static_cast<size_t>(p)] > 0)
        works->push_back(detail::post_p2p(
            g.pg, false, flat.narrow(0, offsets[static_cast<size_t>(p)], counts[static_cast<size_t>(p)]), p, tag, what));
    }
  }
  return composite_work(g, what, [works]() {
    for (auto& w : *works) w.wait();
  }, [works]() { return all_completed(*works); });
}

}  // namespace

Work detail::allreduce_by_halves(ProcessGroup::Impl& group, at::Tensor& tensor, ReduceOp op, std::string what) {
  const GroupRef g = ref_of(group);
  const std::vector<int64_t> counts = ProcessGroup::even_counts(tensor.numel(), g.size);
  const at::Tensor flat = tensor.view({-1});
  const std::vector<int64_t> offsets = offsets_of(counts);
  at::Tensor mine = flat.narrow(0, offsets[static_cast<size_t>(g.rank)], counts[static_cast<size_t>(g.rank)]);
  Work scatter = reduce_scatter_ranges(g, flat, counts, mine, op, what);
  const int tag = kAllreduceGatherTag + static_cast<int>(group.allreduce_sequence++ % kAllreduceGatherTags);
  // The all-gather half starts as soon as the reduce-scatter half is done, on a thread of its own:
  // started from wait(), it would deadlock ranks that wait for two allreduces in different orders
  // (each rank's first wait would need the other's second all-gather).
  struct Halves {
    std::promise<Work> gather_posted;
    std::shared_future<Work> gather;
  };
  auto halves = std::make_shared<Halves>();
  halves->gather = halves->gather_posted.get_future().share();
  std::thread([g, scatter, flat, counts, tag, what, halves]() mutable {
    try {
      scatter.wait();
      halves->gather_posted.set_value(all_gather_ranges(g, flat, counts, tag, what, /*count=*/false));
    } catch (...) {
      halves->gather_posted.set_exception(std::current_exception());
    }
  }).detach();
  GroupRef outer = g;
  outer.health = nullptr;  // each half's own error already carries the health check
  return composite_work(outer, what, [halves]() {
    Work gather = halves->gather.get();
    gather.wait();
  }, [halves]() {
    if (halves->gather.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    try {
      return halves->gather.get().is_completed();
    } catch (...) {
      return true;  // the reduce-scatter half failed: wait() throws at once
    }
  });
}

}  // namespace booster::dist
