// plugin_loader_test.cpp — plugin search, loading, descriptor checks, plugin options and Plugin defaults.

#include "booster/plugin_loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <elf.h>
#include <link.h>
#include <torch/version.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "booster/config.h"
#include "booster/dist/process_group.h"
#include "common/test_util.h"
#include "common/tensor_test_util.h"

namespace fs = std::filesystem;
using booster::Config;
using booster::ConfigError;
using booster::Plugin;
using booster::PluginContext;
using booster::PluginError;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

using booster::testing::ScopedEnv;

namespace {

using booster::testing::world_of_one;

const std::string kTestPluginDir = BOOSTER_TEST_PLUGIN_DIR;

std::string test_plugin(const std::string& name) { return kTestPluginDir + "/booster_plugin_" + name + ".so"; }


// A single-process world (in-process store, no port, no global launch).
PluginContext context(const std::string& name, const std::string& plugin_toml = "") {
  PluginContext ctx;
  ctx.name = name;
  ctx.options = Config::from_string("[plugin]\n" + plugin_toml, "test.toml").section("plugin");
  ctx.world = world_of_one();
  return ctx;
}

std::string exe_dir() { return fs::canonical("/proc/self/exe").parent_path().string(); }

// The directory libbooster.so was loaded from (symlinks resolved), from the dynamic linker's list.
std::string libbooster_dir() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        std::string name = info->dlpi_name ? info->dlpi_name : "";
        if (fs::path(name).filename().string().rfind("libbooster.so", 0) != 0) return 0;
        *static_cast<std::string*>(out) = fs::canonical(name).parent_path().string();
        return 1;
      },
      &found);
  return found;
}

std::vector<std::string> names_of(const std::vector<booster::PluginLibraryInfo>& infos) {
  std::vector<std::string> names;
  for (const auto& i : infos) names.push_back(i.name);
  return names;
}

}  // namespace

// ---- search

TEST(PluginLoader, SearchDirsOrder) {
  ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", "/opt/a::/opt/b");  // the empty entry is skipped
  auto dirs = booster::plugin_search_dirs();
  ASSERT_EQ(dirs.size(), 5u);
  EXPECT_EQ(dirs[0], "/opt/a");
  EXPECT_EQ(dirs[1], "/opt/b");
  // The install's plugin dir: next to libbooster.so, wherever that was loaded from.
  EXPECT_THAT(dirs[2], ::testing::EndsWith("/lib/booster/plugins"));
  ASSERT_FALSE(libbooster_dir().empty());
  EXPECT_EQ(fs::path(dirs[2]), fs::path(libbooster_dir()) / "booster" / "plugins");
  EXPECT_EQ(fs::path(dirs[3]), fs::path(exe_dir()));
  EXPECT_EQ(fs::path(dirs[4]), fs::path(exe_dir()) / "plugins");

  env.unset("BOOSTER_PLUGIN_PATH");
  auto defaults = booster::plugin_search_dirs();
  ASSERT_EQ(defaults.size(), 3u);
  EXPECT_EQ(defaults[0], dirs[2]);
  EXPECT_EQ(defaults[1], dirs[3]);
  EXPECT_EQ(defaults[2], dirs[4]);
}

TEST(PluginLoader, FindPluginFilesInSearchOrderFirstOccurrenceWins) {
  booster::testing::TempDir first;
  // Only booster_plugin_<name>.so counts; the file contents do not matter for the listing.
  for (const char* f : {"booster_plugin_zeta.so", "booster_plugin_test_minimal.so", "booster_plugin_.so",
                        "libbooster_plugin_x.so", "booster_plugin_y.so.1", "booster_plugin_z.txt", "README"})
    booster::testing::write_file(first.file(f), "not a library");
  ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", first.path() + ":/nonexistent/dir:" + kTestPluginDir);

  auto found = booster::find_plugin_files();
  auto names = names_of(found);
  ASSERT_GE(found.size(), 6u);
  // Each directory sorted by file name; the first directory's test_minimal shadows the real one.
  EXPECT_THAT(std::vector<std::string>(names.begin(), names.begin() + 6),
              ElementsAre("test_minimal", "zeta", "test_bad_abi", "test_misnamed", "test_no_descriptor",
                          "test_wrong_torch"));
  EXPECT_EQ(fs::path(found[0].path), fs::path(first.file("booster_plugin_test_minimal.so")));
  EXPECT_EQ(fs::path(found[2].path), fs::path(test_plugin("test_bad_abi")));
  EXPECT_TRUE(fs::path(found[0].path).is_absolute());
  EXPECT_EQ(found[0].version, "");  // the listing does not open libraries
  // No name twice, and the real plugin in <exe dir>/plugins is found after the configured dirs.
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  EXPECT_THAT(names, ::testing::Contains("torch_ddp"));
  EXPECT_THAT(names, Not(::testing::Contains("")));
}

