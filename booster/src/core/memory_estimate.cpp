// memory_estimate.cpp — the shared estimate formulas (see booster/core/memory_estimate.h).
#include "booster/core/memory_estimate.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace booster {

int64_t MemoryEstimate::total() const {
  return states.model_states() + states.communication_buffers + transient + activations;
}

void place_on_device(const EstimateRequest& request, MemoryEstimate& e) {
  if (request.device.empty() || request.device == "cpu") return;
  e.states.device = request.device;
  e.states.parameters_on_device = e.states.parameters;
  e.states.gradients_on_device = e.states.gradients;
  e.states.master_weights_on_device = e.states.master_weights;
  e.states.optimizer_states_on_device = e.states.optimizer_states;
  e.states.communication_buffers_on_device = e.states.communication_buffers;
  e.states.located = true;
  e.device_bytes = e.total();
}

int64_t optimizer_step_temporaries(double state_bytes_per_parameter, int64_t elements) {
  if (state_bytes_per_parameter >= 8) return 2 * 4 * elements;
  if (state_bytes_per_parameter > 0) return 4 * elements;
  return 0;
}

int64_t precision_bytes(const std::string& precision) {
  if (precision == "fp32") return 4;
  if (precision == "bf16" || precision == "fp16") return 2;
  throw std::invalid_argument("precision_bytes: unknown precision '" + precision + "' (fp32, bf16 or fp16)");
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t state_bytes(const EstimateRequest& r, int64_t elements) {
  return static_cast<int64_t>(r.optimizer_state_bytes_per_parameter * static_cast<double>(elements) + 0.5);
}
}  // namespace

MemoryEstimate replicated_estimate(const EstimateRequest& request, int64_t parameters, int64_t param_bytes,
                                   bool keep_fp32_master, int64_t bucket_bytes, int64_t largest_parameter) {
  MemoryEstimate e;
  e.states.parameters = parameters * param_bytes + request.buffer_bytes;
  e.states.gradients = parameters * param_bytes;
  e.states.master_weights = keep_fp32_master && param_bytes < 4 ? parameters * 4 : 0;
  e.states.optimizer_states = state_bytes(request, parameters);
  e.states.communication_buffers = bucket_bytes;
  e.transient = optimizer_step_temporaries(request.optimizer_state_bytes_per_parameter, largest_parameter);
  e.activations = request.activation_bytes;
  e.communication_volume = 2;
  place_on_device(request, e);
  return e;
}

MemoryEstimate zero_estimate(const EstimateRequest& request, int stage, int64_t parameters, int dp,
                             int64_t param_bytes, int64_t bucket_elements, int64_t largest_parameter) {
  MemoryEstimate e;
  const int64_t shard = ceil_div(parameters, std::max(dp, 1));
  e.states.parameters = parameters * param_bytes + request.buffer_bytes;
  e.states.gradients = (stage == 1 ? parameters : shard) * param_bytes;
  e.states.master_weights = param_bytes < 4 ? shard * 4 : 0;
  e.states.optimizer_states = state_bytes(request, shard);
  const int64_t bucket = std::min(std::max(bucket_elements, largest_parameter), parameters) * param_bytes;
  const int64_t in_flight = std::min(2 * bucket, parameters * param_bytes);
  // The in-place reduce-scatter receives each peer's part of this rank's range into a buffer of its
  // own: up to dp - 1 copies of the rank's range within the buckets in flight.
  const int64_t received = static_cast<int64_t>(std::max(dp, 1) - 1) * std::min(in_flight, shard * param_bytes);
  const int64_t backward = (stage == 2 ? in_flight : 0) + largest_parameter * param_bytes + received;
  const int64_t step = shard * 4 + optimizer_step_temporaries(request.optimizer_state_bytes_per_parameter, shard);
  e.transient = std::max(backward, step);
  e.activations = request.activation_bytes;
  e.communication_volume = 2;
  place_on_device(request, e);
  return e;
}

MemoryEstimate fully_sharded_estimate(const EstimateRequest& request, int64_t parameters, int64_t largest_unit,
                                      const FullyShardedSchedule& schedule) {
  if (schedule.shard_group < 1)
    throw std::invalid_argument("fully_sharded_estimate: shard_group must be >= 1, got " +
                                std::to_string(schedule.shard_group));
  const int64_t S = schedule.shard_group, U = largest_unit, gb = schedule.gathered_bytes;
  const int64_t shard = ceil_div(parameters, S);
  MemoryEstimate e;
  e.states.parameters = 4 * shard + request.buffer_bytes;
  e.states.gradients = 4 * shard;
  e.states.optimizer_states = state_bytes(request, shard);
  // A shard group of one rank in fp32 computes on the shard itself (FlatParameter aliases it).
  const bool aliased = S == 1 && gb == 4;
  const int64_t gathered = aliased ? 0 : (schedule.keep_gathered ? parameters : std::min(2 * U, parameters)) * gb;
  const int64_t gradients = schedule.accumulate_gradients ? parameters * gb + 4 * U : 2 * 4 * U;
  const int64_t backward = gathered + gradients + (schedule.replicated ? 4 * ceil_div(U, S) : 0);
  const int64_t step = optimizer_step_temporaries(request.optimizer_state_bytes_per_parameter, ceil_div(U, S));
  e.transient = std::max(backward, step);
  e.activations = request.activation_bytes;
  e.communication_volume = schedule.keep_gathered ? 2 : 3;
  place_on_device(request, e);
  return e;
}

}  // namespace booster
