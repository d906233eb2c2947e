// config_test.cpp — booster::Config: parsing errors with file:line:column, unknown sections,
// --set overrides, to_toml / save round trips. The Options views are options_test.cpp.

#include "booster/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/config_fixtures.h"
#include "common/test_util.h"

using booster::Config;
using booster::ConfigError;
using booster::Options;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using namespace booster::testing::config_fixtures;

// ---- parsing

TEST(Config, SyntaxErrorReportsLineAndColumn) {
  const std::string text =
      "[plugin]\n"
      "stage = 2\n"
      "bucket_cap_mb = [1,\n"
      "  2 3]\n";
  const std::string msg = error_of([&] { Config::from_string(text, "configs/bad.toml"); });
  EXPECT_THAT(msg, StartsWith("configs/bad.toml:4:5: "));
  EXPECT_THAT(msg, HasSubstr("expected comma or closing ']'"));

  const std::string dup = error_of([] { Config::from_string("a = 1\nb = 2\n a = 3\n", "dup.toml"); });
  EXPECT_THAT(dup, StartsWith("dup.toml:3:"));
  EXPECT_THAT(dup, HasSubstr("cannot redefine existing integer 'a'"));

  const std::string unnamed = error_of([] { Config::from_string("x = \n"); });
  EXPECT_THAT(unnamed, StartsWith("<string>:1:"));
}

TEST(Config, UnreadableFile) {
  booster::testing::TempDir dir;
  const std::string missing = dir.file("nope.toml");
  EXPECT_EQ(error_of([&] { Config::from_file(missing); }),
            "cannot read config file " + missing + ": No such file or directory");
  EXPECT_THAT(error_of([&] { Config::from_file(dir.path()); }),
              StartsWith("cannot read config file " + dir.path() + ": "));
}

TEST(Config, FromFileUsesPathInMessagesAndSource) {
  booster::testing::TempDir dir;
  const std::string path = dir.file("ddp.toml");
  booster::testing::write_file(path, "[plugin]\nbucket_cap_mb = \"x\"\n");
  Config c = Config::from_file(path);
  EXPECT_EQ(c.source(), path);
  EXPECT_EQ(error_of([&] { c.section("plugin").get_int("bucket_cap_mb", 25); }),
            path + ":2:17: plugin.bucket_cap_mb must be an integer, got string \"x\"");

  booster::testing::write_file(path, "[plugin]\nstage = = 2\n");
  EXPECT_THAT(error_of([&] { Config::from_file(path); }), StartsWith(path + ":2:9: "));
}

// ---- typed getters

TEST(Config, CheckSections) {
  Config c = Config::from_string("[booster]\nplugin = \"x\"\n[plugin]\n[trian]\nepochs = 1\n", "c.toml");
  const std::vector<std::string> known = {"booster",    "plugin",      "mixed_precision",
                                          "checkpoint", "distributed", "train"};
  const std::string msg = error_of([&] { c.check_sections(known); });
  EXPECT_THAT(msg, StartsWith("c.toml:4:2: unknown section [trian] (did you mean [train]?)"));
  EXPECT_THAT(msg, HasSubstr("known sections: booster, plugin, mixed_precision"));
  EXPECT_NO_THROW(Config::from_string(kDdp).check_sections(known));

  Config two = Config::from_string("seed = 1\n[plugni]\n", "two.toml");
  const std::string m2 = error_of([&] { two.check_sections(known); });
  EXPECT_THAT(m2, HasSubstr("2 unknown sections:"));
  EXPECT_THAT(m2, HasSubstr("two.toml:1:1: unknown top-level key seed"));
  EXPECT_THAT(m2, HasSubstr("unknown section [plugni] (did you mean [plugin]?)"));
}

// ---- overrides

TEST(Config, OverrideExistingAndNewKeys) {
  Config c = Config::from_string(kDdp, "configs/ddp.toml");
  c.apply_override("plugin.bucket_cap_mb=4");
  c.apply_overrides({" plugin.stage = 2 ", "booster.plugin=gemini"});
  Options p = c.section("plugin");
  EXPECT_EQ(p.get_int("bucket_cap_mb", 25), 4);
  EXPECT_EQ(p.get_int("stage", 0), 2);
  EXPECT_EQ(c.section("booster").get_string("plugin", ""), "gemini");
  EXPECT_TRUE(p.get_bool("broadcast_buffers", false));  // untouched
  EXPECT_THAT(c.to_toml(), HasSubstr("bucket_cap_mb = 4"));
}

