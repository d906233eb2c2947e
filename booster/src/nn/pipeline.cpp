// pipeline.cpp — the key function of PipelineModule (its type_info lives in libbooster, so plugins
// can dynamic_cast a user's model to it), and the per-layer parameter count.
#include "booster/nn/pipeline.h"

#include <set>

namespace booster::nn {

PipelineModule::~PipelineModule() = default;

int64_t layer_parameter_count(const PipelineLayer& layer) {
  std::set<const void*> seen;
  int64_t n = 0;
  for (const auto& m : layer.modules)
    if (m)
      for (const auto& p : m->parameters(/*recurse=*/true))
        if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  return n;
}

}  // namespace booster::nn
