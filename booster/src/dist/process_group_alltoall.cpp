// process_group_alltoall.cpp — ProcessGroup::all_to_all_single (process_group.h): equal ranges
// exchanged between every pair of ranks, on Gloo's (or the device backend's) alltoall.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "process_group_impl.h"

namespace booster::dist {

Work ProcessGroup::all_to_all_single(at::Tensor& output, const at::Tensor& input) {
  for (const at::Tensor* t : {static_cast<const at::Tensor*>(&output), &input}) {
    if (!t->defined()) throw DistError("booster: all_to_all_single: tensor is undefined");
    if (!t->is_contiguous())
      throw DistError("booster: all_to_all_single: tensors must be contiguous (call .contiguous() and copy the result back)");
  }
  if (output.numel() != input.numel() || output.scalar_type() != input.scalar_type())
    throw DistError("booster: all_to_all_single needs an output of the input's numel (" + std::to_string(input.numel()) +
                    ") and dtype, got numel " + std::to_string(output.numel()));
  if (input.numel() % impl_->size != 0)
    throw DistError("booster: all_to_all_single: numel " + std::to_string(input.numel()) +
                    " is not divisible by the group size " + std::to_string(impl_->size));
  if (impl_->size == 1 || !impl_->pg) {
    output.copy_(input);
    return Work();
  }
  if (detail::needs_staging(*impl_, input))
    return detail::staged({output, input}, {true, false},
                          [this](std::vector<at::Tensor>& h) { return all_to_all_single(h[0], h[1]); });
  const bool device = detail::on_device_backend(*impl_, input);
  const bool cast = input.scalar_type() == at::kBFloat16 && !impl_->native_bf16 && !device;
  at::Tensor in = cast ? input.to(at::kFloat) : input;
  at::Tensor out = cast ? at::empty(output.sizes(), output.options().dtype(at::kFloat)) : output;
  std::vector<int64_t> no_splits;
  c10d::AllToAllOptions o;
  auto w = impl_->pg->alltoall_base(out, in, no_splits, no_splits, o);
  at::Tensor result = output;
  return detail::make_work(w, [result, out, in, cast]() mutable { if (cast) result.copy_(out); },
                           detail::describe("all_to_all_single", input), impl_.get());
}

}  // namespace booster::dist
