// checkpoint_io_detail.h — helpers shared by the default CheckpointIO's model / LR scheduler part
// (checkpoint_io.cpp) and its optimizer part (optimizer_checkpoint.cpp); private to libbooster.
// The dtype rule on load is load_model's (checkpoint_io.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "booster/checkpoint/safetensors.h"

namespace booster::dist {
class ProcessGroup;
}

namespace booster::checkpoint::io_detail {

// The file's text; CheckpointError "booster: cannot read PATH (missing or unreadable)".
std::string read_text(const std::string& path);
// "[2, 3]"
std::string shape_str(at::IntArrayRef s);
std::string dtype_str(at::ScalarType t);
// Runs `write` on rank 0 (or the only process when world is null), then tells every rank whether
// it worked: every rank throws CheckpointError with rank 0's message when it failed.
void write_on_rank0(const std::shared_ptr<dist::ProcessGroup>& world, const std::function<void()>& write);

// Whether a checkpoint tensor of dtype `from` loads into a tensor of dtype `to`: torch.can_cast.
inline bool loadable_as(at::ScalarType from, at::ScalarType to) { return from == to || c10::canCast(from, to); }
// A floating -> integer pair, which load_model converts only for whole numbers in range.
inline bool float_into_integer(at::ScalarType from, at::ScalarType to) {
  return at::isFloatingType(from) && at::isIntegralType(to, /*includeBool=*/false);
}
// "" when every value of the floating tensor `t` is a whole number that the integer dtype `to` holds;
// else the first value that is not ("2.75 is not a whole number").
std::string whole_number_problem(const at::Tensor& t, at::ScalarType to);
// "dtype Float in the checkpoint, Long in the model (refused: ...)" for a pair that does not load;
// `what` names the receiving side ("the model", "the optimizer"); `detail` the offending value.
std::string refused_dtype(at::ScalarType from, at::ScalarType to, const std::string& what,
                          const std::string& detail = "");

// Counts tensors converted per (checkpoint dtype, receiving dtype) pair; report() logs one line.
class ConversionLog {
 public:
  void add(at::ScalarType from, at::ScalarType to) {
    if (from != to) ++counts_[{from, to}];
  }
  // Rank 0, when anything was converted: "booster: <call> <path>: converted 8 tensors BFloat16 ->
  // Float (the model's dtype)".
  void report(const std::string& call, const std::string& path, const std::string& noun,
              const std::string& whose) const;

 private:
  std::map<std::pair<at::ScalarType, at::ScalarType>, int64_t> counts_;
};

}  // namespace booster::checkpoint::io_detail
