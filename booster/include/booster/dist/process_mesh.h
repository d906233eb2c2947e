// process_mesh.h — the world's ranks arranged as an N-dimensional mesh with named dimensions, and
// one process group per dimension (the groups data, tensor and pipeline parallelism reduce over).
//
// Rank layout: row-major, the LAST dimension varies fastest, as in ColossalAI's ProcessGroupMesh and
// Megatron's parallel_state (tensor-parallel ranks are consecutive). With 8 ranks and
// ProcessMesh(world, {{"dp", 2}, {"pp", 2}, {"tp", 2}}):
//
//     rank = ((dp * 2) + pp) * 2 + tp
//     rank:  0  1  2  3  4  5  6  7
//     dp:    0  0  0  0  1  1  1  1
//     pp:    0  0  1  1  0  0  1  1
//     tp:    0  1  0  1  0  1  0  1
//
//     group("tp"): {0,1} {2,3} {4,5} {6,7}    (ranks that differ only in tp)
//     group("pp"): {0,2} {1,3} {4,6} {5,7}
//     group("dp"): {0,4} {1,5} {2,6} {3,7}
//     group({"dp","tp"}): {0,1,4,5} {2,3,6,7}
//
// Inside every group the members are ordered by world rank, so group rank = position along the
// group's dimension(s) (row-major over them). FSDP's HYBRID_SHARD is {{"replicate", R}, {"shard", S}}:
// sharding inside S consecutive ranks, replication across them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "booster/export.h"

namespace booster::dist {

class BOOSTER_API ProcessMesh {
 public:
  struct Dim {
    std::string name;
    int size = 1;
  };

  // Collective over `world` (usually the rendezvous group; a sub-group works the same, and "rank"
  // below is then a rank of that group): every rank constructs the mesh with the same dims. Creates
  // group(d) for every dimension eagerly, in the order of `dims`, each by one ProcessGroup::split
  // of the world, except: a dimension spanning the whole world reuses `world`, and the other
  // dimensions of size 1 share one backend-less group of this rank alone (it connects nothing).
  // Throws std::invalid_argument when `world` is null, `dims` is empty or has more than 32 entries,
  // a name is empty or repeated, a size is < 1, or the product of the sizes differs from
  // world->size() (the message names every dim and the world size); DistError when the ranks passed
  // different dims (a hash of the dims is compared across ranks, one all-gather; the message names
  // rank 0's and the first differing rank's) or a group cannot connect.
  ProcessMesh(std::shared_ptr<ProcessGroup> world, std::vector<Dim> dims);

  const std::vector<Dim>& dims() const { return dims_; }
  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  // Size of dimension `dim` and this rank's coordinate along it (in [0, size(dim))). Unknown names
  // throw std::invalid_argument listing the dims.
  int size(const std::string& dim) const;
  int coordinate(const std::string& dim) const;
  // This rank's coordinates, one per dim in order.
  const std::vector<int>& coordinates() const { return coords_; }
  // Row-major conversions between world ranks and coordinates (std::invalid_argument when out of
  // range or of the wrong length).
  std::vector<int> coordinates_of(int world_rank) const;
  int rank_of(const std::vector<int>& coordinates) const;

  // The group of the ranks that differ from this rank only in `dim` (size(dim) ranks; its rank is
  // coordinate(dim)). Never null; communicates nothing.
  const std::shared_ptr<ProcessGroup>& group(const std::string& dim) const;
  // The group of the ranks that differ from this rank only in `dims` (any order, each at most
  // once): product of their sizes ranks, ordered by world rank. Dims of size 1 add nothing, so a
  // set with one dim of size > 1 gives that dim's group, one with none the size-1 dims' group, and
  // a set spanning the world gives world(). Otherwise
  // the group is made on the first call for that set (collective over the world, one split) and
  // cached: every rank must make the same group(dims) calls in the same order. Throws
  // std::invalid_argument for an empty list, an unknown or a repeated name.
  std::shared_ptr<ProcessGroup> group(const std::vector<std::string>& dims);
  // Makes group({"dp", "tp"}) unambiguous (std::string also converts from two const char*).
  std::shared_ptr<ProcessGroup> group(std::initializer_list<std::string> dims) {
    return group(std::vector<std::string>(dims));
  }

 private:
  int index_of(const std::string& dim) const;
  std::shared_ptr<ProcessGroup> make_group(uint32_t mask);

  std::shared_ptr<ProcessGroup> world_;
  std::vector<Dim> dims_;
  std::vector<int> strides_;  // world-rank step of one unit along each dim
  std::vector<int> coords_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;       // one per dim
  std::shared_ptr<ProcessGroup> self_;                      // this rank alone, if a dim has size 1
  std::map<uint32_t, std::shared_ptr<ProcessGroup>> cache_;  // bitmask of the dims of size > 1 -> split group
};

}  // namespace booster::dist
