// pipeline.h — how a model offers itself to pipeline parallelism: as a sequence of layers, which
// the hybrid_parallel plugin partitions into stages (GPipe, Huang et al. 2019; Megatron-LM's and
// ColossalAI's pipeline stages). LibTorch modules have no generic "run the children in order", so
// the model says what its forward is in terms of layers:
//
//     struct GPTImpl : torch::nn::Module, booster::nn::PipelineModule {
//       std::vector<booster::nn::PipelineLayer> pipeline_layers() override {
//         std::vector<booster::nn::PipelineLayer> layers;
//         layers.push_back({"transformer.embed", {wte, wpe}, [this](const at::Tensor& ids) { return embed(ids); }});
//         for (size_t i = 0; i < h->size(); ++i)
//           layers.push_back({"transformer.h." + std::to_string(i), {h[i]}, [this, i](const at::Tensor& x) { return block(i, x); }});
//         layers.push_back({"lm_head", {ln_f, wte}, [this](const at::Tensor& x) { return head(x); }});   // tied: lists wte again
//         return layers;
//       }
//       at::Tensor forward(const at::Tensor& ids);   // == the layers applied in order
//     };
//
// Contract: forward(x) of the whole model equals layers[n-1].forward(... layers[0].forward(x)) (the
// plugin checks nothing of this; a model whose layers differ from its forward trains a different
// model under pp > 1). Each layer maps one tensor to one tensor (stage 0's input is the batch's
// input, e.g. int64 token ids [B, S]; the last layer's output goes to the criterion). Every
// parameter of the model belongs to the modules of at least one layer (the plugin refuses a model
// with a parameter in no layer, naming it); a parameter listed by layers on two stages (a tied
// embedding / LM head) is kept on both and its gradients are summed across them after backward
// (Megatron's embedding group).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "booster/export.h"

namespace booster::nn {

struct PipelineLayer {
  std::string name;  // for messages and the stage listing, e.g. "transformer.h.3"
  // The modules whose parameters and buffers this layer uses (sub-modules included).
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  std::function<at::Tensor(const at::Tensor&)> forward;  // input activation -> output activation
};

class BOOSTER_API PipelineModule {
 public:
  virtual ~PipelineModule();
  // The layers in forward order (see the contract above). Called once, by the plugin at boost().
  virtual std::vector<PipelineLayer> pipeline_layers() = 0;
};

// The number of parameter elements `layer` holds: every parameter of its modules (sub-modules
// included; null modules skipped) counted once, however many of its modules list it. A parameter
// two layers share (a tied embedding) counts in both: each stage that runs one of them holds it.
// The pipeline partition's weights and the memory estimate's stage sizes both use this count.
BOOSTER_API int64_t layer_parameter_count(const PipelineLayer& layer);

}  // namespace booster::nn
