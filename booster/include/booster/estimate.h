// estimate.h — "will it fit, and with which plugin?": per-rank memory of every installed plugin's
// configurations for the user's own model (DeepSpeed's estimate_zero2/3_model_states_mem_needs,
// for every strategy, plus the activations of one real micro-batch). Used by Booster::estimate (a
// trainer run with [booster] estimate = true: it gets an EstimateReport and decides what follows),
// by the `booster estimate` command (a parameter count on the command line) and by plugin = "auto".
//
// The printed total of a configuration is: runtime (this process's resident memory that is not the
// model: LibTorch, Gloo, data) + model states + communication buffers + the iteration's transient
// peak + activations (core/memory_estimate.h). "fits" compares it with the budget per rank.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "booster/core/memory_estimate.h"
#include "booster/export.h"

namespace booster {

namespace dist {
class ProcessGroup;
}

// Counts `model`: Ψ (every parameter), the largest parameter tensor, the nn::Units (largest by
// elements; none: largest_unit = Ψ), the layers and each layer's parameter elements when it is a
// nn::PipelineModule (pipeline_layers() is called), the buffer bytes; and the optimizer's state size by its type (optimizer may be null:
// 0): Adam / AdamW 8 bytes per element (12 with amsgrad), SGD 4 with momentum else 0, RMSprop 4
// (+4 momentum, +4 centered), Adagrad 4, LBFGS 0 per element, Booster's CPUAdam / HybridAdam 8;
// another type: 8 (Adam's), marked in the returned note. world_size and precision are left at their
// defaults.
BOOSTER_API EstimateRequest describe_model(torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                                           std::string* note = nullptr);

// What one real iteration on this process measures (counting CPU allocator, cpu_byte_counter.h).
struct MeasuredIteration {
  int64_t activation_bytes = 0;   // peak of `loss_of_micro_batch()` + backward above the start, minus the
                                  // parameter gradients it created (bytes)
  int64_t gradient_bytes = 0;     // the parameter gradients backward created (bytes)
  double optimizer_state_bytes_per_parameter = -1;  // bytes the optimizer's first step kept, per
                                                     // parameter element (-1: no optimizer given)
};
// Runs loss_of_micro_batch() (forward of one micro-batch and the criterion, returning a scalar),
// its backward, and optimizer->step() when an optimizer is given. Changes the model and optimizer
// (one training step): call it on a model that is thrown away afterwards, as the estimate mode does.
// Throws std::invalid_argument when the loss is not a scalar that requires grad.
BOOSTER_API MeasuredIteration measure_iteration(torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                                                const std::function<torch::Tensor()>& loss_of_micro_batch);

// Every installed plugin's estimates for `request` (plugin_loader.h's search path; each plugin is
// created with empty options on `world`, which may be a single process: the estimate is for
// request.world_size). Plugins whose estimate_memory returns nothing are listed in
// without_estimate; a plugin that cannot be loaded or throws, or whose traits().devices lacks
// request.device, is listed in failed with the reason.
struct EstimateTable {
  std::vector<MemoryEstimate> rows;
  std::vector<std::string> without_estimate;
  std::vector<std::string> failed;
};
BOOSTER_API EstimateTable estimate_installed_plugins(const EstimateRequest& request,
                                                     const std::shared_ptr<dist::ProcessGroup>& world);

// What Booster::estimate returns: the request it estimated (model sizes, world size, precision,
// measured activations), every installed plugin's rows, and `text`: the table with its notes as
// `--estimate` prints it (format_estimate_table, then what was measured, the budgets and any guess).
struct EstimateReport {
  EstimateRequest request;
  EstimateTable table;
  std::string text;
};

// MemAvailable of /proc/meminfo (bytes); 0 when unreadable.
BOOSTER_API int64_t available_memory_bytes();
// VmRSS of /proc/self/status (bytes); 0 when unreadable.
BOOSTER_API int64_t resident_memory_bytes();

// The table: one row per configuration (MiB, one decimal): params, grads, master, optim, comm,
// transient, activations, runtime, total, and "yes"/"no" against budget_bytes per rank (0: no
// column), then the request, the plugins without an estimate and the failures.
// A request on an accelerator (request.device "cuda") adds, after total, the part of it in device
// memory ("on cuda": MemoryEstimate::device_bytes) and, when device_budget_bytes > 0, "yes"/"no" for
// it against device_budget_bytes per rank; the host "fits" column then compares the host part
// (runtime + host_total()). A CPU request gives the table as before.
BOOSTER_API std::string format_estimate_table(const EstimateRequest& request, const EstimateTable& table,
                                              int64_t runtime_bytes, int64_t budget_bytes,
                                              int64_t device_budget_bytes = 0);

}  // namespace booster
