// model_hooks.cpp — ModelHooks' defaults (see booster/wrappers/model_hooks.h).
#include "booster/wrappers/model_hooks.h"

namespace booster {

ModelHooks::~ModelHooks() = default;

void ModelHooks::backward(const torch::Tensor& loss) { loss.backward(); }

}  // namespace booster
