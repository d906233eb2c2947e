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
