// mesh_model_test.cpp — the mesh-parallel model's pieces (booster/parallel/mesh_model.h,
// mesh_optimizer.h) without a plugin: make_mesh_model lists every tensor held by stage 0,
// drop_other_stages removes the released ones from the optimizer, mesh_norm_filter counts a
// tp-replicated parameter on tp rank 0 only and a shared one on its first stage only, and
// MeshModelHooks averages the gradients over dp on 2 thread ranks (equal to the mean of the two
// ranks' gradients computed in one process, tolerance 1e-6) and refuses a whole-model forward or
// backward of a pipelined model.
#include "booster/parallel/mesh_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "booster/nn/tensor_parallel.h"
#include "booster/parallel/mesh_optimizer.h"
#include "common/thread_ranks.h"

namespace mesh_model_test {

using booster::parallel::MeshModel;
using booster::parallel::MeshTopology;
using Group = std::shared_ptr<booster::dist::ProcessGroup>;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc = register_module("fc", torch::nn::Linear(3, 2));
    bn = register_module("bn", torch::nn::BatchNorm1d(2));
    torch::NoGradGuard no_grad;
    fc->weight.copy_(at::arange(6, at::kFloat).reshape({2, 3}) * 0.1 - 0.2);
    fc->bias.fill_(0.05);
  }
  at::Tensor forward(const at::Tensor& x) { return bn(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

at::Tensor input(int rank) { return at::linspace(-1, 1, 12).reshape({4, 3}) * (rank + 1); }

TEST(MeshModel, ListsEveryTensorHeldByStageZeroAndDropsReleasedOnesFromTheOptimizer) {
  Net net;
  auto model = booster::parallel::make_mesh_model(net.ptr());
  std::vector<std::string> params, buffers;
  for (const auto& [name, t] : model->named_parameters) params.push_back(name);
  for (const auto& [name, t] : model->named_buffers) buffers.push_back(name);
  EXPECT_THAT(params, ::testing::ElementsAre("fc.weight", "fc.bias", "bn.weight", "bn.bias"));
  EXPECT_THAT(buffers, ::testing::ElementsAre("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"));
  for (const auto& [name, held] : model->held) EXPECT_TRUE(held) << name;
  for (const auto& [name, stage] : model->owner_stage) EXPECT_EQ(stage, 0) << name;
  EXPECT_EQ(model->local_shape.at("fc.weight"), (std::vector<int64_t>{2, 3}));

  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  model->held["bn.weight"] = model->held["bn.bias"] = false;  // another stage's
  booster::parallel::drop_other_stages(*model, sgd);
  ASSERT_EQ(sgd.param_groups()[0].params().size(), 2u);
  EXPECT_TRUE(sgd.param_groups()[0].params()[0].is_same(net->fc->weight));
  EXPECT_TRUE(sgd.param_groups()[0].params()[1].is_same(net->fc->bias));
}

TEST(MeshModel, NormFilterCountsReplicatedOnTpRankZeroAndSharedOnTheirFirstStage) {
  Net net;
  auto model = booster::parallel::make_mesh_model(net.ptr());
  booster::nn::TensorParallelSpec spec;
  spec.dim = 0;
  spec.full_size = 4;
  spec.padded_size = 4;
  spec.tp_size = 2;
  spec.tp_rank = 1;
  booster::nn::register_tensor_parallel_spec(net->fc->weight, spec);  // a tp shard
  model->shared.push_back({"bn.bias", net->bn->bias, {1, 3}});        // held by stages 1 and 3
  MeshTopology topo;
  topo.tp_rank = 1;
  topo.pp_rank = 1;
  auto counts = booster::parallel::mesh_norm_filter(*model, topo);
  EXPECT_TRUE(counts(net->fc->weight));   // a shard: every tp rank counts its own
  EXPECT_FALSE(counts(net->fc->bias));    // replicated over tp: tp rank 0 only
  topo.tp_rank = 0;
  counts = booster::parallel::mesh_norm_filter(*model, topo);
  EXPECT_TRUE(counts(net->fc->bias));
  EXPECT_TRUE(counts(net->bn->bias));     // stage 1 is its first stage
  topo.pp_rank = 3;
  EXPECT_FALSE(booster::parallel::mesh_norm_filter(*model, topo)(net->bn->bias));
}

TEST(MeshModel, HooksAverageTheGradientsOverDpAndRefuseAWholeForwardOfAPipeline) {
  // The reference: each rank's gradients from one process, averaged.
  std::vector<std::vector<at::Tensor>> per_rank;
  for (int r = 0; r < 2; ++r) {
    Net ref;
    ref->forward(input(r)).pow(2).sum().backward();
    std::vector<at::Tensor> g;
    for (const auto& p : ref->parameters()) g.push_back(p.grad().clone());
    per_rank.push_back(g);
  }
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    Net net;
    auto model = booster::parallel::make_mesh_model(net.ptr());
    MeshTopology topo;
    topo.dp = 2;
    topo.dp_rank = g->rank();
    topo.dp_group = topo.data_group = g;
    topo.tp_group = topo.pp_group = topo.sp_group = g->split(g->rank(), 0);  // groups of one
    booster::parallel::MeshModelHooks hooks(model, topo, 64, false);
    hooks.backward(net->forward(input(g->rank())).pow(2).sum());
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(at::allclose(params[i].grad(), (per_rank[0][i] + per_rank[1][i]) / 2, 1e-6, 1e-6)) << i;
    EXPECT_EQ(hooks.stats().at("dp_size"), 2);
    EXPECT_EQ(hooks.stats().at("tensors_on_stage"), 7);

    topo.pp = 2;
    booster::parallel::MeshModelHooks pipelined(model, topo, 64, false);
    EXPECT_THAT([&] { pipelined.pre_forward(); },
                ::testing::ThrowsMessage<std::logic_error>(::testing::HasSubstr("use booster.execute_pipeline")));
    EXPECT_THAT([&] { booster::parallel::run_mesh_pipeline(*model, pipelined, input(0), input(0), {}, {}); },
                ::testing::ThrowsMessage<std::logic_error>(::testing::HasSubstr("needs pp_size > 1")));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

}  // namespace mesh_model_test