// ---- loading

TEST(PluginLoader, LoadsByExplicitPath) {
  ScopedEnv env;
  env.unset("BOOSTER_PLUGIN_PATH");
  auto plugin = booster::load_plugin(context("test_minimal", "scale = 2.5\n"), test_plugin("test_minimal"));
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->name(), "test_minimal");
  EXPECT_EQ(plugin->world(), world_of_one());
  const booster::PluginTraits traits = plugin->traits();
  EXPECT_THAT(traits.precisions, ElementsAre("fp32"));
  EXPECT_THAT(traits.devices, ElementsAre("cpu"));
  EXPECT_FALSE(traits.controls_precision);
  EXPECT_FALSE(traits.supports_no_sync);
  EXPECT_EQ(traits.default_malloc, "cache");
  EXPECT_EQ(plugin->checkpoint_io(), nullptr);  // the Booster's own checkpoint IO
}

TEST(PluginLoader, LoadsByNameThroughBoosterPluginPath) {
  ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", "/nonexistent/dir:" + kTestPluginDir);
  auto plugin = booster::load_plugin(context("test_minimal"));
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->name(), "test_minimal");
  // `path` is a known key of every plugin's table (the plugin marks it).
  auto with_path = booster::load_plugin(context("test_minimal", "path = \"" + test_plugin("test_minimal") + "\"\n"));
  EXPECT_EQ(with_path->name(), "test_minimal");
}

TEST(PluginLoader, MissingLibraryPath) {
  const std::string path = "/nonexistent/dir/booster_plugin_test_minimal.so";
  EXPECT_THAT([&] { booster::load_plugin(context("test_minimal"), path); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr(path), HasSubstr("does not exist"))));
}

TEST(PluginLoader, UnknownNameListsDirsAndPluginsFound) {
  ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", kTestPluginDir);
  EXPECT_THAT([&] { booster::load_plugin(context("no_such_plugin")); },
              ThrowsMessage<PluginError>(AllOf(
                  HasSubstr("plugin 'no_such_plugin' not found"), HasSubstr("booster_plugin_no_such_plugin.so"),
                  HasSubstr(kTestPluginDir), HasSubstr(exe_dir()), HasSubstr("Plugins found: "),
                  HasSubstr("test_minimal (" + test_plugin("test_minimal") + ")"), HasSubstr("torch_ddp"),
                  HasSubstr("[plugin] path"), HasSubstr("BOOSTER_PLUGIN_PATH"))));
}

TEST(PluginLoader, NotABoosterPlugin) {
  const std::string path = test_plugin("test_no_descriptor");
  EXPECT_THAT([&] { booster::load_plugin(context("test_no_descriptor"), path); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr(path), HasSubstr("is not a Booster plugin"),
                                               HasSubstr("booster_plugin_descriptor"),
                                               HasSubstr("BOOSTER_PLUGIN(name, version, Class)"))));
  EXPECT_THAT([&] { booster::inspect_plugin(path); },
              ThrowsMessage<PluginError>(HasSubstr("is not a Booster plugin")));
}

TEST(PluginLoader, NotALibrary) {
  booster::testing::TempDir dir;
  const std::string path = dir.file("booster_plugin_garbage.so");
  booster::testing::write_file(path, "this is not an ELF file");
  EXPECT_THAT([&] { booster::load_plugin(context("garbage"), path); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr("cannot load plugin library " + path),
                                               HasSubstr("is it built for this machine"))));
}