TEST(Config, ViewsSeeOverridesAppliedLater) {
  Config c = Config::from_string(kDdp, "configs/ddp.toml");
  Options p = c.section("plugin");
  Options mp = c.section("mixed_precision");
  c.apply_override("plugin.bucket_cap_mb=8");
  c.apply_override("mixed_precision.dtype=bf16");
  EXPECT_EQ(p.get_int("bucket_cap_mb", 25), 8);
  EXPECT_EQ(mp.get_string("dtype", "fp32"), "bf16");
}

TEST(Config, OverrideCreatesTables) {
  Config c = Config::from_string(kDdp, "configs/ddp.toml");
  c.apply_override("mixed_precision.fp16.initial_scale=65536");
  c.apply_override("plugin.extra.new_key=3");
  EXPECT_EQ(c.section("mixed_precision").table("fp16").get_int("initial_scale", 0), 65536);
  EXPECT_EQ(c.section("mixed_precision.fp16").get_int("initial_scale", 0), 65536);
  Options extra = c.section("plugin").table("extra");
  EXPECT_EQ(extra.get_int("k", 0), 1);
  EXPECT_EQ(extra.get_int("new_key", 0), 3);
  EXPECT_THAT(c.to_toml(), HasSubstr("[mixed_precision.fp16]"));

  Config empty;
  empty.apply_override("train.epochs=3");
  EXPECT_EQ(empty.section("train").get_int("epochs", 0), 3);
}

TEST(Config, OverrideThroughNonTableFails) {
  Config c = Config::from_string("[plugin]\nstage = 2\nsizes = [1, 2]\n", "configs/z.toml");
  EXPECT_EQ(error_of([&] { c.apply_override("plugin.stage.x=1"); }),
            "--set plugin.stage.x=1: plugin.stage is integer 2 (configs/z.toml:2:9), not a table, so it "
            "cannot hold key x");
  EXPECT_THAT(error_of([&] { c.apply_override("plugin.sizes.a.b=1"); }),
              HasSubstr("plugin.sizes is array [ 1, 2 ] (configs/z.toml:3:9), not a table"));
  EXPECT_THAT(error_of([&] { c.apply_override("plugin=3"); }),
              HasSubstr("--set plugin=3: plugin is a table; set its keys one at a time, e.g. --set "
                        "plugin.<key>=<value>"));
  // Nothing was changed by the failed overrides.
  EXPECT_EQ(c.section("plugin").get_int("stage", 0), 2);
}

TEST(Config, BadOverrideSyntax) {
  Config c;
  EXPECT_EQ(error_of([&] { c.apply_override("plugin.stage"); }),
            "--set plugin.stage: expected <section>.<key>=<value>, e.g. --set plugin.bucket_cap_mb=25");
  EXPECT_THAT(error_of([&] { c.apply_override(" =4"); }),
              AllOf(StartsWith("--set  =4: the key before '=' is empty"),
                    HasSubstr("e.g. --set plugin.bucket_cap_mb=25")));
  EXPECT_THAT(error_of([&] { c.apply_override("plugin..stage=4"); }),
              AllOf(HasSubstr("empty key part in \"plugin..stage\""), HasSubstr("e.g. --set")));
  EXPECT_THAT(error_of([&] { c.apply_override(".stage=4"); }), HasSubstr("empty key part"));
  // Option names are bare keys (found by the config fuzzer: such a key printed as TOML that did not
  // read back).
  EXPECT_THAT(error_of([&] { c.apply_override("#P plugin is x'_steps = 420"); }),
              AllOf(HasSubstr("key part \"#P plugin is x'_steps\" has the character \"#\""),
                    HasSubstr("option names are letters, digits, '_' and '-'")));
  EXPECT_THAT(error_of([&] { c.apply_override("plugin.bucket cap=4"); }), HasSubstr("has the character \" \""));
  c.apply_override("train.lr_scheduler.warmup-steps_2=4");  // letters, digits, '_' and '-' are fine
  EXPECT_EQ(Config::from_string(c.to_toml()).to_toml(), c.to_toml());
}

