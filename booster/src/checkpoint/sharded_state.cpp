// sharded_state.cpp — the sharded (DCP-like) state format (see booster/checkpoint/sharded_state.h and
// docs/checkpoint-format.md, "Sharded state").
//
// Saving is four steps, each reached by every rank whatever happened before, so a failure anywhere
// never leaves a rank waiting in a collective the others skipped:
//   1. all-gather of every rank's piece descriptors (or its local validation error); every rank then
//      validates the whole set identically and throws the same error (nothing written yet);
//   2. rank 0 enters io::atomic_write_directory and, inside `fill`, broadcasts "T<save id><tmp>" (or
//      "E<error>" when it could not get there: then every rank throws that error);
//   3. every rank writes its file into tmp (rank 0 also the json and the extra files), then an
//      all-gather of the outcomes: any failure -> every rank throws the same message, rank 0 from
//      inside `fill`, so the temporary directory is removed and `dir` is unchanged;
//   4. rank 0's fill returns, the directory is fsynced and swapped in; rank 0 broadcasts the commit's
//      outcome ("" = committed).
// Reading validates the json and every rank file's header up front, then reads ranges with pread
// (read_safetensors_range), never whole files.
#include "booster/checkpoint/sharded_state.h"

#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <unordered_map>
#include <utility>

#include "booster/dist/process_group.h"
#include "booster/io/atomic_write.h"
#include "checkpoint_detail.h"
#include "sharded_index.h"

namespace booster::checkpoint {

using detail::checked_numel;
using detail::join;
using detail::kShardedFormat;
using detail::range_text;
using detail::quote;
using detail::is_plain_file_name;
using detail::shape_text;

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr size_t kSaveIdChars = 16;

std::string index_file_name(const std::string& base) { return base + ".sharded.json"; }

std::string rank_file_name(const std::string& base, int rank, int world_size) {
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), "-rank-%05d-of-%05d", rank, world_size);
  return base + suffix + ".safetensors";
}

std::string entry_name(const std::string& name, int64_t offset) { return name + "@" + std::to_string(offset); }


bool valid_utf8(const std::string& s) {
  try {
    (void)json(s).dump(-1, ' ', false, json::error_handler_t::strict);
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

// Runs f; returns "" or what it threw.
template <class F>
std::string capture(F&& f) {
  try {
    f();
    return "";
  } catch (const std::exception& e) {
    std::string what = e.what();
    return what.empty() ? "exception without message" : what;
  } catch (...) {
    return "unknown exception";
  }
}

// ---- the group's collectives, or their single-process equivalents ------------------------------

class Comm {
 public:
  explicit Comm(dist::ProcessGroup* group)
      : group_(group && group->size() > 1 ? group : nullptr),
        rank_(group ? group->rank() : 0),
        size_(group ? group->size() : 1) {}
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Every rank's string, by rank.
  std::vector<std::string> all_gather(const std::string& s) const {
    if (!group_) return {s};
    const auto lengths = group_->all_gather_int64({static_cast<int64_t>(s.size())});
    int64_t longest = 1;  // no zero-size collectives
    for (const auto& l : lengths) longest = std::max(longest, l.at(0));
    at::Tensor in = at::zeros({longest}, at::kByte);
    if (!s.empty()) std::memcpy(in.data_ptr(), s.data(), s.size());
    std::vector<at::Tensor> out;
    for (int r = 0; r < size_; ++r) out.push_back(at::empty({longest}, at::kByte));
    group_->allgather(out, in).wait();
    std::vector<std::string> result;
    for (int r = 0; r < size_; ++r)
      result.emplace_back(static_cast<const char*>(out[r].data_ptr()), static_cast<size_t>(lengths[r].at(0)));
    return result;
  }

  // Rank 0's string on every rank.
  std::string broadcast_from_0(const std::string& s) const { return group_ ? group_->broadcast_string(s, 0) : s; }

 private:
  dist::ProcessGroup* group_;
  int rank_, size_;
};

// ---- step 1: piece descriptors and their validation ---------------------------------------------

struct PieceDesc {
  std::string name, dtype;
  std::vector<int64_t> shape;
  int64_t offset = 0, length = 0;
};

struct RankDesc {
  std::string dir, base, error;
  std::vector<PieceDesc> pieces;
};

// The first problem of this rank's own pieces ("" when none).
std::string check_local_pieces(const std::vector<StatePiece>& pieces) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    const StatePiece& p = pieces[i];
    const std::string label = "piece " + std::to_string(i) + " (tensor " + quote(p.name, false) + ", offset " +
                              std::to_string(p.offset) + ")";
    if (p.name.empty()) return "piece " + std::to_string(i) + " has an empty name";
    if (!valid_utf8(p.name)) return label + ": the name is not valid UTF-8";
    if (!p.values.defined()) return label + ": values is undefined";
    if (p.values.dim() != 1) return label + ": values must be 1-D, got shape " + shape_text(p.values.sizes().vec());
    try {
      (void)safetensors_dtype(p.values.scalar_type());
    } catch (const CheckpointError& e) {
      return label + ": " + e.what();
    }
    const int64_t numel = checked_numel(p.shape);
    if (numel < 0) return label + ": invalid shape " + shape_text(p.shape);
    const int64_t length = p.values.numel();
    if (p.offset < 0 || p.offset > numel || length > numel - p.offset)
      return label + ": elements [" + std::to_string(p.offset) + ", " + std::to_string(p.offset) + " + " +
             std::to_string(length) + ") are outside the tensor's " + std::to_string(numel) + " elements (shape " +
             shape_text(p.shape) + ")";
  }
  return "";
}

