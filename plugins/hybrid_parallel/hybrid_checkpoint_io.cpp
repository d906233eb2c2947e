// hybrid_checkpoint_io.cpp — see hybrid_checkpoint_io.h.
#include "hybrid_checkpoint_io.h"

namespace booster::hybrid {

HybridCheckpointIO::HybridCheckpointIO(std::shared_ptr<dist::ProcessGroup> world, Topology topo,
                                       std::shared_ptr<Registry> registry)
    : checkpoint::CheckpointIO(std::move(world)), topo_(std::move(topo)), registry_(std::move(registry)) {}

}  // namespace booster::hybrid