TEST(Config, OverrideValueTypes) {
  Config c;
  c.apply_overrides({"t.i=4", "t.neg=-7", "t.f=2.5", "t.b=true", "t.s=\"x y\"", "t.lit='a\"b'", "t.word=auto",
                     "t.words = hello world ", "t.arr=[1, 2, 3]", "t.eq=a=b",
                     "t.empty=", "t.path=/data/x.bin"});
  Options t = c.section("t");
  EXPECT_EQ(t.get_int("i", 0), 4);
  EXPECT_EQ(t.get_int("neg", 0), -7);
  EXPECT_DOUBLE_EQ(t.get_double("f", 0), 2.5);
  EXPECT_DOUBLE_EQ(t.get_double("i", 0), 4.0);
  EXPECT_TRUE(t.get_bool("b", false));
  EXPECT_EQ(t.get_string("s", ""), "x y");
  EXPECT_EQ(t.get_string("lit", ""), "a\"b");
  EXPECT_EQ(t.get_string("word", ""), "auto");
  EXPECT_EQ(t.get_string("words", ""), "hello world");
  EXPECT_EQ(t.get_string("eq", ""), "a=b");
  EXPECT_EQ(t.get_string("empty", "d"), "");
  EXPECT_EQ(t.get_string("path", ""), "/data/x.bin");
  EXPECT_THAT(c.to_toml(), HasSubstr("arr = [ 1, 2, 3 ]"));
  // A value that is several TOML lines is not TOML for an override: taken as text.
  c.apply_override("t.multi=1\nx = 2");
  EXPECT_EQ(t.get_string("multi", ""), "1\nx = 2");
  EXPECT_FALSE(t.has("x"));
}

TEST(Config, ErrorsInOverriddenValuesNameTheOverride) {
  Config c = Config::from_string(kDdp, "configs/ddp.toml");
  c.apply_overrides({"plugin.bucket_cap_mb=x", "plugin.stage=-1", "plugin.bucket_cap_m=3", "train.name=4",
                     "plugin.extra2.a.b=1"});
  Options p = c.section("plugin");
  EXPECT_EQ(error_of([&] { p.get_int("bucket_cap_mb", 25); }),
            "--set plugin.bucket_cap_mb: plugin.bucket_cap_mb must be an integer, got string \"x\"");
  EXPECT_THAT(error_of([&] { p.get_int("stage", 0, 0, 3); }),
              StartsWith("--set plugin.stage: plugin.stage = -1 is out of range [0, 3]"));
  EXPECT_THAT(error_of([&] { c.section("train").get_string("name", ""); }),
              AllOf(StartsWith("--set train.name: train.name must be a string, got integer 4"),
                    HasSubstr("quote it")));
  p.mark_known({"broadcast_buffers", "max_norm", "placement_policy", "extra"});
  const std::string msg = error_of([&] { p.check_unknown(); });
  EXPECT_THAT(msg,
              HasSubstr("--set plugin.bucket_cap_m: plugin.bucket_cap_m (did you mean 'bucket_cap_mb'?)"));
  EXPECT_THAT(msg, HasSubstr("--set plugin.extra2.a.b: plugin.extra2"));
}

// ---- output

TEST(Config, ToTomlRoundTrip) {
  Config c = Config::from_string(
      "title = \"run \\\"1\\\"\"\n"
      "[plugin]\n"
      "bucket_cap_mb = 25\n"
      "big = 9223372036854775807\n"
      "ratio = 0.1\n"
      "tiny = 1e-300\n"
      "on = false\n"
      "sizes = [1, 2, 3]\n"
      "[plugin.extra]\n"
      "name = \"multi\\nline\"\n",
      "rt.toml");
  c.apply_override("train.lr=3e-4");
  const std::string text = c.to_toml();
  Config back = Config::from_string(text, "back.toml");
  EXPECT_EQ(back.to_toml(), text);
  EXPECT_EQ(back.section("").get_string("title", ""), "run \"1\"");
  Options p = back.section("plugin");
  EXPECT_EQ(p.get_int("bucket_cap_mb", 0), 25);
  EXPECT_EQ(p.get_int("big", 0), INT64_MAX);
  EXPECT_EQ(p.get_double("ratio", 0), 0.1);  // exact: floats are written with full precision
  EXPECT_EQ(p.get_double("tiny", 0), 1e-300);
  EXPECT_FALSE(p.get_bool("on", true));
  EXPECT_EQ(p.table("extra").get_string("name", ""), "multi\nline");
  EXPECT_EQ(back.section("train").get_double("lr", 0), 3e-4);
  EXPECT_THAT(text, HasSubstr("\n[plugin.extra]\n"));  // sub-tables are not indented
}

