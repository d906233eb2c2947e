// gemini.cpp — gemini_shard() (see booster/parallel/gemini.h): the chunk policy (gemini_state.h) and
// its optimizer on master shards (gemini_optimizer.h) assembled on the sharded runtime.
#include "booster/parallel/gemini.h"

#include <stdexcept>

#include "gemini_optimizer.h"
#include "gemini_state.h"

namespace booster::parallel {

ShardedModel gemini_shard(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<torch::optim::Optimizer> optimizer,
                          GeminiShardOptions options, OptimizerWrapperOptions optimizer_options,
                          const HooksDecorator& decorate, const std::string& owner) {
  if (!model) throw std::invalid_argument("booster: " + owner + ": the model is null");
  for (const auto& item : model->named_parameters())
    if (!item.value().device().is_cpu())
      throw std::invalid_argument("booster: " + owner + ": parameter '" + item.key() + "' is on " +
                                  item.value().device().str() + "; gemini_shard keeps chunks in CPU memory only "
                                  "(Gemini on CUDA is not built): move the model to the CPU first");
  auto group = options.group;
  auto state = std::make_shared<gemini::GeminiState>(*model, optimizer.get(), std::move(options));
  ShardOptimizerFactory make_optimizer;
  if (optimizer)
    make_optimizer = [&](std::shared_ptr<ModelHooks> hooks, OptimizerWrapperOptions wo) {
      return std::make_shared<gemini::GeminiOptimizer>(optimizer, std::move(hooks), std::move(wo), state);
    };
  return make_sharded_model(model, state, group, owner, decorate, make_optimizer, std::move(optimizer_options));
}

}  // namespace booster::parallel
