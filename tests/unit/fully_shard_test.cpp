// fully_shard_test.cpp — booster::parallel::fully_shard without a plugin, on 2 ranks as threads,
// against single-process LibTorch on both ranks' data: three AdamW steps give the same parameters
// (fp32, tolerance 1e-5 absolute + 1e-5 relative: only the order of the gradient sums differs), the
// optimizer state gathered from the shards (ShardOptimizer) equals the reference's, a sharded-state
// round trip restores it, and the model checkpoint sources gather the full parameters; the same with
// cpu_offload on 1 and 2 ranks.
#include "booster/parallel/fully_shard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "booster/wrappers/model_wrapper.h"
#include "booster/optim/optimizer_registry.h"
#include "common/thread_ranks.h"

namespace fully_shard_test {

using Group = std::shared_ptr<booster::dist::ProcessGroup>;
using Layer = booster::nn::Unit<torch::nn::Linear>;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", Layer(5, 4));
    b = register_module("b", Layer(4, 3));
    scale = register_parameter("scale", torch::ones({3}));
    torch::NoGradGuard no_grad;
    int k = 0;
    for (auto& p : parameters()) p.copy_(at::sin(at::arange(p.numel(), at::kFloat) * 0.9 + (k++)).reshape(p.sizes()) * 0.4);
  }
  at::Tensor forward(const at::Tensor& x) { return b(at::tanh(a(x))) * scale; }
  Layer a{nullptr}, b{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(Net);

at::Tensor input(int rank, int step) { return at::linspace(-1, 1, 10).reshape({2, 5}) * (rank + 1) + 0.1 * step; }
constexpr int kSteps = 3;

TEST(FullyShard, AdamWStepsOnTwoRanksEqualSingleProcessAndTheStateGathersToTheReference) {
  Net ref;
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.01));
  for (int step = 0; step < kSteps; ++step) {
    ref_opt.zero_grad();
    ((ref->forward(input(0, step)).pow(2).sum() + ref->forward(input(1, step)).pow(2).sum()) / 2).backward();
    ref_opt.step();
  }
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    Net net;
    auto opt = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.01));
    booster::parallel::FullyShardOptions options;
    options.shard_group = g;
    auto sharded = booster::parallel::fully_shard(net.ptr(), opt, options);
    ASSERT_TRUE(sharded.optimizer);
    booster::ModelWrapper<NetImpl> model(net.ptr(), sharded.hooks);
    for (int step = 0; step < kSteps; ++step) {
      sharded.optimizer->zero_grad();
      sharded.hooks->backward(model.forward(input(g->rank(), step)).pow(2).sum());
      sharded.optimizer->step();
    }
    EXPECT_EQ(sharded.runtime->stats().at("reduce_scatters"), 3 * kSteps);  // root, a, b per step

    // The parameters, gathered by the checkpoint sources, equal the reference's.
    const auto sources = sharded.runtime->checkpoint_sources();
    std::map<std::string, at::Tensor> full;
    for (const auto& src : sources) {
      const at::Tensor flat = src.gather_full();
      const auto& l = src.flat->layout();
      for (size_t j = 0; j < src.flat->params().size(); ++j)
        full[src.flat->params()[j].first] = flat.narrow(0, l.offsets[j], l.numels[j]).view(src.flat->params()[j].second.sizes());
    }
    for (const auto& item : ref->named_parameters()) {
      SCOPED_TRACE(item.key());
      ASSERT_TRUE(full.count(item.key()));
      EXPECT_TRUE(at::allclose(full.at(item.key()), item.value(), 1e-5, 1e-5));
    }

    // ShardOptimizer: the gathered state is the reference's, parameter by parameter.
    const auto states = sharded.optimizer->gather_param_states();
    const auto ref_params = ref->parameters();
    for (size_t i = 0; i < ref_params.size(); ++i) {
      auto& ref_state = static_cast<torch::optim::AdamWParamState&>(
          *ref_opt.state().at(booster::optimizer_state_key(ref_params[i])));
      EXPECT_TRUE(at::allclose(states[i].tensors.at("exp_avg"), ref_state.exp_avg(), 1e-5, 1e-6));
      EXPECT_TRUE(at::allclose(states[i].tensors.at("exp_avg_sq"), ref_state.exp_avg_sq(), 1e-5, 1e-8));
      EXPECT_EQ(states[i].scalars.at("step"), kSteps);
    }
    // A sharded round trip: this rank's pieces back through load_state_ranges give the same state.
    const auto pieces = sharded.optimizer->local_state_pieces();
    EXPECT_FALSE(pieces.empty());
    sharded.optimizer->load_param_states(states);
    const auto again = sharded.optimizer->gather_param_states();
    for (size_t i = 0; i < states.size(); ++i)
      EXPECT_TRUE(at::equal(again[i].tensors.at("exp_avg"), states[i].tensors.at("exp_avg")));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

