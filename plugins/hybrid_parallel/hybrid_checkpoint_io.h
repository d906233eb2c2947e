// hybrid_checkpoint_io.h — checkpoints of the hybrid_parallel plugin, in the layout of every other
// plugin (HF safetensors with the dense parameter names; the optimizer keyed by full parameter
// name), so a checkpoint saved at one (dp, pp, tp) shape loads at any other and into any plugin.
#pragma once

#include <memory>

#include "booster/checkpoint/checkpoint_io.h"
#include "hybrid_state.h"

namespace booster::hybrid {

class HybridCheckpointIO : public checkpoint::CheckpointIO {
 public:
  HybridCheckpointIO(std::shared_ptr<dist::ProcessGroup> world, Topology topo, std::shared_ptr<Registry> registry);

 private:
  Topology topo_;
  std::shared_ptr<Registry> registry_;
};

}  // namespace booster::hybrid
