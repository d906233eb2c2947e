// sharded_index.cpp — the parser of a sharded checkpoint's index (see sharded_index.h).
#include "sharded_index.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "checkpoint_detail.h"

namespace booster::checkpoint::detail {

std::string range_text(int64_t begin, int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

namespace {

using json = nlohmann::json;

// Throws CheckpointError("<index>: <what>") unless cond.
void need(bool cond, const std::string& index_path, const std::string& what) {
  if (!cond) fail(index_path, what);
}

int64_t get_int(const json& j, const char* key, const std::string& where, const std::string& index_path) {
  auto it = j.find(key);
  need(it != j.end() && it->is_number_integer(), index_path, where + ": \"" + key + "\" must be an integer");
  return it->get<int64_t>();
}

std::string get_string(const json& j, const char* key, const std::string& where, const std::string& index_path) {
  auto it = j.find(key);
  need(it != j.end() && it->is_string(), index_path, where + ": \"" + key + "\" must be a string");
  return it->get<std::string>();
}

ShardedIndexTensor parse_tensor(const json& jt, const std::string& where,
                                const std::unordered_map<std::string, size_t>& file_index, const std::string& ip) {
  need(jt.is_object(), ip, where + " is not an object");
  ShardedIndexTensor t;
  t.name = get_string(jt, "name", where, ip);
  const std::string tw = "tensor " + quote(t.name);
  t.dtype = get_string(jt, "dtype", tw, ip);
  auto shape = jt.find("shape");
  need(shape != jt.end() && shape->is_array(), ip, tw + ": \"shape\" must be an array of integers");
  for (const json& d : *shape) {
    need(d.is_number_integer(), ip, tw + ": \"shape\" must be an array of integers");
    t.shape.push_back(d.get<int64_t>());
  }
  t.numel = checked_numel(t.shape);
  need(t.numel >= 0, ip, tw + ": invalid shape " + shape_text(t.shape));
  auto pieces = jt.find("pieces");
  need(pieces != jt.end() && pieces->is_array(), ip, tw + ": \"pieces\" must be an array");
  for (size_t k = 0; k < pieces->size(); ++k) {
    const json& jp = (*pieces)[k];
    const std::string pw = tw + " piece " + std::to_string(k);
    need(jp.is_object(), ip, pw + " is not an object");
    const std::string file = get_string(jp, "file", pw, ip);
    auto f = file_index.find(file);
    need(f != file_index.end(), ip, pw + ": file " + quote(file) + " is not one of \"files\"");
    ShardedIndexPiece p;
    p.file = f->second;
    p.entry = get_string(jp, "entry", pw, ip);
    p.offset = get_int(jp, "offset", pw, ip);
    p.length = get_int(jp, "length", pw, ip);
    need(p.offset >= 0 && p.length >= 1 && p.offset <= t.numel && p.length <= t.numel - p.offset, ip,
         pw + ": range [" + std::to_string(p.offset) + ", " + std::to_string(p.offset) + " + " +
             std::to_string(p.length) + ") is empty or outside the tensor's " + std::to_string(t.numel) + " elements");
    t.pieces.push_back(std::move(p));
  }
  std::stable_sort(t.pieces.begin(), t.pieces.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  for (size_t k = 0; k < t.pieces.size(); ++k) {
    const ShardedIndexPiece& p = t.pieces[k];
    if (k > 0) {
      const ShardedIndexPiece& q = t.pieces[k - 1];
      need(p.offset >= q.offset + q.length, ip,
           tw + ": pieces " + range_text(q.offset, q.offset + q.length) + " (rank " + std::to_string(q.file) + ") and " +
               range_text(p.offset, p.offset + p.length) + " (rank " + std::to_string(p.file) + ") overlap");
    }
    t.covered += p.length;
  }
  return t;
}

}  // namespace

ShardedIndex parse_sharded_index(const std::string& text, const std::string& ip) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    fail(ip, std::string("is not valid JSON: ") + e.what());
  }
  need(doc.is_object(), ip, "is not a JSON object");
  ShardedIndex index;
  const std::string format = get_string(doc, "format", "the index", ip);
  need(format == kShardedFormat, ip, "unknown format " + quote(format) + " (expected " + kShardedFormat + ")");
  const int64_t world = get_int(doc, "world_size", "the index", ip);
  need(world >= 1 && world <= (int64_t{1} << 24), ip, "invalid world_size " + std::to_string(world));
  index.world_size = static_cast<int>(world);
  index.save_id = get_string(doc, "save_id", "the index", ip);

  auto files = doc.find("files");
  need(files != doc.end() && files->is_array() && files->size() == static_cast<size_t>(world), ip,
       "\"files\" must be an array of world_size (" + std::to_string(world) + ") file names");
  std::unordered_map<std::string, size_t> file_index;
  for (size_t r = 0; r < files->size(); ++r) {
    const json& f = (*files)[r];
    need(f.is_string() && is_plain_file_name(f.get<std::string>()), ip,
         "files[" + std::to_string(r) + "] is not a plain file name inside the checkpoint directory");
    need(file_index.emplace(f.get<std::string>(), r).second, ip, "file " + quote(f.get<std::string>()) + " is listed twice");
    index.files.push_back(f.get<std::string>());
  }
  auto extras = doc.find("extra_files");
  need(extras != doc.end() && extras->is_array(), ip, "\"extra_files\" must be an array of file names");
  for (const json& f : *extras) {
    need(f.is_string() && is_plain_file_name(f.get<std::string>()), ip,
         "extra_files holds " + f.dump(-1, ' ', false, json::error_handler_t::replace) +
             ", which is not a plain file name inside the checkpoint directory");
    index.extra_files.push_back(f.get<std::string>());
  }

  auto tensors = doc.find("tensors");
  need(tensors != doc.end() && tensors->is_array(), ip, "\"tensors\" must be an array");
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < tensors->size(); ++i) {
    ShardedIndexTensor t = parse_tensor((*tensors)[i], "tensors[" + std::to_string(i) + "]", file_index, ip);
    need(seen.emplace(t.name, i).second, ip, "tensor " + quote(t.name) + " is listed twice");
    index.tensors.push_back(std::move(t));
  }
  return index;
}

}  // namespace booster::checkpoint::detail
