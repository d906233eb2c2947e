// plugin_test.cpp — the Plugin base class's defaults and helpers (plugin.cpp): the data loader shards
// by the plugin's data-parallel group (a mesh's dp dimension on 4 ranks as threads), no_sync
// through pause_grad_sync, shadowed settings with controls_precision, shadowed_value and
// mib_to_bytes. Loading plugins from .so files is plugin_loader_test.cpp.
#include "booster/plugin.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "booster/data/dataloader.h"
#include "booster/data/dataset.h"
#include "booster/dist/process_mesh.h"
#include "common/thread_ranks.h"

namespace {

using booster::Plugin;
using booster::PluginContext;
using booster::PluginTraits;
using booster::dist::ProcessGroup;
using booster::dist::ProcessMesh;
using Group = std::shared_ptr<ProcessGroup>;
using ::testing::ElementsAre;

// A plugin whose data-parallel group is the "dp" dimension of a {dp: 2, tp: 2} mesh.
class MeshPlugin : public Plugin {
 public:
  explicit MeshPlugin(const PluginContext& ctx) : Plugin(ctx), mesh_(ctx.world, {{"dp", 2}, {"tp", 2}}) {}
  std::shared_ptr<ProcessGroup> data_parallel_group() const override { return mesh_.group("dp"); }
  const ProcessMesh& mesh() const { return mesh_; }

 private:
  ProcessMesh mesh_;
};

PluginContext context_of(const Group& world, const std::string& name) {
  PluginContext ctx;
  ctx.name = name;
  ctx.world = world;
  return ctx;
}

std::vector<int64_t> first_epoch_indices(Plugin& plugin) {
  auto dataset = std::make_shared<booster::data::TensorDataset>(at::arange(8).reshape({8, 1}), at::arange(8));
  booster::data::DataLoaderOptions o;  // no shuffle: rank r of n gets r, r + n, ...
  return plugin.prepare_dataloader(dataset, o)->sampler().indices();
}

TEST(Plugin, DataLoaderShardsByTheDataParallelGroup) {
  std::vector<std::vector<int64_t>> mesh_indices(4), world_indices(4);
  const auto errors = booster::testing::run_thread_ranks(4, [&](const Group& world) {
    MeshPlugin mesh_plugin(context_of(world, "mesh"));
    mesh_indices[world->rank()] = first_epoch_indices(mesh_plugin);
    Plugin plain(context_of(world, "plain"));  // the default: the world
    world_indices[world->rank()] = first_epoch_indices(plain);
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
  // Ranks 0,1 have dp coordinate 0 (tp peers: the same batches), ranks 2,3 have dp coordinate 1.
  EXPECT_THAT(mesh_indices[0], ElementsAre(0, 2, 4, 6));
  EXPECT_EQ(mesh_indices[1], mesh_indices[0]);
  EXPECT_THAT(mesh_indices[2], ElementsAre(1, 3, 5, 7));
  EXPECT_EQ(mesh_indices[3], mesh_indices[2]);
  EXPECT_THAT(world_indices[1], ElementsAre(1, 5));
  EXPECT_THAT(world_indices[3], ElementsAre(3, 7));
}

// Hooks that record set_require_grad_sync.
class RecordingHooks : public booster::ModelHooks {
 public:
  torch::nn::Module& module() override { return module_; }
  void set_require_grad_sync(bool required) override { calls.push_back(required); }
  std::vector<bool> calls;

 private:
  torch::nn::Module module_;
};

class NoSyncPlugin : public Plugin {
 public:
  using Plugin::Plugin;
  PluginTraits traits() const override {
    PluginTraits t;
    t.supports_no_sync = true;
    t.controls_precision = true;
    return t;
  }
};

TEST(Plugin, DefaultsForNoSyncAndShadowedSettings) {
  const auto errors = booster::testing::run_thread_ranks(1, [&](const Group& world) {
    RecordingHooks hooks;
    Plugin plain(context_of(world, "plain"));
    EXPECT_THROW(plain.no_sync(hooks, nullptr), booster::PluginError);
    EXPECT_TRUE(plain.shadowed_settings().empty());
    NoSyncPlugin plugin(context_of(world, "nosync"));
    {
      auto guard = plugin.no_sync(hooks, nullptr);
      EXPECT_THAT(hooks.calls, ElementsAre(false));
    }
    EXPECT_THAT(hooks.calls, ElementsAre(false, true));
    // controls_precision: the Booster's precision settings are the plugin's, any value conflicts.
    const auto shadowed = plugin.shadowed_settings();
    ASSERT_EQ(shadowed.size(), 2u);
    EXPECT_EQ(shadowed[0].key, "booster.mixed_precision");
    EXPECT_EQ(shadowed[1].key, "mixed_precision");
    EXPECT_EQ(shadowed[0].value, "");
  });
  EXPECT_EQ(errors, std::vector<std::string>(1, ""));
}

TEST(Plugin, ShadowedValueAndMibToBytes) {
  EXPECT_EQ(booster::shadowed_value(1.0), "1");
  EXPECT_EQ(booster::shadowed_value(0.05), "0.05");
  EXPECT_EQ(booster::shadowed_value(0.1 + 0.2), "0.30000000000000004");  // shortest exact text
  EXPECT_NE(booster::shadowed_value(0.1 + 0.2), booster::shadowed_value(0.3));
  EXPECT_EQ(booster::shadowed_value(INFINITY), "inf");
  EXPECT_EQ(booster::shadowed_value(std::string("bf16")), "bf16");
  EXPECT_EQ(booster::mib_to_bytes(25), 25 << 20);
  EXPECT_EQ(booster::mib_to_bytes(0.5), 1 << 19);
  EXPECT_EQ(booster::mib_to_bytes(1e-9), 1);  // at least one byte
}

}  // namespace
