// gemini_shard_test.cpp — booster::parallel::gemini_shard without a plugin, on 2 ranks as threads,
// against single-process LibTorch on both ranks' data: three AdamW steps over a model packed into
// several chunks give the same parameters (fp32, tolerance 1e-5 absolute + 1e-5 relative: the order
// of the gradient sums and the fused CPU Adam kernel's rounding differ), the optimizer state
// gathered from the master shards equals the reference's, and the same holds with the optimizer side
// in an offload_dir file, and with a loss scaler (fp16's step on fp32 chunks: an overflowing
// iteration is skipped on every rank, the scale backs off, the clean steps equal the reference). Bad
// input: no group, no model, a parameter on a device that is neither the CPU nor CUDA, parameters on
// two devices, an offload_dir that does not exist.
#include "booster/parallel/gemini.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "booster/mixed_precision/grad_scaler.h"
#include "booster/optim/optimizer_registry.h"
#include "booster/wrappers/model_wrapper.h"
#include "common/thread_ranks.h"

namespace gemini_shard_test {

using Group = std::shared_ptr<booster::dist::ProcessGroup>;
using Layer = booster::nn::Unit<torch::nn::Linear>;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", Layer(5, 4));
    b = register_module("b", Layer(4, 3));
    scale = register_parameter("scale", torch::ones({3}));
    torch::NoGradGuard no_grad;
    int k = 0;
    for (auto& p : parameters()) p.copy_(at::sin(at::arange(p.numel(), at::kFloat) * 0.7 + (k++)).reshape(p.sizes()) * 0.4);
  }
  at::Tensor forward(const at::Tensor& x) { return b(at::tanh(a(x))) * scale; }
  Layer a{nullptr}, b{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(Net);

at::Tensor input(int rank, int step) { return at::linspace(-1, 1, 10).reshape({2, 5}) * (rank + 1) - 0.1 * step; }
constexpr int kSteps = 3;

// Chunks of 20 elements (the largest parameter, a.weight): the 42 parameters make 3 chunks.
booster::parallel::GeminiShardOptions small_chunks(const Group& g) {
  booster::parallel::GeminiShardOptions o;
  o.group = g;
  o.min_chunk_size = 0;
  o.search_range = 0;
  o.search_interval = 1;
  return o;
}

struct Reference {
  Net net;
  std::unique_ptr<torch::optim::AdamW> opt;
  Reference() {
    opt = std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.01));
    for (int step = 0; step < kSteps; ++step) {
      opt->zero_grad();
      ((net->forward(input(0, step)).pow(2).sum() + net->forward(input(1, step)).pow(2).sum()) / 2).backward();
      opt->step();
    }
  }
};