// A truncated copy of a real plugin (an interrupted copy) is refused before dlopen, which would
// otherwise die of SIGBUS touching the missing pages; so are ELF files of another kind.
TEST(PluginLoader, TruncatedOrForeignElfIsAClearError) {
  booster::testing::TempDir dir;
  const std::string whole = booster::testing::read_file(test_plugin("test_no_descriptor"));
  ASSERT_GT(whole.size(), 4096u);
  for (size_t keep : {whole.size() / 2, whole.size() - 1, size_t{100}}) {
    const std::string path = dir.file("booster_plugin_cut" + std::to_string(keep) + ".so");
    booster::testing::write_file(path, whole.substr(0, keep));
    EXPECT_THAT([&] { booster::load_plugin(context("cut"), path); },
                ThrowsMessage<PluginError>(AllOf(HasSubstr(path), HasSubstr("truncated"),
                                                 HasSubstr("has " + std::to_string(keep) + " bytes"))))
        << keep << " of " << whole.size() << " bytes";
  }
  std::string foreign = whole;
  foreign[EI_CLASS] = ELFCLASS32;
  const std::string path = dir.file("booster_plugin_foreign.so");
  booster::testing::write_file(path, foreign);
  EXPECT_THAT([&] { booster::load_plugin(context("foreign"), path); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr(path), HasSubstr("another machine"))));
}

TEST(PluginLoader, APluginOfThePreviousAbiIsToldToPort) {
  const std::string path = kTestPluginDir + "_old_abi/booster_plugin_test_old_abi.so";
  const uint32_t previous = booster::BOOSTER_PLUGIN_ABI_VERSION - 1;
  EXPECT_THAT([&] { booster::load_plugin(context("test_old_abi"), path); },
              ThrowsMessage<PluginError>(AllOf(
                  HasSubstr("plugin 'test_old_abi'"), HasSubstr("plugin ABI version " + std::to_string(previous)),
                  HasSubstr("this Booster has ABI version " + std::to_string(booster::BOOSTER_PLUGIN_ABI_VERSION)),
                  HasSubstr("Porting a plugin built against another Booster"))));
}

TEST(PluginLoader, AbiMismatchNamesBothVersions) {
  ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", kTestPluginDir);
  const auto expected = ThrowsMessage<PluginError>(
      AllOf(HasSubstr("plugin 'test_bad_abi'"), HasSubstr("plugin ABI version 999"),
            HasSubstr("this Booster has ABI version " + std::to_string(booster::BOOSTER_PLUGIN_ABI_VERSION)),
            HasSubstr("rebuild the plugin against this Booster")));
  EXPECT_EQ(booster::BOOSTER_PLUGIN_ABI_VERSION, 18u);
  EXPECT_THAT([&] { booster::load_plugin(context("test_bad_abi")); }, expected);
  EXPECT_THAT([&] { booster::load_plugin(context("test_bad_abi"), test_plugin("test_bad_abi")); }, expected);
}

TEST(PluginLoader, WrongLibTorchNamesBothVersions) {
  const std::string ours = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  EXPECT_EQ(ours, "2.11");
  EXPECT_THAT([&] { booster::load_plugin(context("test_wrong_torch"), test_plugin("test_wrong_torch")); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr("plugin 'test_wrong_torch'"),
                                               HasSubstr("built with LibTorch 0.9"),
                                               HasSubstr("this Booster uses LibTorch " + ours),
                                               HasSubstr("rebuild the plugin with the same LibTorch"))));
}

TEST(PluginLoader, MisnamedFileWhenLoadedByName) {
  ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", kTestPluginDir);
  EXPECT_THAT([&] { booster::load_plugin(context("test_misnamed")); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr(test_plugin("test_misnamed")),
                                               HasSubstr("is named 'test_minimal' in its descriptor, not "
                                                         "'test_misnamed'"),
                                               HasSubstr("rename the file or fix BOOSTER_PLUGIN(...)"))));
  // An explicit path is taken as the user's choice: the descriptor name is not compared.
  auto plugin = booster::load_plugin(context("test_misnamed"), test_plugin("test_misnamed"));
  EXPECT_EQ(plugin->name(), "test_misnamed");
}