std::string describe_rank(const std::string& dir, const std::string& base, const std::vector<StatePiece>& pieces,
                          const std::string& extra_error) {
  json d;
  d["dir"] = dir;
  d["base"] = base;
  d["error"] = extra_error.empty() ? check_local_pieces(pieces) : extra_error;
  d["pieces"] = json::array();
  if (d["error"].get<std::string>().empty())
    for (const StatePiece& p : pieces)
      d["pieces"].push_back(
          json::array({p.name, safetensors_dtype(p.values.scalar_type()), p.shape, p.offset, p.values.numel()}));
  return d.dump(-1, ' ', false, json::error_handler_t::replace);
}

RankDesc parse_rank(const std::string& text) {
  json d = json::parse(text);
  RankDesc r;
  r.dir = d.at("dir").get<std::string>();
  r.base = d.at("base").get<std::string>();
  r.error = d.at("error").get<std::string>();
  for (const auto& p : d.at("pieces"))
    r.pieces.push_back({p.at(0).get<std::string>(), p.at(1).get<std::string>(), p.at(2).get<std::vector<int64_t>>(),
                        p.at(3).get<int64_t>(), p.at(4).get<int64_t>()});
  return r;
}

struct PieceRef {
  int rank = 0;
  int64_t offset = 0, length = 0;
};

struct PlannedTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  int first_rank = 0;             // the rank whose piece defined dtype and shape
  std::vector<PieceRef> pieces;   // non-empty, sorted by offset after validation
};

std::string failure_message(const std::string& dir, const std::vector<std::pair<int, std::string>>& failures) {
  std::string msg = "booster: cannot save sharded state to '" + dir + "' (it is unchanged): ";
  const size_t shown = std::min<size_t>(failures.size(), 8);
  for (size_t i = 0; i < shown; ++i)
    msg += (i ? "; " : "") + std::string("rank ") + std::to_string(failures[i].first) + ": " + failures[i].second;
  if (failures.size() > shown) msg += "; ... and " + std::to_string(failures.size() - shown) + " more ranks";
  return msg;
}

