// pickle_fuzz.cpp — libFuzzer target for the restricted unpickler that reads `.bin` files
// (booster/src/checkpoint/torch_unpickler.cpp). The input is the data.pkl of an in-memory torch.save
// archive that also holds storage records "0" (16 float32) and "1" (4 int64), so the fuzzer reaches
// tensor rebuilding. Any input must either give a state dict or throw CheckpointError; another
// exception, a crash, a sanitizer report, a leak or a huge allocation is a bug. Built by
// tests/fuzz/run_fuzz.sh pickle (links LibTorch, uninstrumented; the unpickler is instrumented).
#include <sys/types.h>  // off_t, which in_memory_adapter.h uses without including

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/torch_unpickler.h"

using booster::checkpoint::CheckpointError;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<char> floats(16 * 4, 1), longs(4 * 8, 0);
  std::vector<char> zip;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* buf, size_t n) -> size_t {
      zip.insert(zip.end(), static_cast<const char*>(buf), static_cast<const char*>(buf) + n);
      return n;
    });
    writer.writeRecord("data.pkl", data, size);
    writer.writeRecord("data/0", floats.data(), floats.size());
    writer.writeRecord("data/1", longs.data(), longs.size());
    writer.writeEndOfFile();
  }
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(zip.data(), static_cast<off_t>(zip.size())));
  try {
    auto sd = booster::checkpoint::detail::unpickle_state_dict(reader, "fuzz.bin");
    for (const auto& [name, t] : sd) {
      if (!t.defined()) std::abort();
      (void)t.sum();  // every accepted view lies inside its storage (ASan checks the reads)
    }
  } catch (const CheckpointError&) {
  }
  return 0;
}
