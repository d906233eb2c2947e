// torch_unpickler.cpp — the restricted pickle machine for torch.save archives (see
// torch_unpickler.h). Opcode meanings follow Python's pickle.py / pickletools.py.
#include "torch_unpickler.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

namespace booster::checkpoint::detail {
namespace {

constexpr int kMaxDepth = 1000;

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  enum Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kGlobal, kStorage, kTensor };
  Kind kind = kNone;
  int64_t i = 0;  // kBool, kInt
  double f = 0;
  std::string s;  // kString, kBytes, kGlobal ("module.name"), kStorage (record key)
  std::vector<ValuePtr> items;  // kTuple, kList; kDict: key, value, key, value, ...
  at::ScalarType dtype = at::kFloat;  // kGlobal of a storage type, kStorage
  int64_t numel = 0;                  // kStorage
  at::Tensor tensor;                  // kTensor
  int depth = 0;                      // nesting of containers below (and including) this one
};

ValuePtr make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

const char* kind_name(Value::Kind k) {
  static const char* names[] = {"None",  "bool",   "int",    "float",  "str",     "bytes",
                                "tuple", "list",   "dict",   "global", "storage", "tensor"};
  return names[k];
}

// Storage classes torch.save pickles (1.13 and 2.11 alike), by GLOBAL name.
const std::map<std::string, at::ScalarType>& storage_types() {
  static const std::map<std::string, at::ScalarType> m{
      {"torch.FloatStorage", at::kFloat},       {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},         {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},         {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},       {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},         {"torch.BoolStorage", at::kBool},
      {"torch.ComplexFloatStorage", at::kComplexFloat}, {"torch.ComplexDoubleStorage", at::kComplexDouble}};
  return m;
}

bool allowed_callable(const std::string& g) {
  return g == "collections.OrderedDict" || g == "torch._utils._rebuild_tensor_v2" ||
         g == "torch._utils._rebuild_parameter" || g == "torch.jit._pickle.restore_type_tag";
}

class Machine {
 public:
  Machine(const std::string& path, caffe2::serialize::PyTorchStreamReader& reader, const char* data, size_t size)
      : path_(path), reader_(reader), p_(reinterpret_cast<const uint8_t*>(data)), n_(size) {}
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;
  // A container can hold itself through the memo (a list appended to itself): the references
  // between containers are dropped here so that no cycle outlives the machine.
  ~Machine() {
    for (const auto& c : containers_) c->items.clear();
  }