// Validates every rank's descriptors (identically on every rank) into the tensors to save, in save
// order (first appearance, ranks in order, each rank's pieces in its order). Throws CheckpointError.
std::vector<PlannedTensor> plan_tensors(const std::string& dir, const std::vector<std::string>& texts) {
  std::vector<RankDesc> ranks;
  std::vector<std::pair<int, std::string>> failures;
  for (size_t r = 0; r < texts.size(); ++r) {
    try {
      ranks.push_back(parse_rank(texts[r]));
    } catch (const json::exception& e) {
      ranks.emplace_back();
      ranks.back().error = std::string("malformed piece descriptors: ") + e.what();
    }
    if (!ranks.back().error.empty()) failures.emplace_back(static_cast<int>(r), ranks.back().error);
  }
  for (size_t r = 1; r < ranks.size(); ++r)
    if (ranks[r].error.empty() && (ranks[r].dir != ranks[0].dir || ranks[r].base != ranks[0].base))
      failures.emplace_back(static_cast<int>(r), "called with dir " + quote(ranks[r].dir) + " and base " +
                                                     quote(ranks[r].base) + ", rank 0 with dir " + quote(ranks[0].dir) +
                                                     " and base " + quote(ranks[0].base) +
                                                     " (every rank must pass the same)");
  if (!failures.empty()) throw CheckpointError(failure_message(dir, failures));

  std::vector<PlannedTensor> tensors;
  std::unordered_map<std::string, size_t> index;
  const std::string prefix = "booster: cannot save sharded state to '" + dir + "' (it is unchanged): ";
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const PieceDesc& p : ranks[r].pieces) {
      auto [it, inserted] = index.emplace(p.name, tensors.size());
      if (inserted) tensors.push_back({p.name, p.dtype, p.shape, static_cast<int>(r), {}});
      PlannedTensor& t = tensors[it->second];
      if (p.dtype != t.dtype || p.shape != t.shape)
        throw CheckpointError(prefix + "tensor " + quote(p.name) + ": rank " + std::to_string(t.first_rank) +
                              " holds it as " + t.dtype + " " + shape_text(t.shape) + ", rank " + std::to_string(r) +
                              " as " + p.dtype + " " + shape_text(p.shape) +
                              " (every piece of a tensor must have the same dtype and full shape)");
      if (p.length > 0) t.pieces.push_back({static_cast<int>(r), p.offset, p.length});
    }
  }
  for (PlannedTensor& t : tensors) {
    std::stable_sort(t.pieces.begin(), t.pieces.end(),
                     [](const PieceRef& a, const PieceRef& b) { return a.offset < b.offset; });
    for (size_t i = 1; i < t.pieces.size(); ++i) {
      const PieceRef& a = t.pieces[i - 1];
      const PieceRef& b = t.pieces[i];
      if (b.offset < a.offset + a.length)
        throw CheckpointError(prefix + "tensor " + quote(t.name) + ": rank " + std::to_string(a.rank) + "'s piece " +
                              range_text(a.offset, a.offset + a.length) + " overlaps rank " + std::to_string(b.rank) +
                              "'s piece " + range_text(b.offset, b.offset + b.length) +
                              " (pieces must be disjoint; save replicated state from one replica only)");
    }
  }
  return tensors;
}

// ---- steps 2-4: the files -----------------------------------------------------------------------

