// torch_pickle.cpp — `.bin` files: torch.save's pickle zip (see booster/checkpoint/torch_pickle.h).
#include "booster/checkpoint/torch_pickle.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "booster/checkpoint/async_save.h"  // host_copy_for_write
#include "booster/io/atomic_write.h"
#include "checkpoint_detail.h"
#include "torch_unpickler.h"

namespace booster::checkpoint {
namespace {

// A tensor the pickler writes as exactly its own bytes: CPU, contiguous, and owning its whole
// storage from offset 0 (a view would otherwise drag its entire storage into the file).
at::Tensor standalone(const at::Tensor& t) {
  at::Tensor c = host_copy_for_write(t.detach());
  if (c.has_storage() &&
      (c.storage_offset() != 0 || c.storage().nbytes() != static_cast<size_t>(c.numel()) * c.element_size()))
    c = c.clone();
  return c;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

void write_bin(const std::string& path, const StateDict& state) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : state) {
    if (!tensor.defined()) throw CheckpointError(path + ": tensor '" + name + "' is undefined");
    if (dict.contains(name)) throw CheckpointError(path + ": duplicate tensor name '" + name + "'");
    dict.insert(name, standalone(tensor));
  }
  detail::as_checkpoint_error([&] {
    io::OutputFile file(path);
    std::string write_error;
    try {
      // What torch::pickle_save does, with the zip written straight to the file, and without the
      // TorchScript type tag on the dict (torch.jit._pickle.restore_type_tag), which torch.load's
      // weights_only unpickler (its default since 2.6) refuses: the dict pickles as a plain dict.
      std::vector<char> pickle_data;
      torch::jit::Pickler pickler(
          [&](const char* buf, size_t size) { pickle_data.insert(pickle_data.end(), buf, buf + size); },
          /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
          /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
      pickler.protocol();
      pickler.pushIValue(c10::IValue(dict));
      pickler.stop();
      // After a write error the rest is discarded but reported as written: a short count would make
      // the writer throw, and it throws again from its destructor (std::terminate).
      caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t len) -> size_t {
        if (write_error.empty()) {
          try {
            file.write(bytes, len);
          } catch (const io::IoError& e) {
            write_error = e.what();
          }
        }
        return len;
      });
      torch::jit::writeArchiveAndTensors("data", pickle_data.data(), pickle_data.size(), pickler.tensorData(), writer);
      writer.writeEndOfFile();
    } catch (const io::IoError&) {
      throw;
    } catch (const std::exception& e) {
      if (!write_error.empty()) throw CheckpointError(write_error);
      throw CheckpointError("cannot write '" + path + "': " + first_line(e.what()));
    }
    if (!write_error.empty()) throw CheckpointError(write_error);
    file.sync_and_close();
  });
}

StateDict read_bin(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw CheckpointError("cannot open '" + path + "': " + std::string(std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw CheckpointError("'" + path + "' is not a regular file");
  StateDict out = detail::unpickle_state_dict(path);
  for (auto& [name, tensor] : out) tensor = tensor.detach();  // no autograd flags from the file
  return out;
}

}  // namespace booster::checkpoint
