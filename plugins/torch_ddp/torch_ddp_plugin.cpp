// torch_ddp_plugin.cpp — the TorchDDP plugin: data parallelism with bucketed, overlapped gradient
// averaging (PyTorch DistributedDataParallel semantics): a recipe over booster::parallel::replicate.
// Options and defaults are ColossalAI's TorchDDPPlugin.
#include <torch/cuda.h>
#include <torch/torch.h>

#include "booster/core/replica.h"
#include "booster/dist/process_group.h"
#include "booster/logging.h"
#include "booster/mixed_precision/precision.h"
#include "booster/parallel/replicate.h"
#include "booster/plugin.h"

namespace booster::plugins {

// ---------------------------------------------------------------------------------------------
// Options ([plugin] table)

struct TorchDDPOptions {
  double bucket_cap_mb = 25.0;          // MiB per gradient bucket (first bucket: first_bucket_mb)
  double first_bucket_mb = 1.0;         // MiB; PyTorch's _DEFAULT_FIRST_BUCKET_BYTES
  bool broadcast_buffers = true;        // broadcast buffers from rank 0 before each training forward
  bool find_unused_parameters = false;  // tolerate parameters without gradient on some rank
  bool gradient_as_bucket_view = false; // param.grad() is a view into its bucket
  bool static_graph = false;            // the graph never changes: buckets rebuilt even with find_unused_parameters
  bool check_reduction = false;         // deprecated in PyTorch; accepted and ignored
  // Gradient buckets on the wire: "" (the parameters' dtype) | "fp32" | "bf16" | "fp16" (CUDA) |
  // "fp8" (float8 e4m3, one scale per bucket per rank: dist/fp8.h). ColossalAI's
  // fp8_communication = true is "fp8".
  std::string communication_dtype;
};

static TorchDDPOptions parse_options(const Options& o) {
  TorchDDPOptions t;
  t.bucket_cap_mb = o.get_double("bucket_cap_mb", t.bucket_cap_mb, 1e-6, 1e6);
  t.first_bucket_mb = o.get_double("first_bucket_mb", t.first_bucket_mb, 1e-6, 1e6);
  t.broadcast_buffers = o.get_bool("broadcast_buffers", t.broadcast_buffers);
  t.find_unused_parameters = o.get_bool("find_unused_parameters", t.find_unused_parameters);
  t.gradient_as_bucket_view = o.get_bool("gradient_as_bucket_view", t.gradient_as_bucket_view);
  t.static_graph = o.get_bool("static_graph", t.static_graph);
  t.check_reduction = o.get_bool("check_reduction", t.check_reduction);
  t.communication_dtype = mixed_precision::communication_dtype_option(o, {"", "fp32", "bf16", "fp16", "fp8"});
  if (t.communication_dtype == "fp16" && !torch::cuda::is_available())
    throw PluginError("torch_ddp: communication_dtype = \"fp16\" needs CUDA; use \"bf16\", \"fp8\" or \"fp32\" on CPU");
  if (t.gradient_as_bucket_view && !t.communication_dtype.empty() && t.communication_dtype != "fp8")
    throw PluginError("torch_ddp: gradient_as_bucket_view = true makes the buckets the gradients, so they keep the "
                      "parameters' dtype; communication_dtype = \"" + t.communication_dtype + "\" cannot be combined "
                      "with it (use communication_dtype = \"fp8\", which quantizes on the wire only, or "
                      "gradient_as_bucket_view = false)");
  if (t.check_reduction)
    log::warn("torch_ddp: check_reduction = true has no effect (deprecated in PyTorch DDP, where it does nothing "
              "either); unused parameters are found with find_unused_parameters = true");
  return t;
}

// ---------------------------------------------------------------------------------------------
// Plugin

class TorchDDPPlugin : public Plugin {
 public:
  explicit TorchDDPPlugin(const PluginContext& ctx) : Plugin(ctx), options_(parse_options(ctx.options)) {}

  PluginTraits traits() const override {
    PluginTraits t;
    t.precisions = {"fp16", "bf16", "fp32"};
    t.devices = {"cpu", "cuda"};
    t.supports_no_sync = true;
    return t;
  }

  // Two rows: the default (buckets are a second gradient copy) and gradient_as_bucket_view = true.
  // Under autocast (mixed_precision bf16/fp16) the parameters stay fp32; the activations shrink.
  std::vector<MemoryEstimate> estimate_memory(const EstimateRequest& r) const override {
    const int64_t P = r.parameters;
    MemoryEstimate copy = replicated_estimate(r, P, 4, false, 4 * P, r.largest_parameter);
    copy.configuration = "gradient_as_bucket_view = false (default)";
    MemoryEstimate view = replicated_estimate(r, P, 4, false, 0, r.largest_parameter);
    view.configuration = "gradient_as_bucket_view = true";
    view.options = {"gradient_as_bucket_view=true"};
    return {copy, view};
  }

  Configured configure(std::shared_ptr<torch::nn::Module> model,
                       std::shared_ptr<torch::optim::Optimizer> optimizer) override {
    parallel::ReplicateOptions ro;
    ro.reducer.bucket_cap_bytes = mib_to_bytes(options_.bucket_cap_mb);
    ro.reducer.first_bucket_bytes = mib_to_bytes(options_.first_bucket_mb);
    ro.reducer.find_unused_parameters = options_.find_unused_parameters;
    ro.reducer.gradient_as_bucket_view = options_.gradient_as_bucket_view;
    ro.reducer.static_graph = options_.static_graph;
    ro.reducer.communication_dtype = mixed_precision::dtype_from_name(options_.communication_dtype);
    ro.broadcast_buffers = options_.broadcast_buffers;
    // The optimizer wrapper (loss scaling, clipping, master weights) is the Booster's: DDP's
    // gradients are replicated after backward, which is the wrapper's default.
    Configured c;
    c.hooks = parallel::replicate(model, world(), ro);
    return c;
  }

 private:
  TorchDDPOptions options_;
};

}  // namespace booster::plugins

BOOSTER_PLUGIN("torch_ddp", "0.1.0", booster::plugins::TorchDDPPlugin)
