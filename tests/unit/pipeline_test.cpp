// pipeline_test.cpp — nn::layer_parameter_count (booster/nn/pipeline.h): each parameter of a layer's
// modules once (sub-modules included, a module listed twice or a null module adding nothing), and a
// module shared by two layers counted in both.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "booster/nn/pipeline.h"

using booster::nn::layer_parameter_count;
using booster::nn::PipelineLayer;

TEST(PipelineLayer, ParameterCountCountsEachParameterOnce) {
  auto embed = std::make_shared<torch::nn::EmbeddingImpl>(10, 4);      // 40
  auto block = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(4, 8), torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));  // 40 + 16
  auto norm = std::make_shared<torch::nn::LayerNormImpl>(torch::nn::LayerNormOptions({4}));  // 8
  EXPECT_EQ(layer_parameter_count(PipelineLayer{"embed", {embed}, nullptr}), 40);
  EXPECT_EQ(layer_parameter_count(PipelineLayer{"block", {block}, nullptr}), 56);
  EXPECT_EQ(layer_parameter_count(PipelineLayer{"head", {norm, embed, embed, nullptr}, nullptr}), 48);
  EXPECT_EQ(layer_parameter_count(PipelineLayer{"empty", {}, nullptr}), 0);
}