  ValuePtr run() {
    while (true) {
      const size_t at_op = pos_;
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;                          // PROTO
        case 0x95: bytes(8); break;                        // FRAME (size: the data follows inline)
        case '.':                                          // STOP
          if (stack_.size() != 1) fail("STOP with " + std::to_string(stack_.size()) + " values on the stack", at_op);
          return stack_.back();
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case 'N': push(make(Value::kNone)); break;
        case 0x88: case 0x89: { auto v = make(Value::kBool); v->i = op == 0x88; push(v); break; }
        case 'J': push_int(static_cast<int32_t>(le(4))); break;
        case 'K': push_int(static_cast<int64_t>(le(1))); break;
        case 'M': push_int(static_cast<int64_t>(le(2))); break;
        case 0x8a: {                                       // LONG1: little-endian two's complement
          const size_t len = le(1);
          if (len > 8) fail("an integer of " + std::to_string(len) + " bytes (more than 64 bits)", at_op);
          const uint8_t* b = bytes(len);
          uint64_t u = 0;
          for (size_t k = 0; k < len; ++k) u |= static_cast<uint64_t>(b[k]) << (8 * k);
          if (len > 0 && len < 8 && (b[len - 1] & 0x80)) u |= ~uint64_t{0} << (8 * len);
          push_int(static_cast<int64_t>(u));
          break;
        }
        case 'G': {                                        // BINFLOAT: big-endian double
          const uint8_t* b = bytes(8);
          uint64_t u = 0;
          for (int k = 0; k < 8; ++k) u = (u << 8) | b[k];
          auto v = make(Value::kFloat);
          std::memcpy(&v->f, &u, 8);
          push(v);
          break;
        }
        case 'X': push_text(Value::kString, le(4), at_op); break;
        case 0x8c: push_text(Value::kString, le(1), at_op); break;
        case 0x8d: push_text(Value::kString, le(8), at_op); break;
        case 'T': push_text(Value::kBytes, le(4), at_op); break;
        case 'U': push_text(Value::kBytes, le(1), at_op); break;
        case 'B': push_text(Value::kBytes, le(4), at_op); break;
        case 'C': push_text(Value::kBytes, le(1), at_op); break;
        case ')': push(container(Value::kTuple, {})); break;
        case ']': push(container(Value::kList, {})); break;
        case '}': push(container(Value::kDict, {})); break;
        case 't': push(container(Value::kTuple, pop_mark(at_op))); break;
        case 'l': push(container(Value::kList, pop_mark(at_op))); break;
        case 'd': {
          auto items = pop_mark(at_op);
          if (items.size() % 2) fail("DICT with an odd number of items", at_op);
          push(container(Value::kDict, std::move(items)));
          break;
        }
        case 0x85: case 0x86: case 0x87: {                 // TUPLE1..3
          const size_t k = op - 0x84u;
          std::vector<ValuePtr> items(k);
          for (size_t j = k; j-- > 0;) items[j] = pop(at_op);
          push(container(Value::kTuple, std::move(items)));
          break;
        }
        case 'a': { auto v = pop(at_op); add(top(at_op), Value::kList, {v}, at_op); break; }
        case 'e': { auto items = pop_mark(at_op); add(top(at_op), Value::kList, std::move(items), at_op); break; }
        case 's': {
          auto v = pop(at_op);
          auto k = pop(at_op);
          add(top(at_op), Value::kDict, {k, v}, at_op);
          break;
        }
        case 'u': {
          auto items = pop_mark(at_op);
          if (items.size() % 2) fail("SETITEMS with an odd number of items", at_op);
          add(top(at_op), Value::kDict, std::move(items), at_op);
          break;
        }
        case 'q': memo_[le(1)] = top(at_op); break;        // BINPUT
        case 'r': memo_[le(4)] = top(at_op); break;        // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(at_op); break;  // MEMOIZE
        case 'h': push(memo(le(1), at_op)); break;         // BINGET
        case 'j': push(memo(le(4), at_op)); break;         // LONG_BINGET
        case 'c': {                                        // GLOBAL "module\nname\n"
          std::string module = line(at_op), name = line(at_op);
          push(global(module + "." + name, at_op));
          break;
        }
        case 0x93: {                                       // STACK_GLOBAL
          auto name = pop(at_op), module = pop(at_op);
          if (module->kind != Value::kString || name->kind != Value::kString) fail("STACK_GLOBAL of non-strings", at_op);
          push(global(module->s + "." + name->s, at_op));
          break;
        }
        case 'Q': push(persistent(pop(at_op), at_op)); break;  // BINPERSID
        case 'R': {                                        // REDUCE
          auto args = pop(at_op);
          auto callable = pop(at_op);
          push(reduce(callable, args, at_op));
          break;
        }
        case 0x81: {                                       // NEWOBJ cls(*args)
          auto args = pop(at_op);
          auto cls = pop(at_op);
          push(reduce(cls, args, at_op));
          break;
        }
        case 'b': {                                        // BUILD: the state of an OrderedDict (_metadata) is ignored
          auto state = pop(at_op);
          auto obj = top(at_op);
          if (obj->kind != Value::kDict && obj->kind != Value::kTensor)
            fail("BUILD on a " + std::string(kind_name(obj->kind)), at_op);
          break;
        }
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          fail(std::string("opcode ") + hex + " is not one a state dict needs", at_op);
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what, size_t at) const {
    throw CheckpointError("'" + path_ + "': data.pkl at byte " + std::to_string(at) + ": " + what);
  }
  uint8_t byte() {
    if (pos_ >= n_) fail("the pickle ends without STOP (truncated)", pos_);
    return p_[pos_++];
  }
  const uint8_t* bytes(size_t k) {
    if (k > n_ - pos_) fail("the pickle ends inside an opcode's argument (truncated)", pos_);
    const uint8_t* b = p_ + pos_;
    pos_ += k;
    return b;
  }
  uint64_t le(size_t k) {
    const uint8_t* b = bytes(k);
    uint64_t u = 0;
    for (size_t j = 0; j < k; ++j) u |= static_cast<uint64_t>(b[j]) << (8 * j);
    return u;
  }
  std::string line(size_t at) {
    const size_t start = pos_;
    while (pos_ < n_ && p_[pos_] != '\n') ++pos_;
    if (pos_ >= n_) fail("GLOBAL without its newline (truncated)", at);
    return std::string(reinterpret_cast<const char*>(p_ + start), pos_++ - start);
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  void push_int(int64_t i) {
    auto v = make(Value::kInt);
    v->i = i;
    push(v);
  }
  void push_text(Value::Kind kind, uint64_t len, size_t at) {
    if (len > n_ - pos_) fail("a string of " + std::to_string(len) + " bytes past the end (truncated)", at);
    auto v = make(kind);
    const uint8_t* b = bytes(static_cast<size_t>(len));
    v->s.assign(reinterpret_cast<const char*>(b), static_cast<size_t>(len));
    push(v);
  }
  ValuePtr pop(size_t at) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("the stack is empty", at);
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  ValuePtr top(size_t at) {
    if (stack_.empty()) fail("the stack is empty", at);
    return stack_.back();
  }
  std::vector<ValuePtr> pop_mark(size_t at) {
    if (marks_.empty()) fail("no MARK to pop to", at);
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(m)),
                                std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }
  ValuePtr memo(uint64_t key, size_t at) {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail("memo entry " + std::to_string(key) + " was never stored", at);
    return it->second;
  }
  ValuePtr container(Value::Kind kind, std::vector<ValuePtr> items) {
    auto v = make(kind);
    containers_.push_back(v);
    v->items = std::move(items);
    v->depth = 1;
    for (const auto& i : v->items) v->depth = std::max(v->depth, i->depth + 1);
    if (v->depth > kMaxDepth) fail("containers nested deeper than " + std::to_string(kMaxDepth), pos_);
    return v;
  }
  void add(const ValuePtr& target, Value::Kind kind, std::vector<ValuePtr> items, size_t at) {
    if (target->kind != kind)
      fail(std::string(kind == Value::kList ? "APPEND" : "SETITEM") + " on a " + kind_name(target->kind), at);
    for (auto& i : items) {
      target->depth = std::max(target->depth, i->depth + 1);
      target->items.push_back(std::move(i));
    }
    if (target->depth > kMaxDepth) fail("containers nested deeper than " + std::to_string(kMaxDepth), at);
  }
  ValuePtr global(const std::string& name, size_t at) {
    auto v = make(Value::kGlobal);
    v->s = name;
    auto st = storage_types().find(name);
    if (st != storage_types().end()) {
      v->dtype = st->second;
    } else if (!allowed_callable(name)) {
      fail("refuses global '" + name + "': only the globals of a tensor state dict are allowed (OrderedDict, "
           "torch._utils._rebuild_tensor_v2, torch storage types); the file was not written by torch.save of a "
           "state dict, or was tampered with",
           at);
    }
    return v;
  }
  ValuePtr persistent(const ValuePtr& pid, size_t at) {
    if (pid->kind != Value::kTuple || pid->items.size() != 5 || pid->items[0]->kind != Value::kString ||
        pid->items[0]->s != "storage" || pid->items[1]->kind != Value::kGlobal ||
        !storage_types().count(pid->items[1]->s) || pid->items[2]->kind != Value::kString ||
        pid->items[4]->kind != Value::kInt || pid->items[4]->i < 0)
      fail("a persistent id that is not ('storage', <torch storage type>, key, location, numel)", at);
    auto v = make(Value::kStorage);
    v->s = pid->items[2]->s;
    v->dtype = pid->items[1]->dtype;
    v->numel = pid->items[4]->i;
    return v;
  }
  at::Tensor storage(const ValuePtr& s, size_t at) {
    auto it = storages_.find(s->s);
    if (it != storages_.end()) return it->second;
    if (s->s.empty() || s->s.find('/') != std::string::npos || s->s.find("..") != std::string::npos)
      fail("storage key '" + s->s + "' is not a record name", at);
    const std::string record = "data/" + s->s;
    if (!reader_.hasRecord(record)) fail("storage record '" + record + "' is missing from the archive", at);
    auto [data, size] = reader_.getRecord(record);
    const int64_t item = static_cast<int64_t>(c10::elementSize(s->dtype));
    if (static_cast<int64_t>(size) != s->numel * item)
      fail("storage record '" + record + "' has " + std::to_string(size) + " bytes, the pickle says " +
               std::to_string(s->numel) + " elements of " + std::to_string(item) + " bytes",
           at);
    at::Tensor flat = at::empty({s->numel}, at::TensorOptions().dtype(s->dtype));
    if (size > 0) std::memcpy(flat.data_ptr(), data.get(), size);
    storages_[s->s] = flat;
    return flat;
  }
  std::vector<int64_t> ints(const ValuePtr& t, const char* what, size_t at) {
    if (t->kind != Value::kTuple) fail(std::string(what) + " is a " + kind_name(t->kind) + ", expected a tuple", at);
    std::vector<int64_t> out;
    for (const auto& i : t->items) {
      if (i->kind != Value::kInt) fail(std::string(what) + " holds a " + kind_name(i->kind), at);
      out.push_back(i->i);
    }
    return out;
  }
  ValuePtr reduce(const ValuePtr& callable, const ValuePtr& args, size_t at) {
    if (callable->kind != Value::kGlobal || args->kind != Value::kTuple)
      fail("REDUCE of a " + std::string(kind_name(callable->kind)) + " (only allowed globals can be called)", at);
    const std::string& g = callable->s;
    if (g == "collections.OrderedDict") {
      if (!args->items.empty()) fail("OrderedDict called with arguments", at);
      return container(Value::kDict, {});
    }
    if (g == "torch.jit._pickle.restore_type_tag") {  // LibTorch's pickler: (value, "Dict[str, Tensor]")
      if (args->items.size() != 2 || args->items[1]->kind != Value::kString)
        fail("restore_type_tag without (value, type name)", at);
      return args->items[0];
    }
    if (g == "torch._utils._rebuild_parameter") {
      if (args->items.size() < 2 || args->items[0]->kind != Value::kTensor)
        fail("_rebuild_parameter without a tensor", at);
      return args->items[0];
    }
    if (g == "torch._utils._rebuild_tensor_v2") {
      const auto& a = args->items;
      if (a.size() < 4 || a[0]->kind != Value::kStorage || a[1]->kind != Value::kInt)
        fail("_rebuild_tensor_v2 needs (storage, offset, size, stride, ...)", at);
      at::Tensor flat = storage(a[0], at);
      const int64_t offset = a[1]->i;
      std::vector<int64_t> size = ints(a[2], "the size", at), stride = ints(a[3], "the stride", at);
      if (size.size() != stride.size()) fail("size and stride of different lengths", at);
      int64_t last = offset, numel = 1;
      for (size_t d = 0; d < size.size(); ++d) {
        if (size[d] < 0 || stride[d] < 0) fail("a negative size or stride", at);
        numel *= size[d];
        if (size[d] > 0) last += (size[d] - 1) * stride[d];
      }
      if (offset < 0 || (numel > 0 && last >= flat.numel()))
        fail("a tensor view (offset " + std::to_string(offset) + ", last element " + std::to_string(last) +
                 ") outside its storage of " + std::to_string(flat.numel()) + " elements",
             at);
      auto v = make(Value::kTensor);
      v->tensor = flat.as_strided(size, stride, offset);
      return v;
    }
    fail("REDUCE of '" + g + "', which is not callable here", at);
  }

  std::string path_;
  caffe2::serialize::PyTorchStreamReader& reader_;
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;
  std::vector<ValuePtr> containers_;  // every tuple, list and dict made (see ~Machine)
};

void flatten(const std::string& path, const Value& dict, const std::string& prefix, StateDict& out,
             std::set<std::string>& names, int level = 0) {
  if (level > kMaxDepth)  // a dict holding itself (through the memo) would never end
    throw CheckpointError("'" + path + "': dicts nested deeper than " + std::to_string(kMaxDepth));
  for (size_t k = 0; k + 1 < dict.items.size(); k += 2) {
    const Value& key = *dict.items[k];
    const Value& value = *dict.items[k + 1];
    std::string name;
    if (key.kind == Value::kString) name = key.s;
    else if (key.kind == Value::kInt) name = std::to_string(key.i);
    else throw CheckpointError("'" + path + "': a key is a " + kind_name(key.kind) + ", expected str");
    name = prefix + name;
    if (value.kind == Value::kTensor) {
      if (!names.insert(name).second) throw CheckpointError("'" + path + "': two tensors are named '" + name + "'");
      out.emplace_back(name, value.tensor);
    } else if (value.kind == Value::kDict) {
      flatten(path, value, name + ".", out, names, level + 1);
    }
  }
}

}  // namespace