// Trains on rank g with `options` and compares with the reference. With a loss scaler, the losses
// go through the optimizer wrapper's backward (scaled) and one iteration whose gradients are NaN on
// rank 1 comes first: it must be skipped on both ranks.
void train_and_compare(const Group& g, booster::parallel::GeminiShardOptions options, const Reference& ref,
                       std::shared_ptr<booster::mixed_precision::GradScaler> scaler = nullptr) {
  Net net;
  auto opt = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.01));
  const int64_t offloaded = options.offload_optim_frac > 0 ? 3 : 0;
  booster::OptimizerWrapperOptions wo;
  wo.scaler = scaler;
  auto sharded = booster::parallel::gemini_shard(net.ptr(), opt, std::move(options), wo);
  ASSERT_TRUE(sharded.optimizer);
  ASSERT_TRUE(sharded.checkpoint_io);
  EXPECT_EQ(sharded.runtime->stats().at("chunk_size"), 20);
  EXPECT_EQ(sharded.runtime->stats().at("chunks"), 3);
  EXPECT_EQ(sharded.runtime->stats().at("chunks_optim_offloaded"), offloaded);
  booster::ModelWrapper<NetImpl> model(net.ptr(), sharded.hooks);
  if (scaler) {
    const double scale = scaler->scale();
    sharded.optimizer->zero_grad();
    const at::Tensor loss = model.forward(input(g->rank(), 0)).pow(2).sum();
    sharded.optimizer->backward(g->rank() == 1 ? loss * std::nan("") : loss);
    EXPECT_FALSE(sharded.optimizer->step());  // skipped on both ranks
    EXPECT_EQ(sharded.optimizer->skipped_steps(), 1);
    EXPECT_EQ(sharded.optimizer->loss_scale(), scale / 2);
    // The float32 masters are still the initial weights.
    const Net fresh;
    const auto initial = fresh->named_parameters();
    for (const auto& src : sharded.runtime->checkpoint_sources()) {
      const at::Tensor flat = src.gather_full();
      const auto& l = src.flat->layout();
      for (size_t j = 0; j < src.flat->params().size(); ++j)
        EXPECT_TRUE(at::equal(flat.narrow(0, l.offsets[j], l.numels[j]),
                              initial[src.flat->params()[j].first].reshape({-1})))
            << src.flat->params()[j].first;
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    sharded.optimizer->zero_grad();
    const at::Tensor loss = model.forward(input(g->rank(), step)).pow(2).sum();
    if (scaler) {
      sharded.optimizer->backward(loss);
      EXPECT_TRUE(sharded.optimizer->step());
    } else {
      sharded.hooks->backward(loss);
      sharded.optimizer->step();
    }
  }
  // The float32 masters, gathered by the checkpoint sources, equal the reference's parameters.
  std::map<std::string, at::Tensor> full;
  for (const auto& src : sharded.runtime->checkpoint_sources()) {
    const at::Tensor flat = src.gather_full();
    const auto& l = src.flat->layout();
    for (size_t j = 0; j < src.flat->params().size(); ++j)
      full[src.flat->params()[j].first] = flat.narrow(0, l.offsets[j], l.numels[j]).view(src.flat->params()[j].second.sizes());
  }
  for (const auto& item : ref.net->named_parameters()) {
    SCOPED_TRACE(item.key());
    ASSERT_TRUE(full.count(item.key()));
    EXPECT_TRUE(at::allclose(full.at(item.key()), item.value(), 1e-5, 1e-5)) << full.at(item.key()) - item.value();
  }
  // The optimizer state gathered from the master shards is the reference's, parameter by parameter.
  const auto states = sharded.optimizer->gather_param_states();
  const auto ref_params = ref.net->parameters();
  ASSERT_EQ(states.size(), ref_params.size());
  for (size_t i = 0; i < ref_params.size(); ++i) {
    auto& ref_state = static_cast<torch::optim::AdamWParamState&>(
        *ref.opt->state().at(booster::optimizer_state_key(ref_params[i])));
    EXPECT_TRUE(at::allclose(states[i].tensors.at("exp_avg"), ref_state.exp_avg(), 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(states[i].tensors.at("exp_avg_sq"), ref_state.exp_avg_sq(), 1e-5, 1e-8));
    EXPECT_EQ(states[i].scalars.at("step"), kSteps);
  }
}

TEST(GeminiShard, AdamWOverThreeChunksOnTwoRanksEqualsSingleProcess) {
  const Reference ref;
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) { train_and_compare(g, small_chunks(g), ref); });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(GeminiShard, OptimizerSideInAnOffloadFileEqualsSingleProcess) {
  const Reference ref;
  const auto dir = std::filesystem::temp_directory_path() / ("gemini_shard_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    auto options = small_chunks(g);
    options.offload_optim_frac = 1.0;
    options.offload_dir = dir.string();
    train_and_compare(g, options, ref);
  });
  std::filesystem::remove_all(dir);
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(GeminiShard, ALossScalerSkipsAnOverflowOnEveryRankAndTheCleanStepsEqualSingleProcess) {
  const Reference ref;
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    booster::mixed_precision::DynamicGradScalerOptions so;
    so.initial_scale = 1024;
    so.hysteresis = 1;
    train_and_compare(g, small_chunks(g), ref, std::make_shared<booster::mixed_precision::DynamicGradScaler>(so));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(GeminiShard, WithoutAGroupOrModelOrWithAMissingOffloadDirItIsAClearError) {
  Net net;
  booster::parallel::GeminiShardOptions options;
  EXPECT_THAT([&] { booster::parallel::gemini_shard(net.ptr(), nullptr, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("gemini needs a data-parallel group")));
  auto off_cpu = std::make_shared<torch::nn::Module>();
  off_cpu->register_parameter("w", torch::empty({2}, at::TensorOptions().device(at::kMeta)));
  EXPECT_THAT([&] { booster::parallel::gemini_shard(off_cpu, nullptr, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("parameter 'w' is on meta")));
  auto two_devices = std::make_shared<torch::nn::Module>();
  two_devices->register_parameter("a", torch::zeros({2}));
  two_devices->register_parameter("b", torch::empty({2}, at::TensorOptions().device(at::kMeta)));
  EXPECT_THAT([&] { booster::parallel::gemini_shard(two_devices, nullptr, options); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  ::testing::HasSubstr("parameter 'b' is on meta and others on cpu")));
  EXPECT_THAT([&] { booster::parallel::gemini_shard(nullptr, nullptr, options, {}, {}, "my_trainer"); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("my_trainer: the model is null")));
  const auto errors = booster::testing::run_thread_ranks(1, [&](const Group& g) {
    Net local;
    auto o = small_chunks(g);
    o.offload_optim_frac = 1.0;
    o.offload_dir = "/nonexistent/gemini_shard_test";
    const auto before = local->parameters()[0].clone();
    EXPECT_THAT([&] { booster::parallel::gemini_shard(local.ptr(), nullptr, o); },
                ::testing::ThrowsMessage<std::runtime_error>(::testing::HasSubstr("/nonexistent/gemini_shard_test")));
    EXPECT_TRUE(at::equal(local->parameters()[0], before));  // nothing was changed
  });
  EXPECT_EQ(errors, std::vector<std::string>(1, ""));
}

}  // namespace gemini_shard_test