// A key that toml++ would print so that it does not read back (a single quote or a control
// character: found by the config fuzzer) is refused when read, with its place; other quoted keys
// round-trip.
TEST(Config, KeysThatCannotBeWrittenBackAreClearErrors) {
  for (const std::string& text : {std::string("\"it's\" = 8\n"), std::string("[plugin]\nx = [{\"a\\tb\" = 1}]\n")}) {
    try {
      Config::from_string(text, "keys.toml");
      ADD_FAILURE() << "no error for " << text;
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr("keys.toml:")) << text;
      EXPECT_THAT(e.what(), HasSubstr("has a single quote or a control character")) << text;
    }
  }
  const Config c = Config::from_string("\"a b.c\" = 1\n[\"x\\\"y\"]\nz = 2\n", "quoted.toml");
  EXPECT_EQ(Config::from_string(c.to_toml(), "back.toml").to_toml(), c.to_toml());
  EXPECT_EQ(c.section("").get_int("a b.c", 0), 1);
}

TEST(Config, SaveWritesAFileReadableByFromFile) {
  booster::testing::TempDir dir;
  Config c = Config::from_string(kDdp, "configs/ddp.toml");
  c.apply_override("plugin.bucket_cap_mb=4");
  const std::string path = dir.file("out/run1/config.toml");  // parent directories are created
  c.save(path);
  Config back = Config::from_file(path);
  EXPECT_EQ(back.source(), path);
  EXPECT_EQ(back.section("plugin").get_int("bucket_cap_mb", 0), 4);
  EXPECT_EQ(back.section("booster").get_string("plugin", ""), "torch_ddp");
  EXPECT_EQ(booster::testing::read_file(path), c.to_toml());
  // Saving again replaces the file and leaves no temporary file behind.
  c.apply_override("plugin.bucket_cap_mb=5");
  c.save(path);
  EXPECT_EQ(Config::from_file(path).section("plugin").get_int("bucket_cap_mb", 0), 5);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("out/run1"))) {
    EXPECT_EQ(e.path().filename(), "config.toml");
    ++files;
  }
  EXPECT_EQ(files, 1);
  // A parent that is a file cannot be created.
  booster::testing::write_file(dir.file("blocker"), "x");
  EXPECT_THAT(error_of([&] { c.save(dir.file("blocker/config.toml")); }),
              StartsWith("cannot write config file " + dir.file("blocker/config.toml") + ": "));
}

TEST(Config, CloneIsDeepAndRemoveSectionDropsATable) {
  Config base = Config::from_string("[booster]\nplugin = \"auto\"\n[auto]\nmemory_budget_mb = 64\n", "c.toml");
  Config shared = base;  // the copy constructor shares the table
  Config deep = base.clone();
  deep.apply_override("booster.plugin=\"torch_ddp\"");
  deep.remove_section("auto");
  EXPECT_EQ(base.section("booster").get_string("plugin", ""), "auto");
  EXPECT_EQ(deep.section("booster").get_string("plugin", ""), "torch_ddp");
  EXPECT_TRUE(base.section("auto").has("memory_budget_mb"));
  EXPECT_FALSE(deep.section("auto").has("memory_budget_mb"));
  EXPECT_EQ(deep.to_toml().find("[auto]"), std::string::npos);
  deep.remove_section("absent");  // nothing to remove
  shared.apply_override("booster.plugin=\"gemini\"");
  EXPECT_EQ(base.section("booster").get_string("plugin", ""), "gemini");
  EXPECT_THROW(Config::from_string("x = 1\n").remove_section("x"), ConfigError);
}