TEST(PluginLoader, InspectPluginReturnsDescriptorInfo) {
  auto info = booster::inspect_plugin(test_plugin("test_minimal"));
  EXPECT_EQ(info.name, "test_minimal");
  EXPECT_EQ(info.version, "1.2.3");
  EXPECT_EQ(fs::path(info.path), fs::path(test_plugin("test_minimal")));
  // The descriptor's name, not the file's.
  EXPECT_EQ(booster::inspect_plugin(test_plugin("test_misnamed")).name, "test_minimal");
  // Inspection does not check the descriptor (the CLI shows what a foreign plugin is).
  auto bad = booster::inspect_plugin(test_plugin("test_bad_abi"));
  EXPECT_EQ(bad.name, "test_bad_abi");
  EXPECT_EQ(bad.version, "0");
  EXPECT_THAT([] { booster::inspect_plugin("/nonexistent/booster_plugin_x.so"); },
              ThrowsMessage<PluginError>(HasSubstr("does not exist")));
}

// ---- plugin options

TEST(PluginLoader, UnknownOptionSuggestsClosestKey) {
  EXPECT_THAT([&] { booster::load_plugin(context("test_minimal", "scal = 2\n"), test_plugin("test_minimal")); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:2:1"), HasSubstr("unknown key plugin.scal"),
                                               HasSubstr("did you mean 'scale'"))));
}

TEST(PluginLoader, OptionOutOfRangeOrWrongType) {
  EXPECT_THAT([&] { booster::load_plugin(context("test_minimal", "scale = 11\n"), test_plugin("test_minimal")); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:2"),
                                               HasSubstr("plugin.scale = 11.0 is out of range [0.0, "),
                                               HasSubstr("leave it out for the default (1.0)"))));
  EXPECT_THAT([&] { booster::load_plugin(context("test_minimal", "scale = \"x\"\n"), test_plugin("test_minimal")); },
              ThrowsMessage<ConfigError>(HasSubstr("plugin.scale must be a number, got string \"x\"")));
  // The boundary is inclusive.
  EXPECT_NO_THROW(booster::load_plugin(context("test_minimal", "scale = 10\n"), test_plugin("test_minimal")));
}

// ---- Plugin defaults

TEST(PluginLoader, DefaultOperationsThrowDoesNotSupport) {
  auto plugin = booster::load_plugin(context("test_minimal"), test_plugin("test_minimal"));
  auto model = std::make_shared<torch::nn::Module>();
  booster::Configured c = plugin->configure(model, nullptr);
  ASSERT_NE(c.hooks, nullptr);
  EXPECT_EQ(&c.hooks->module(), model.get());
  EXPECT_EQ(c.optimizer, nullptr);
  EXPECT_TRUE(c.hooks->stats().empty());
  EXPECT_THAT([&] { plugin->no_sync(*c.hooks, nullptr); },
              ThrowsMessage<PluginError>(HasSubstr("plugin test_minimal does not support no_sync")));
}

TEST(PluginLoader, PluginNeedsAProcessGroup) {
  PluginContext ctx = context("test_minimal");
  ctx.world = nullptr;
  EXPECT_THAT([&] { booster::load_plugin(ctx, test_plugin("test_minimal")); },
              ThrowsMessage<PluginError>(HasSubstr("plugin test_minimal was created without a process group")));
}

TEST(PluginLoader, ScopeGuardRunsOnce) {
  int calls = 0;
  {
    booster::ScopeGuard g([&] { ++calls; });
    booster::ScopeGuard moved(std::move(g));
    EXPECT_EQ(calls, 0);
  }
  EXPECT_EQ(calls, 1);
  booster::ScopeGuard g([&] { ++calls; });
  g.release();
  EXPECT_EQ(calls, 2);
  g.release();
  EXPECT_EQ(calls, 2);
  booster::ScopeGuard a([&] { calls += 10; });
  a = booster::ScopeGuard([&] { calls += 100; });  // the replaced guard runs its action
  EXPECT_EQ(calls, 12);
  a.release();
  EXPECT_EQ(calls, 112);
}
