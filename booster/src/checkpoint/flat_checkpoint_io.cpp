// flat_checkpoint_io.cpp — streamed model save and shard-local model load for FlatParameter models
// (see flat_checkpoint_io.h).
#include "booster/checkpoint/flat_checkpoint_io.h"

#include <ATen/ATen.h>

#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/dist/process_group.h"

namespace booster::checkpoint {

void FlatCheckpointIO::save_model(torch::nn::Module& model, const std::string& path, const ModelSaveOptions& options) {
  std::vector<FlatSource> sources = flat_sources(model);
  // The plan, identical on every rank: (source, parameter) per tensor, then the buffers.
  struct Item {
    size_t source;  // sources.size() for a buffer
    size_t param;
    at::Tensor buffer;
  };
  std::vector<TensorSpec> specs;
  std::vector<Item> items;
  for (size_t s = 0; s < sources.size(); ++s) {
    const FlatParameter& f = *sources[s].flat;
    for (size_t j = 0; j < f.params().size(); ++j) {
      const auto& [name, p] = f.params()[j];
      specs.push_back({options.prefix + name, sources[s].dtype, p.sizes().vec()});
      items.push_back({s, j, at::Tensor()});
    }
  }
  for (const auto& item : model.named_buffers(true)) {
    specs.push_back({options.prefix + item.key(), item.value().scalar_type(), item.value().sizes().vec()});
    items.push_back({sources.size(), 0, item.value().detach()});
  }
  SaveOptions so;
  so.shard = options.shard;
  so.size_per_shard_mb = options.size_per_shard_mb;
  so.use_safetensors = options.use_safetensors;

  // Every rank gathers the sources in order; rank 0 writes. A rank-0 failure stops its writing but
  // not its gathers (the other ranks are waiting in them); the error reaches every rank at the end.
  size_t next = 0;  // sources gathered so far
  at::Tensor gathered;
  auto gather_until = [&](size_t wanted) {  // wanted == sources.size(): all that are left
    while (next < sources.size() && (wanted == sources.size() || next <= wanted)) {
      gathered = at::Tensor();
      gathered = sources[next++].gather_full();
    }
  };
  std::string error;
  if (world_->rank() == 0) {
    try {
      std::function<at::Tensor(size_t)> fetch = [&](size_t i) -> at::Tensor {
        const Item& item = items[i];
        if (item.source == sources.size()) return item.buffer;
        gather_until(item.source);
        const FlatLayout& l = sources[item.source].flat->layout();
        at::Tensor view = gathered.narrow(0, l.offsets[item.param], l.numels[item.param]).view(specs[i].shape);
        // safetensors writes each tensor as it arrives; .bin keeps a shard file's tensors until the
        // file is complete, and a view would keep its whole gathered FlatParameter alive until then.
        return so.use_safetensors ? view : view.clone();
      };
      if (!options.adapter) {
        save_state_dict_streamed(path, specs, so, fetch, "model");
      } else {
        AdaptedModel adapted = adapt_model(*options.adapter, specs, options.prefix);
        AdaptedSave save = adapt_save(adapted.plan, fetch);
        save_state_dict_streamed(path, save.specs, so, save.fetch, adapted.weights_name, adapted.extra_files);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  gather_until(sources.size());  // the gathers rank 0 did not need (all of them on the other ranks)
  gathered = at::Tensor();
  if (world_->size() > 1) error = world_->broadcast_string(error, 0);
  if (!error.empty()) throw CheckpointError(error);
}

void FlatCheckpointIO::load_model(torch::nn::Module& model, const std::string& path, const ModelLoadOptions& options) {
  std::vector<FlatSource> sources = flat_sources(model);
  std::vector<LoadTarget> targets;
  for (const FlatSource& source : sources) {
    FlatParameter* flat = source.flat;
    std::function<at::Tensor()> shard = source.shard;
    for (size_t j = 0; j < flat->params().size(); ++j) {
      const auto& [name, p] = flat->params()[j];
      // Only this rank's piece of the parameter is copied, into its shard (converted to its dtype).
      targets.push_back({name, p.sizes().vec(), source.dtype, p.unsafeGetTensorImpl(),
                         [flat, j, shard](const at::Tensor& from_file) {
                           const FlatLayout::Piece piece = flat->layout().piece(j, flat->group().rank());
                           if (piece.length == 0) return;
                           shard().narrow(0, piece.shard_offset, piece.length)
                               .copy_(from_file.reshape({-1}).narrow(0, piece.tensor_offset, piece.length));
                         }});
    }
  }
  for (const auto& item : model.named_buffers(true)) {
    at::Tensor t = item.value();
    targets.push_back({item.key(), t.sizes().vec(), t.scalar_type(), t.storage().unsafeGetStorageImpl(),
                       [t](const at::Tensor& from_file) mutable { t.copy_(from_file); }});
  }
  load_targets(path, targets, options);
  after_load(model);
}

}  // namespace booster::checkpoint
