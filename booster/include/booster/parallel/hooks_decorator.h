// hooks_decorator.h — how a parallelism function lets its caller wrap the model hooks it builds
// (mixed precision's wrap_hooks) before the optimizer wrapper takes them.
#pragma once

#include <functional>
#include <memory>

#include "booster/wrappers/model_hooks.h"

namespace booster::parallel {

// Returns the hooks to use in place of `hooks` (typically a decorator that calls into them).
using HooksDecorator = std::function<std::shared_ptr<ModelHooks>(std::shared_ptr<ModelHooks> hooks)>;

}  // namespace booster::parallel
