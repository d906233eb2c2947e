// process_mesh.cpp — row-major rank <-> coordinate arithmetic and one group per mesh dimension.
#include "booster/dist/process_mesh.h"

#include <cstdint>
#include <stdexcept>

namespace booster::dist {

namespace {

std::string dims_text(const std::vector<ProcessMesh::Dim>& dims) {
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i)
    out += (i ? " x " : "") + dims[i].name + "=" + std::to_string(dims[i].size);
  return out;
}

// FNV-1a over the names and sizes: what the ranks compare instead of the dims themselves.
int64_t hash_dims(const std::vector<ProcessMesh::Dim>& dims) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  };
  for (const auto& d : dims) {
    for (char c : d.name) mix(static_cast<unsigned char>(c));
    mix(0);
    for (int b = 0; b < 4; ++b) mix(static_cast<unsigned char>(static_cast<uint32_t>(d.size) >> (8 * b)));
  }
  return static_cast<int64_t>(h);
}

}  // namespace

ProcessMesh::ProcessMesh(std::shared_ptr<ProcessGroup> world, std::vector<Dim> dims)
    : world_(std::move(world)), dims_(std::move(dims)) {
  const std::string text = dims_text(dims_);
  if (!world_) throw std::invalid_argument("booster: ProcessMesh(" + text + "): the world group is null");
  if (dims_.empty()) throw std::invalid_argument("booster: ProcessMesh needs at least one dimension");
  if (dims_.size() > 32)
    throw std::invalid_argument("booster: ProcessMesh supports at most 32 dimensions, got " +
                                std::to_string(dims_.size()) + " (" + text + ")");
  int64_t product = 1;
  for (size_t i = 0; i < dims_.size(); ++i) {
    const Dim& d = dims_[i];
    if (d.name.empty())
      throw std::invalid_argument("booster: ProcessMesh dimension " + std::to_string(i) + " has an empty name (" +
                                  text + ")");
    for (size_t j = 0; j < i; ++j)
      if (dims_[j].name == d.name)
        throw std::invalid_argument("booster: ProcessMesh dimension '" + d.name + "' appears twice (" + text + ")");
    if (d.size < 1)
      throw std::invalid_argument("booster: ProcessMesh dimension '" + d.name + "' has size " +
                                  std::to_string(d.size) + "; sizes must be >= 1 (" + text + ")");
    product *= d.size;
    if (product > world_->size()) break;  // reported below; also keeps the product from overflowing
  }
  if (product != world_->size())
    throw std::invalid_argument("booster: ProcessMesh " + text + " does not match the world: the product of the "
                                "sizes must equal the world size " + std::to_string(world_->size()));

  if (world_->size() > 1) {
    auto hashes = world_->all_gather_int64({hash_dims(dims_)});
    for (int r = 1; r < world_->size(); ++r) {
      if (hashes[r][0] == hashes[0][0]) continue;
      // Every rank saw the mismatch, so all take part in both broadcasts and all throw.
      std::string first = world_->broadcast_string(text, 0);
      std::string other = world_->broadcast_string(text, r);
      throw DistError("booster: ProcessMesh: the ranks passed different dims: rank 0 " + first + ", rank " +
                      std::to_string(r) + " " + other + " (every rank must build the same mesh)");
    }
  }

  const int n = static_cast<int>(dims_.size());
  strides_.assign(n, 1);
  for (int i = n - 2; i >= 0; --i) strides_[i] = strides_[i + 1] * dims_[i + 1].size;
  coords_ = coordinates_of(world_->rank());
  for (int i = 0; i < n; ++i) groups_.push_back(make_group(1u << i));
}

int ProcessMesh::index_of(const std::string& dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == dim) return static_cast<int>(i);
  std::string names;
  for (const auto& d : dims_) names += (names.empty() ? "" : ", ") + d.name;
  throw std::invalid_argument("booster: ProcessMesh has no dimension '" + dim + "' (dims: " + names + ")");
}

int ProcessMesh::size(const std::string& dim) const { return dims_[index_of(dim)].size; }
int ProcessMesh::coordinate(const std::string& dim) const { return coords_[index_of(dim)]; }

std::vector<int> ProcessMesh::coordinates_of(int world_rank) const {
  if (world_rank < 0 || world_rank >= world_->size())
    throw std::invalid_argument("booster: ProcessMesh::coordinates_of(" + std::to_string(world_rank) +
                                "): outside the world's [0, " + std::to_string(world_->size()) + ")");
  std::vector<int> out(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) out[i] = (world_rank / strides_[i]) % dims_[i].size;
  return out;
}

int ProcessMesh::rank_of(const std::vector<int>& coordinates) const {
  if (coordinates.size() != dims_.size())
    throw std::invalid_argument("booster: ProcessMesh::rank_of needs " + std::to_string(dims_.size()) +
                                " coordinates (" + dims_text(dims_) + "), got " + std::to_string(coordinates.size()));
  int rank = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (coordinates[i] < 0 || coordinates[i] >= dims_[i].size)
      throw std::invalid_argument("booster: ProcessMesh::rank_of: coordinate " + std::to_string(coordinates[i]) +
                                  " of '" + dims_[i].name + "' outside [0, " + std::to_string(dims_[i].size) + ")");
    rank += coordinates[i] * strides_[i];
  }
  return rank;
}

const std::shared_ptr<ProcessGroup>& ProcessMesh::group(const std::string& dim) const {
  return groups_[index_of(dim)];
}

std::shared_ptr<ProcessGroup> ProcessMesh::group(const std::vector<std::string>& dims) {
  if (dims.empty()) throw std::invalid_argument("booster: ProcessMesh::group needs at least one dimension");
  uint32_t mask = 0;
  for (const auto& name : dims) {
    const uint32_t bit = 1u << index_of(name);
    if (mask & bit)
      throw std::invalid_argument("booster: ProcessMesh::group: dimension '" + name + "' listed more than once");
    mask |= bit;
  }
  return make_group(mask);
}

// The group over the dims in `mask`, made or found as group(dims) documents. Members differ only
// in those dims; color = the member whose coordinates there are 0, key = offset from it, so the
// split orders members by world rank.
std::shared_ptr<ProcessGroup> ProcessMesh::make_group(uint32_t mask) {
  uint32_t reduced = 0;
  int64_t ranks = 1;
  int offset = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (!(mask & (1u << i)) || dims_[i].size == 1) continue;
    reduced |= 1u << i;
    ranks *= dims_[i].size;
    offset += coords_[i] * strides_[i];
  }
  if (ranks == world_->size()) return world_;
  if (reduced == 0) {
    if (!self_) self_ = world_->split(world_->rank(), 0);
    return self_;
  }
  auto found = cache_.find(reduced);
  if (found != cache_.end()) return found->second;
  auto group = world_->split(world_->rank() - offset, offset);
  cache_.emplace(reduced, group);
  return group;
}

}  // namespace booster::dist
