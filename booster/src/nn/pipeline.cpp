// pipeline.cpp — the key function of PipelineModule (its type_info lives in libbooster, so plugins
// can dynamic_cast a user's model to it).
#include "booster/nn/pipeline.h"

namespace booster::nn {
PipelineModule::~PipelineModule() = default;
}  // namespace booster::nn
