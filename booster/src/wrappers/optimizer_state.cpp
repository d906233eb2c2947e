// optimizer_state.cpp — state keys of LibTorch's optimizer map and the optimizer's state size.
#include "booster/wrappers/optimizer_state.h"

#include "booster/wrappers/optimizer_registry.h"

namespace booster {

OptimizerStateKey optimizer_state_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  const OptimizerTypeInfo& info = optimizer_type_info(optimizer);
  auto& state = optimizer.state();
  int64_t bytes = 0;
  if (!state.empty()) {
    for (auto& [k, st] : state)
      for (auto& [name, t] : info.extract_state(*st).tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
    return bytes;
  }
  for (const auto& group : optimizer.param_groups()) {
    int64_t per = info.state_tensors_per_element(group.options());
    for (const auto& p : group.params()) bytes += per * p.numel() * static_cast<int64_t>(p.element_size());
  }
  return bytes;
}

}  // namespace booster
