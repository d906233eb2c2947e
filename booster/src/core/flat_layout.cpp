// flat_layout.cpp — padded flat layout split into equal per-rank shards (see flat_layout.h).
#include "booster/core/flat_layout.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace booster {

FlatLayout make_flat_layout(const std::vector<int64_t>& numels, int world_size) {
  if (world_size < 1) throw std::invalid_argument("booster: make_flat_layout: world_size must be >= 1");
  FlatLayout l;
  l.world_size = world_size;
  for (int64_t n : numels) {
    if (n < 0) throw std::invalid_argument("booster: make_flat_layout: negative numel " + std::to_string(n));
    l.offsets.push_back(l.numel);
    l.numels.push_back(n);
    l.numel += n;
  }
  l.shard_numel = std::max<int64_t>(1, (l.numel + world_size - 1) / world_size);
  l.padded_numel = l.shard_numel * world_size;
  return l;
}

FlatLayout::Piece FlatLayout::piece(size_t i, int rank) const {
  Piece p;
  int64_t lo = std::max(offsets.at(i), shard_begin(rank));
  int64_t hi = std::min(offsets[i] + numels[i], shard_begin(rank) + shard_numel);
  if (hi <= lo) return p;
  p.tensor_offset = lo - offsets[i];
  p.shard_offset = lo - shard_begin(rank);
  p.length = hi - lo;
  return p;
}

at::Tensor flatten_into_views(std::vector<at::Tensor>& tensors, const FlatLayout& layout) {
  if (tensors.size() != layout.numels.size())
    throw std::invalid_argument("booster: flatten_into_views: layout has " + std::to_string(layout.numels.size()) +
                                " tensors, got " + std::to_string(tensors.size()));
  at::TensorOptions opts = tensors.empty() ? at::TensorOptions(at::kFloat) : tensors[0].options();
  for (const auto& t : tensors)
    if (t.scalar_type() != tensors[0].scalar_type() || t.device() != tensors[0].device())
      throw std::invalid_argument(std::string("booster: flatten_into_views: tensors of one flat buffer need one dtype "
                                              "and device, got ") + c10::toString(tensors[0].scalar_type()) + " and " +
                                  c10::toString(t.scalar_type()) + "; put them in separate parameter groups");
  at::Tensor flat = at::zeros({layout.padded_numel}, opts.requires_grad(false));
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor view = flat.narrow(0, layout.offsets[i], layout.numels[i]).view(tensors[i].sizes());
    view.copy_(tensors[i].detach());
    tensors[i].set_data(view);
  }
  return flat;
}

}  // namespace booster