std::string make_save_id() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  v ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
  v ^= static_cast<uint64_t>(::getpid()) << 17;
  char buf[kSaveIdChars + 1];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void write_rank_file(const std::string& path, const std::vector<StatePiece>& pieces, const std::string& save_id,
                     int rank, int world_size) {
  StateDict entries;
  ojson described = ojson::array();
  for (const StatePiece& p : pieces) {
    if (p.values.numel() == 0) continue;
    const std::string entry = entry_name(p.name, p.offset);
    entries.emplace_back(entry, p.values.detach());
    described.push_back({{"entry", entry}, {"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
  }
  write_safetensors(path, entries,
                    {{"format", kShardedFormat},
                     {"save_id", save_id},
                     {"rank", std::to_string(rank)},
                     {"world_size", std::to_string(world_size)},
                     {"pieces", described.dump()}});
}

std::string index_text(const std::vector<PlannedTensor>& tensors, const std::string& base, int world_size,
                       const std::string& save_id, const std::map<std::string, std::string>& extra_files) {
  ojson doc;
  doc["format"] = kShardedFormat;
  doc["world_size"] = world_size;
  doc["save_id"] = save_id;
  doc["files"] = ojson::array();
  for (int r = 0; r < world_size; ++r) doc["files"].push_back(rank_file_name(base, r, world_size));
  doc["extra_files"] = ojson::array();
  for (const auto& [name, text] : extra_files) doc["extra_files"].push_back(name);
  doc["tensors"] = ojson::array();
  for (const PlannedTensor& t : tensors) {
    ojson jt;
    jt["name"] = t.name;
    jt["dtype"] = t.dtype;
    jt["shape"] = t.shape;
    jt["pieces"] = ojson::array();
    for (const PieceRef& p : t.pieces)
      jt["pieces"].push_back({{"file", rank_file_name(base, p.rank, world_size)},
                              {"entry", entry_name(t.name, p.offset)},
                              {"offset", p.offset},
                              {"length", p.length}});
    doc["tensors"].push_back(std::move(jt));
  }
  return doc.dump(1, ' ', false, ojson::error_handler_t::strict) + "\n";
}

// Rank 0's own checks of what only it uses: the base name and the extra files.
std::string check_rank0_arguments(const std::string& base, int world_size,
                                  const std::map<std::string, std::string>& extra_files) {
  if (!is_plain_file_name(base)) return "invalid base name " + quote(base) + " (must be a plain file name)";
  std::set<std::string> generated{index_file_name(base)};
  for (int r = 0; r < world_size; ++r) generated.insert(rank_file_name(base, r, world_size));
  for (const auto& [name, text] : extra_files) {
    if (!is_plain_file_name(name)) return "extra file " + quote(name) + " is not a plain file name";
    if (!valid_utf8(name)) return "extra file name " + quote(name, false) + " is not valid UTF-8";
    if (generated.count(name)) return "extra file " + quote(name) + " collides with a file of the checkpoint";
  }
  return "";
}

}  // namespace

void save_sharded_state(const std::string& dir, const std::vector<StatePiece>& pieces, dist::ProcessGroup* group,
                        const std::string& base, const std::map<std::string, std::string>& extra_files) {
  const Comm comm(group);
  const int rank = comm.rank(), world = comm.size();
  try {
    // 1. descriptors, validated everywhere.
    const std::string own_error = rank == 0 ? check_rank0_arguments(base, world, extra_files) : "";
    const std::vector<PlannedTensor> tensors =
        plan_tensors(dir, comm.all_gather(describe_rank(dir, base, pieces, own_error)));

    // 3. (inside fill on rank 0) this rank's files, then everyone's outcome.
    auto write_and_agree = [&](const std::string& tmp, const std::string& save_id, const std::string& preset_error) {
      std::string error = preset_error;
      if (error.empty()) error = capture([&] {
        if (rank != 0) {
          struct stat st {};
          if (::stat(tmp.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
            throw CheckpointError("the temporary directory '" + tmp + "' that rank 0 created is not visible here "
                                  "(the checkpoint directory must be on a file system every rank shares)");
        }
        detail::as_checkpoint_error([&] {
          write_rank_file(join(tmp, rank_file_name(base, rank, world)), pieces, save_id, rank, world);
          if (rank == 0) {
            io::write_new_file(join(tmp, index_file_name(base)), index_text(tensors, base, world, save_id, extra_files));
            for (const auto& [name, text] : extra_files) io::write_new_file(join(tmp, name), text);
          }
        });
      });
      std::vector<std::pair<int, std::string>> failures;
      const std::vector<std::string> outcomes = comm.all_gather(error);
      for (int r = 0; r < world; ++r)
        if (!outcomes[r].empty()) failures.emplace_back(r, outcomes[r]);
      return failures.empty() ? std::string() : failure_message(dir, failures);
    };

    if (rank == 0) {
      enum class Stage { before_fill, announcing, agreeing, agreed_failed, agreed_ok } stage = Stage::before_fill;
      try {
        detail::as_checkpoint_error([&] {
          io::atomic_write_directory(dir, [&](const std::string& tmp) {
            const std::string save_id = make_save_id();
            stage = Stage::announcing;
            comm.broadcast_from_0("T" + save_id + tmp);  // 2.
            stage = Stage::agreeing;
            const std::string verdict = write_and_agree(tmp, save_id, "");
            if (!verdict.empty()) {
              stage = Stage::agreed_failed;
              throw CheckpointError(verdict);  // tmp is removed, dir unchanged
            }
            stage = Stage::agreed_ok;
          });
        });
      } catch (const std::exception& e) {
        if (stage == Stage::before_fill) {  // the others wait for step 2: tell them
          const std::string msg = failure_message(dir, {{0, e.what()}});
          comm.broadcast_from_0("E" + msg);
          throw CheckpointError(msg);
        }
        if (stage == Stage::agreed_ok) {  // the others wait for step 4: the commit failed
          const std::string msg = failure_message(dir, {{0, std::string("committing the directory failed: ") + e.what()}});
          comm.broadcast_from_0(msg);
          throw CheckpointError(msg);
        }
        throw;  // agreed_failed: every rank throws the verdict; announcing/agreeing: the group broke
      }
      comm.broadcast_from_0("");  // 4. committed
      return;
    }

    const std::string announced = comm.broadcast_from_0("");  // 2.
    if (!announced.empty() && announced[0] == 'E') throw CheckpointError(announced.substr(1));
    const bool well_formed = announced.size() > 1 + kSaveIdChars && announced[0] == 'T';
    const std::string save_id = well_formed ? announced.substr(1, kSaveIdChars) : "";
    const std::string tmp = well_formed ? announced.substr(1 + kSaveIdChars) : "";
    // 3. (a malformed announcement still takes part, as a failure, so that nobody waits)
    const std::string verdict = write_and_agree(tmp, save_id, well_formed ? "" : "malformed message from rank 0");
    if (!verdict.empty()) throw CheckpointError(verdict);
    const std::string committed = comm.broadcast_from_0("");  // 4.
    if (!committed.empty()) throw CheckpointError(committed);
  } catch (const dist::DistError& e) {
    throw CheckpointError("booster: cannot save sharded state to '" + dir +
                          "': a collective of the save failed (the process group is unusable): " + e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Reader

struct ShardedStateReader::Impl {
  std::string dir, base, index_path, save_id;
  int world_size = 0;
  std::vector<std::string> files;                       // full paths, by rank
  std::vector<SafetensorsHeader> headers;               // by rank
  std::vector<ShardedTensorInfo> tensors;
  std::vector<std::vector<size_t>> piece_entries;       // [tensor][piece] -> index in headers[rank].tensors
  std::unordered_map<std::string, size_t> by_name;
  std::vector<std::string> extra_files;
};

namespace {

std::string read_whole_file(const std::string& path) {
  uint64_t size = 0;
  detail::Fd fd = detail::open_for_reading(path, &size);
  if (size > (uint64_t{1} << 32)) detail::fail(path, "is too large (" + std::to_string(size) + " bytes)");
  std::string text(static_cast<size_t>(size), '\0');
  if (size) detail::pread_all(fd.get(), reinterpret_cast<uint8_t*>(text.data()), text.size(), 0, path);
  return text;
}

void load_index(ShardedStateReader::Impl& m) {
  const std::string& ip = m.index_path;
  detail::ShardedIndex index = detail::parse_sharded_index(read_whole_file(ip), ip);
  m.world_size = index.world_size;
  m.save_id = index.save_id;
  for (const std::string& f : index.files) m.files.push_back(join(m.dir, f));
  m.extra_files = std::move(index.extra_files);
  for (detail::ShardedIndexTensor& it : index.tensors) {
    ShardedTensorInfo t;
    t.name = std::move(it.name);
    try {
      t.dtype = scalar_type_from_safetensors(it.dtype);
    } catch (const CheckpointError& e) {
      detail::fail(ip, "tensor " + quote(t.name) + ": " + e.what());
    }
    t.shape = std::move(it.shape);
    t.numel = it.numel;
    t.covered = it.covered;
    for (detail::ShardedIndexPiece& p : it.pieces)
      t.pieces.push_back({static_cast<int>(p.file), m.files[p.file], std::move(p.entry), p.offset, p.length});
    m.by_name.emplace(t.name, m.tensors.size());
    m.tensors.push_back(std::move(t));
  }

  // Every rank file: a header of this save holding each entry the index assigns to it.
  std::vector<std::unordered_map<std::string, size_t>> entry_index(m.files.size());
  for (size_t r = 0; r < m.files.size(); ++r) {
    const std::string& path = m.files[r];
    SafetensorsHeader h = read_safetensors_header(path);
    auto meta = [&](const char* key) {
      auto it = h.metadata.find(key);
      return it == h.metadata.end() ? std::string() : it->second;
    };
    if (meta("format") != kShardedFormat)
      detail::fail(path, "is not a rank file of a sharded checkpoint (its __metadata__ \"format\" is " +
                             quote(meta("format")) + ", expected " + kShardedFormat + ")");
    if (meta("save_id") != m.save_id)
      detail::fail(path, "belongs to another save (save_id " + quote(meta("save_id")) + ", the index '" + ip +
                             "' has " + quote(m.save_id) + "); the checkpoint directory mixes files of two saves");
    for (size_t e = 0; e < h.tensors.size(); ++e) entry_index[r][h.tensors[e].name] = e;
    m.headers.push_back(std::move(h));
  }
  for (const ShardedTensorInfo& t : m.tensors) {
    std::vector<size_t> found;
    const std::string dtype = safetensors_dtype(t.dtype);
    for (const ShardedPieceInfo& p : t.pieces) {
      const auto& idx = entry_index[static_cast<size_t>(p.rank)];
      auto it = idx.find(p.entry);
      if (it == idx.end())
        detail::fail(p.file, "has no entry " + quote(p.entry) + " (tensor " + quote(t.name) + " " +
                                 range_text(p.offset, p.offset + p.length) + ", listed in '" + ip + "')");
      const SafetensorsEntry& e = m.headers[static_cast<size_t>(p.rank)].tensors[it->second];
      const bool dtype_ok = e.dtype == dtype || scalar_type_from_safetensors(e.dtype) == t.dtype;
      if (!dtype_ok || e.shape != std::vector<int64_t>{p.length})
        detail::fail(p.file, "entry " + quote(p.entry) + " is " + e.dtype + " " + shape_text(e.shape) + ", but '" + ip +
                                 "' describes " + dtype + " [" + std::to_string(p.length) + "]");
      found.push_back(it->second);
    }
    m.piece_entries.push_back(std::move(found));
  }
}

}  // namespace

ShardedStateReader::ShardedStateReader(const std::string& dir, const std::string& base) {
  if (!is_plain_file_name(base)) throw CheckpointError("booster: invalid base name " + quote(base));
  auto m = std::make_shared<Impl>();
  m->dir = dir;
  m->base = base;
  m->index_path = join(dir, index_file_name(base));
  load_index(*m);
  impl_ = std::move(m);
}

bool ShardedStateReader::exists(const std::string& dir, const std::string& base) {
  struct stat st {};
  return is_plain_file_name(base) && ::stat(join(dir, index_file_name(base)).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

const std::string& ShardedStateReader::dir() const { return impl_->dir; }
const std::string& ShardedStateReader::base() const { return impl_->base; }
int ShardedStateReader::world_size() const { return impl_->world_size; }
const std::vector<std::string>& ShardedStateReader::files() const { return impl_->files; }
const std::vector<ShardedTensorInfo>& ShardedStateReader::tensors() const { return impl_->tensors; }
const std::vector<std::string>& ShardedStateReader::extra_files() const { return impl_->extra_files; }

const ShardedTensorInfo* ShardedStateReader::find(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

std::vector<CheckpointTensorInfo> ShardedStateReader::list() const {
  std::vector<CheckpointTensorInfo> out;
  for (const auto& t : impl_->tensors) out.push_back({t.name, t.dtype, t.shape, impl_->index_path});
  return out;
}

at::Tensor ShardedStateReader::read_range(const std::string& name, int64_t offset, int64_t length) const {
  const Impl& m = *impl_;
  auto it = m.by_name.find(name);
  if (it == m.by_name.end())
    throw CheckpointError("booster: " + m.index_path + ": no tensor named " + quote(name) + " in the checkpoint");
  const size_t ti = it->second;
  const ShardedTensorInfo& t = m.tensors[ti];
  const std::string label = "booster: " + m.index_path + ": tensor " + quote(name);
  if (offset < 0 || length < 0 || offset > t.numel || length > t.numel - offset)
    throw CheckpointError(label + ": cannot read elements [" + std::to_string(offset) + ", " + std::to_string(offset) +
                          " + " + std::to_string(length) + "): outside its " + std::to_string(t.numel) +
                          " elements (shape " + shape_text(t.shape) + ")");
  const int64_t end = offset + length;
  // Plan (and check coverage) before reading anything.
  struct Read {
    size_t piece;
    int64_t from, to;  // in the logical tensor
  };
  std::vector<Read> reads;
  int64_t pos = offset;
  for (size_t k = 0; k < t.pieces.size() && pos < end; ++k) {
    const ShardedPieceInfo& p = t.pieces[k];
    const int64_t p_end = p.offset + p.length;
    if (p_end <= pos) continue;
    if (p.offset >= end) break;
    if (p.offset > pos) break;  // gap at pos
    reads.push_back({k, pos, std::min(p_end, end)});
    pos = std::min(p_end, end);
  }
  if (pos < end) {
    int64_t gap_end = end;
    for (const auto& p : t.pieces)
      if (p.offset > pos) {
        gap_end = std::min(end, p.offset);
        break;
      }
    throw CheckpointError(label + ": elements " + range_text(pos, gap_end) + " (of the requested " +
                          range_text(offset, end) + ") are not in the checkpoint: no rank saved them (" +
                          std::to_string(t.covered) + " of " + std::to_string(t.numel) + " elements were saved)");
  }
  at::Tensor out = at::empty({length}, at::TensorOptions().dtype(t.dtype));
  for (const Read& r : reads) {
    const ShardedPieceInfo& p = t.pieces[r.piece];
    const SafetensorsHeader& h = m.headers[static_cast<size_t>(p.rank)];
    const SafetensorsEntry& e = h.tensors[m.piece_entries[ti][r.piece]];
    read_safetensors_range(p.file, h, e, r.from - p.offset, r.to - r.from, out.narrow(0, r.from - offset, r.to - r.from));
  }
  return out;
}

at::Tensor ShardedStateReader::read_full(const std::string& name) const {
  const ShardedTensorInfo* t = find(name);
  if (!t) return read_range(name, 0, 0);  // throws: unknown name
  return read_range(name, 0, t->numel).view(t->shape);
}

std::string ShardedStateReader::read_extra_file(const std::string& file_name) const {
  const auto& names = impl_->extra_files;
  if (std::find(names.begin(), names.end(), file_name) == names.end()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw CheckpointError("booster: " + impl_->index_path + ": " + quote(file_name) +
                          " is not one of the checkpoint's extra files (" + (list.empty() ? "none" : list) + ")");
  }
  return read_whole_file(join(impl_->dir, file_name));
}

size_t consolidate_sharded_state(const std::string& in_dir, const std::string& out_dir, const SaveOptions& options,
                                 const std::string& base) {
  const ShardedStateReader reader(in_dir, base);
  StateDict state;
  for (const auto& t : reader.tensors()) state.emplace_back(t.name, reader.read_full(t.name));
  std::map<std::string, std::string> extras;
  for (const auto& f : reader.extra_files()) extras[f] = reader.read_extra_file(f);
  save_state_dict(out_dir, state, options, base, extras);
  return state.size();
}

}  // namespace booster::checkpoint