// cpu_offload (FSDP's CPUOffload): on a CPU model nothing moves, but the same path runs — no
// FlatParameter aliases its buffer (one rank included), gradient shards stay with the shards, and
// the optimizer steps them through the CPU Adam kernel. Equal to single-process LibTorch (fp32,
// 1e-5 absolute + 1e-5 relative) on 1 and 2 ranks.
TEST(FullyShard, CpuOffloadOnOneAndTwoRanksEqualsSingleProcess) {
  for (int world : {1, 2}) {
    SCOPED_TRACE(std::to_string(world) + " ranks");
    Net ref;
    torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.01));
    for (int step = 0; step < kSteps; ++step) {
      ref_opt.zero_grad();
      at::Tensor loss = ref->forward(input(0, step)).pow(2).sum();
      if (world == 2) loss = (loss + ref->forward(input(1, step)).pow(2).sum()) / 2;
      loss.backward();
      ref_opt.step();
    }
    const auto errors = booster::testing::run_thread_ranks(world, [&](const Group& g) {
      Net net;
      auto opt = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.01));
      booster::parallel::FullyShardOptions options;
      options.shard_group = g;
      options.cpu_offload = true;
      auto sharded = booster::parallel::fully_shard(net.ptr(), opt, options);
      auto state = std::dynamic_pointer_cast<booster::parallel::FullyShardState>(sharded.runtime);
      ASSERT_TRUE(state);
      EXPECT_TRUE(state->offloads());
      for (const auto& f : state->flats()) EXPECT_FALSE(f.flat->is_aliased());
      booster::ModelWrapper<NetImpl> model(net.ptr(), sharded.hooks);
      for (int step = 0; step < kSteps; ++step) {
        sharded.optimizer->zero_grad();
        sharded.hooks->backward(model.forward(input(g->rank(), step)).pow(2).sum());
        sharded.optimizer->step();
      }
      for (const auto& src : sharded.runtime->checkpoint_sources()) {
        const at::Tensor flat = src.gather_full();
        const auto& l = src.flat->layout();
        const auto ref_params = ref->named_parameters();
        for (size_t j = 0; j < src.flat->params().size(); ++j) {
          const std::string& name = src.flat->params()[j].first;
          EXPECT_TRUE(at::allclose(flat.narrow(0, l.offsets[j], l.numels[j]), ref_params[name].reshape({-1}), 1e-5, 1e-5))
              << name;
        }
      }
    });
    EXPECT_EQ(errors, std::vector<std::string>(static_cast<size_t>(world), ""));
  }
}

TEST(FullyShard, WithoutAShardGroupOrModelItIsAClearError) {
  Net net;
  booster::parallel::FullyShardOptions options;
  EXPECT_THAT([&] { booster::parallel::fully_shard(net.ptr(), nullptr, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("fully_shard: FSDP needs a shard group")));
  EXPECT_THAT([&] { booster::parallel::fully_shard(nullptr, nullptr, options, {}, {}, "my_trainer"); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("my_trainer: the model is null")));
}

}  // namespace fully_shard_test
