// model_hooks_test.cpp — ModelHooks' defaults (booster/wrappers/model_hooks.h): backward is
// loss.backward(), no stats, no communication buffers, and the forward hooks do nothing.
#include "booster/wrappers/model_hooks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace model_hooks_test {

class OnlyModule : public booster::ModelHooks {
 public:
  explicit OnlyModule(torch::nn::Linear m) : m_(std::move(m)) {}
  torch::nn::Module& module() override { return *m_; }

 private:
  torch::nn::Linear m_;
};

TEST(ModelHooks, DefaultsRunThePlainBackwardAndReportNothing) {
  torch::manual_seed(3);
  torch::nn::Linear layer(3, 2);
  torch::nn::Linear reference(3, 2);
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(layer->weight);
    reference->bias.copy_(layer->bias);
  }
  const at::Tensor x = at::linspace(-1, 1, 6).reshape({2, 3});
  OnlyModule hooks(layer);
  hooks.pre_forward();
  at::Tensor loss = layer(x).pow(2).sum();
  hooks.post_forward();
  hooks.backward(loss);
  reference(x).pow(2).sum().backward();
  EXPECT_TRUE(at::equal(layer->weight.grad(), reference->weight.grad()));
  EXPECT_TRUE(at::equal(layer->bias.grad(), reference->bias.grad()));
  EXPECT_TRUE(hooks.stats().empty());
  EXPECT_EQ(hooks.communication_buffer_bytes(), 0);
  EXPECT_EQ(&hooks.module(), layer.get());
}

}  // namespace model_hooks_test
