// fsdp_checkpoint_io.cpp — streamed model save and shard-local model load (see fsdp_checkpoint_io.h).
#include "fsdp_checkpoint_io.h"

#include <ATen/ATen.h>

#include "booster/checkpoint/state_dict_io.h"

namespace booster::plugins::fsdp {

using checkpoint::CheckpointError;

FsdpCheckpointIO::FsdpCheckpointIO(std::shared_ptr<dist::ProcessGroup> world, std::weak_ptr<FsdpState> state)
    : CheckpointIO(std::move(world)), state_(std::move(state)) {}

std::shared_ptr<FsdpState> FsdpCheckpointIO::state_for(torch::nn::Module& model) const {
  std::shared_ptr<FsdpState> state = state_.lock();
  if (!state || &state->module() != &model)
    throw CheckpointError("booster: torch_fsdp: the model given to save_model / load_model is not the model this "
                          "plugin boosted; pass the boosted model (its parameters are sharded by the plugin)");
  return state;
}

void FsdpCheckpointIO::save_model(torch::nn::Module& model, const std::string& path,
                                  const checkpoint::ModelSaveOptions& options) {
  std::shared_ptr<FsdpState> state = state_for(model);
  state->reshard_all();
  // The plan, identical on every rank: (unit, flat, parameter) per tensor, then the buffers.
  struct Item {
    FlatParameter* flat;  // null for a buffer
    size_t param;
    at::Tensor buffer;
  };
  std::vector<checkpoint::TensorSpec> specs;
  std::vector<Item> items;
  std::vector<FlatParameter*> flats;
  for (auto& unit : state->units())
    for (auto& f : unit.flats) {
      flats.push_back(f.get());
      for (size_t j = 0; j < f->params().size(); ++j) {
        const auto& [name, p] = f->params()[j];
        specs.push_back({options.prefix + name, f->shard_dtype(), p.sizes().vec()});
        items.push_back({f.get(), j, at::Tensor()});
      }
    }
  for (const auto& item : model.named_buffers(true)) {
    specs.push_back({options.prefix + item.key(), item.value().scalar_type(), item.value().sizes().vec()});
    items.push_back({nullptr, 0, item.value().detach()});
  }
  checkpoint::SaveOptions so;
  so.shard = options.shard;
  so.size_per_shard_mb = options.size_per_shard_mb;
  so.use_safetensors = options.use_safetensors;

  // Every rank gathers the flats in order; rank 0 writes. A rank-0 failure stops its writing but not
  // its gathers (the other ranks are waiting in them); the error reaches every rank at the end.
  size_t next_flat = 0;  // flats gathered so far
  FlatParameter* current = nullptr;
  at::Tensor gathered;
  // Gathers the flats in order up to `wanted` (null: all that are left).
  auto gather_until = [&](FlatParameter* wanted) {
    while (next_flat < flats.size() && (wanted == nullptr || current != wanted)) {
      gathered = at::Tensor();
      current = flats[next_flat++];
      gathered = current->gather_full();
    }
  };
  std::string error;
  if (world_->rank() == 0) {
    try {
      checkpoint::save_state_dict_streamed(path, specs, so, [&](size_t i) -> at::Tensor {
        const Item& item = items[i];
        if (item.flat == nullptr) return item.buffer;
        gather_until(item.flat);
        const FlatLayout& l = item.flat->layout();
        at::Tensor view = gathered.narrow(0, l.offsets[item.param], l.numels[item.param]).view(specs[i].shape);
        // safetensors writes each tensor as it arrives; .bin keeps a shard file's tensors until the
        // file is complete, and a view would keep its whole gathered unit alive until then.
        return so.use_safetensors ? view : view.clone();
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  gather_until(nullptr);  // the gathers rank 0 did not need (all of them on the other ranks)
  gathered = at::Tensor();
  if (world_->size() > 1) error = world_->broadcast_string(error, 0);
  if (!error.empty()) throw CheckpointError(error);
}

void FsdpCheckpointIO::load_model(torch::nn::Module& model, const std::string& path, bool strict) {
  std::shared_ptr<FsdpState> state = state_for(model);
  state->reshard_all();
  std::vector<LoadTarget> targets;
  for (auto& unit : state->units())
    for (auto& f : unit.flats) {
      FlatParameter* flat = f.get();
      for (size_t j = 0; j < flat->params().size(); ++j) {
        const auto& [name, p] = flat->params()[j];
        // Only this rank's piece of the parameter is copied, into its shard (converted to its dtype).
        targets.push_back({name, p.sizes().vec(), flat->shard_dtype(), p.unsafeGetTensorImpl(),
                           [flat, j](const at::Tensor& from_file) {
                             const FlatLayout::Piece piece = flat->layout().piece(j, flat->group().rank());
                             if (piece.length == 0) return;
                             flat->local_shard()
                                 .narrow(0, piece.shard_offset, piece.length)
                                 .copy_(from_file.reshape({-1}).narrow(0, piece.tensor_offset, piece.length));
                           }});
      }
    }
  for (const auto& item : model.named_buffers(true)) {
    at::Tensor t = item.value();
    targets.push_back({item.key(), t.sizes().vec(), t.scalar_type(), t.storage().unsafeGetStorageImpl(),
                       [t](const at::Tensor& from_file) mutable { t.copy_(from_file); }});
  }
  load_targets(path, targets, strict);
}

}  // namespace booster::plugins::fsdp
