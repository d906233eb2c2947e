// process_group_scatter.cpp — reduce-scatter and all-gather of dist::ProcessGroup, pairwise over
// Gloo point-to-point (LibTorch 1.13's Gloo has neither collective).
//
// Direct (pairwise) exchange, every message posted at once: for reduce-scatter rank r sends chunk p
// of its input to every rank p != r and receives chunk r from every other rank; for all-gather it
// sends its chunk to every other rank, received straight into that rank's slice of the output. Each
// rank sends and receives (N-1)/N of the buffer, as a ring would (Thakur, Rabenseifner and Gropp,
// "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005), without a ring's
// N-1 dependent steps, so the operation is asynchronous like the others. Chunks are sent in their
// own dtype (bf16 travels as bf16); reduce-scatter sums in float32 for floating types narrower than
// it (the sum of the N chunks in rank order, the same order on every rank), in the dtype otherwise.
// Messages use internal tags above every user and isend_tensor tag, so they never match user
// point-to-point; all ranks issue collectives in the same order, so messages between two ranks on
// one tag match in that order.
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "process_group_impl.h"

namespace booster::dist {

namespace {

constexpr int kReduceScatterTag = (1 << 30) + 1;
constexpr int kAllGatherTag = (1 << 30) + 2;

void check_contiguous(const at::Tensor& t, const char* op) {
  if (!t.defined()) throw DistError(std::string("booster: ") + op + ": tensor is undefined");
  if (!t.is_contiguous())
    throw DistError(std::string("booster: ") + op +
                    ": tensor must be contiguous (call .contiguous() and copy the result back)");
}

at::ScalarType accumulation_dtype(at::ScalarType t) {
  return (t == at::kBFloat16 || t == at::kHalf) ? at::kFloat : t;
}

}  // namespace

Work ProcessGroup::reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  at::Tensor in = input;  // only read: the chunks are sent from it and summed from it
  return reduce_scatter_impl(output, in, op, /*scratch=*/false);
}

Work ProcessGroup::reduce_scatter_tensor_consuming(at::Tensor& output, at::Tensor& input, ReduceOp op) {
  return reduce_scatter_impl(output, input, op, /*scratch=*/true);
}

Work ProcessGroup::reduce_scatter_impl(at::Tensor& output, at::Tensor& input, ReduceOp op, bool scratch) {
  (void)scratch;  // the pairwise exchange never writes its input
  check_contiguous(output, "reduce_scatter_tensor");
  check_contiguous(input, "reduce_scatter_tensor");
  const int size = impl_->size, rank = impl_->rank;
  if (input.numel() != output.numel() * size || output.scalar_type() != input.scalar_type())
    throw DistError("booster: reduce_scatter_tensor needs an input of numel " +
                    std::to_string(output.numel() * size) + " and the output's dtype, got numel " +
                    std::to_string(input.numel()));
  const int64_t n = output.numel();
  const at::Tensor flat = input.view({-1});
  at::Tensor out = output;
  const std::string what = detail::describe("reduce_scatter", input);
  if (impl_->health && impl_->world) impl_->health->note_collective();
  // Received chunks, by source rank (this rank's own chunk is read from the input). When the sum
  // needs no wider dtype, rank 0's chunk lands straight in `output` (received there, or copied on
  // rank 0) and the others are added to it in rank order: no accumulator, one buffer fewer.
  const at::ScalarType acc_dtype = accumulation_dtype(out.scalar_type());
  const bool into_output = acc_dtype == out.scalar_type();
  auto received = std::make_shared<std::vector<at::Tensor>>(static_cast<size_t>(size));
  auto works = std::make_shared<std::vector<Work>>();
  if (impl_->pg && size > 1 && n > 0) {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      works->push_back(post_p2p(true, flat.narrow(0, static_cast<int64_t>(p) * n, n), p, kReduceScatterTag, what));
      at::Tensor& slot = (*received)[static_cast<size_t>(p)];
      slot = (into_output && p == 0) ? out.view({-1}) : at::empty({n}, input.options());
      works->push_back(post_p2p(false, slot, p, kReduceScatterTag, what));
    }
  }
  if (into_output && rank == 0 && n > 0) out.view({-1}).copy_(flat.narrow(0, 0, n));
  auto impl = std::make_shared<Work::Impl>();
  impl->what = what;
  impl->health = impl_->health;
  impl->world = impl_->world;
  impl->finish = [works, received, flat, out, n, rank, size, op, acc_dtype, into_output]() mutable {
    for (auto& w : *works) w.wait();
    if (n == 0) return;
    auto part = [&](int r) {
      return r == rank ? flat.narrow(0, static_cast<int64_t>(rank) * n, n) : (*received)[static_cast<size_t>(r)];
    };
    at::Tensor acc = into_output ? out.view({-1}) : part(0).to(acc_dtype, /*non_blocking=*/false, /*copy=*/true);
    for (int r = 1; r < size; ++r) {
      at::Tensor x = into_output ? part(r) : part(r).to(acc_dtype);
      switch (op) {
        case ReduceOp::SUM:
        case ReduceOp::AVG: acc.add_(x); break;
        case ReduceOp::MAX: at::maximum_out(acc, acc, x); break;
        case ReduceOp::MIN: at::minimum_out(acc, acc, x); break;
        case ReduceOp::PRODUCT: acc.mul_(x); break;
      }
    }
    if (op == ReduceOp::AVG) {
      if (at::isFloatingType(acc.scalar_type())) acc.div_(size);
      else acc.div_(size, "trunc");
    }
    if (!into_output) out.view({-1}).copy_(acc);
    received->clear();
  };
  return Work(impl);
}

Work ProcessGroup::all_gather_into_tensor(at::Tensor& output, const at::Tensor& input) {
  check_contiguous(output, "all_gather_into_tensor");
  const int size = impl_->size, rank = impl_->rank;
  if (output.numel() != input.numel() * size || output.scalar_type() != input.scalar_type())
    throw DistError("booster: all_gather_into_tensor needs an output of numel " + std::to_string(input.numel() * size) +
                    " and the input's dtype, got numel " + std::to_string(output.numel()));
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
  const std::string what = detail::describe("all_gather_into_tensor", input);
  if (impl_->health && impl_->world) impl_->health->note_collective();
  auto works = std::make_shared<std::vector<Work>>();
  if (impl_->pg && size > 1 && n > 0) {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      works->push_back(post_p2p(true, mine, p, kAllGatherTag, what));
      at::Tensor slot = flat.narrow(0, static_cast<int64_t>(p) * n, n);
      works->push_back(post_p2p(false, slot, p, kAllGatherTag, what));
    }
  }
  auto impl = std::make_shared<Work::Impl>();
  impl->what = what;
  impl->health = impl_->health;
  impl->world = impl_->world;
  impl->finish = [works]() {
    for (auto& w : *works) w.wait();
  };
  return Work(impl);
}

}  // namespace booster::dist
