// optimizer_state.cpp — state keys of LibTorch's optimizer map and the optimizer's state size (by place).
#include "booster/optim/optimizer_state.h"

#include "booster/optim/optimizer_registry.h"

namespace booster {

OptimizerStateKey optimizer_state_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  return optimizer_state_places(optimizer, /*check_pinned=*/false, /*planned_pinned=*/false).total;
}

PlacedBytes optimizer_state_places(torch::optim::Optimizer& optimizer, bool check_pinned, bool planned_pinned) {
  const OptimizerTypeInfo& info = optimizer_type_info(optimizer);
  PlacedBytes out;
  auto& state = optimizer.state();
  if (!state.empty()) {
    for (auto& [key, st] : state)
      for (auto& [name, t] : info.extract_state(*st).tensors) out.add(t, check_pinned);
    return out;
  }
  for (const auto& group : optimizer.param_groups()) {
    const int64_t per = info.state_tensors_per_element(group.options());
    for (const auto& p : group.params()) {
      const int64_t bytes = per * p.numel() * static_cast<int64_t>(p.element_size());
      out.total += bytes;
      if (!p.device().is_cpu()) out.on_device += bytes;
      else if (planned_pinned) out.pinned += bytes;
    }
  }
  return out;
}

}  // namespace booster