StateDict unpickle_state_dict(const std::string& path) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    std::ifstream f(path, std::ios::binary);
    char head[2] = {0, 0};
    f.read(head, 2);
    if (f && static_cast<uint8_t>(head[0]) == 0x80)
      throw CheckpointError("'" + path + "' is in torch.save's legacy format (_use_new_zipfile_serialization=False, "
                            "before torch 1.6), which is not read; re-save it with torch.save(torch.load(path), path)");
    const std::string what = e.what();
    throw CheckpointError("'" + path + "' is not a torch.save zip archive: " + what.substr(0, what.find('\n')));
  }
  return unpickle_state_dict(*reader, path);
}

StateDict unpickle_state_dict(caffe2::serialize::PyTorchStreamReader& archive, const std::string& path) {
  caffe2::serialize::PyTorchStreamReader* reader = &archive;
  if (reader->hasRecord("byteorder")) {
    auto [data, size] = reader->getRecord("byteorder");
    if (std::string(static_cast<const char*>(data.get()), size) != "little")
      throw CheckpointError("'" + path + "' was written on a big-endian machine; only little-endian archives are read");
  }
  if (!reader->hasRecord("data.pkl")) throw CheckpointError("'" + path + "' has no data.pkl record");
  auto [pickle, size] = reader->getRecord("data.pkl");
  Machine machine(path, *reader, static_cast<const char*>(pickle.get()), size);
  ValuePtr root = machine.run();
  if (root->kind != Value::kDict)
    throw CheckpointError("'" + path + "' holds a " + std::string(kind_name(root->kind)) +
                          ", expected a dict of str -> Tensor (a state dict)");
  StateDict out;
  std::set<std::string> names;
  flatten(path, *root, "", out, names);
  return out;
}

}  // namespace booster::checkpoint::detail
