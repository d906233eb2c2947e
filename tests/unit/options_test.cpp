// options_test.cpp — booster::Options, the typed view of a config section (options.cpp): getters,
// defaults, types and ranges, choices, unknown keys with hints, nested tables, shared read records,
// and Options::where for callers' own errors.
#include "booster/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/config_fixtures.h"

using booster::Config;
using booster::ConfigError;
using booster::Options;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using namespace booster::testing::config_fixtures;

TEST(Options, GettersReturnValuesAndDefaults) {
  Config c = Config::from_string(kDdp, "configs/ddp.toml");
  EXPECT_EQ(c.source(), "configs/ddp.toml");
  Options p = c.section("plugin");
  EXPECT_EQ(p.section(), "plugin");
  EXPECT_TRUE(p.has("bucket_cap_mb"));
  EXPECT_FALSE(p.has("stage"));
  EXPECT_EQ(p.get_int("bucket_cap_mb", 7, 0), 25);
  EXPECT_TRUE(p.get_bool("broadcast_buffers", false));
  EXPECT_DOUBLE_EQ(p.get_double("max_norm", 0.0), 1.5);
  EXPECT_DOUBLE_EQ(p.get_double("bucket_cap_mb", 0.0), 25.0);  // an integer is accepted as a float
  EXPECT_EQ(p.get_choice("placement_policy", "auto", {"static", "auto"}), "static");
  EXPECT_EQ(c.section("booster").get_string("plugin", ""), "torch_ddp");
  // Absent keys and sections give the defaults.
  EXPECT_EQ(p.get_int("stage", 2), 2);
  EXPECT_FALSE(p.get_bool("offload", false));
  EXPECT_DOUBLE_EQ(p.get_double("initial_scale", 65536.0), 65536.0);
  EXPECT_EQ(p.get_string("name", "dflt"), "dflt");
  EXPECT_EQ(p.get_choice("policy", "auto", {"static", "auto"}), "auto");
  EXPECT_EQ(c.section("checkpoint").get_int("size_per_shard", 1024), 1024);
  EXPECT_EQ(p.table("extra").get_int("k", 0), 1);
  EXPECT_EQ(p.table("missing").get_int("k", 9), 9);
}

TEST(Options, WrongTypeNamesKeyLocationAndValue) {
  Config c = Config::from_string(
      "[plugin]\n"
      "stage = 2\n"
      "\n"
      "bucket_cap_mb = \"x\"\n"
      "overlap = 4.0\n"
      "offload = \"yes\"\n"
      "name = 3\n"
      "extra = 1\n"
      "ratio = [1, 2]\n",
      "configs/ddp.toml");
  Options p = c.section("plugin");
  EXPECT_EQ(error_of([&] { p.get_int("bucket_cap_mb", 25); }),
            "configs/ddp.toml:4:17: plugin.bucket_cap_mb must be an integer, got string \"x\"");
  EXPECT_EQ(error_of([&] { p.get_int("overlap", 1); }),
            "configs/ddp.toml:5:11: plugin.overlap must be an integer, got float 4.0 (write 4, not 4.0)");
  EXPECT_EQ(error_of([&] { p.get_bool("offload", false); }),
            "configs/ddp.toml:6:11: plugin.offload must be a boolean (true or false), got string \"yes\"");
  EXPECT_EQ(error_of([&] { p.get_string("name", ""); }),
            "configs/ddp.toml:7:8: plugin.name must be a string, got integer 3");
  EXPECT_EQ(error_of([&] { p.table("extra"); }),
            "configs/ddp.toml:8:9: plugin.extra must be a table, got integer 1");
  EXPECT_THAT(error_of([&] { p.get_double("ratio", 1.0); }),
              HasSubstr("plugin.ratio must be a number, got array [ 1, 2 ]"));
  EXPECT_THAT(error_of([&] { p.get_double("bucket_cap_mb", 1.0); }), HasSubstr("got string \"x\""));
}

TEST(Options, SectionThatIsNotATable) {
  Config c = Config::from_string("plugin = 3\n", "c.toml");
  EXPECT_EQ(error_of([&] { c.section("plugin"); }),
            "c.toml:1:10: plugin must be a table ([plugin]), got integer 3");
}

TEST(Options, OutOfRangeInteger) {
  Config c = Config::from_string("[plugin]\nbucket_cap_mb = -1\nstage = 4\n", "configs/ddp.toml");
  Options p = c.section("plugin");
  const std::string msg = error_of([&] { p.get_int("bucket_cap_mb", 25, 0); });
  EXPECT_THAT(msg, StartsWith("configs/ddp.toml:2:17: plugin.bucket_cap_mb = -1 is out of range "
                              "[0, 9223372036854775807]"));
  EXPECT_THAT(msg, HasSubstr("default (25)"));
  EXPECT_THAT(error_of([&] { p.get_int("stage", 0, 0, 3); }),
              StartsWith("configs/ddp.toml:3:9: plugin.stage = 4 is out of range [0, 3]"));
  EXPECT_EQ(p.get_int("stage", 0, 4, 4), 4);  // bounds are inclusive
}

TEST(Options, OutOfRangeDouble) {
  Config c = Config::from_string("[train]\nlr = 1.5\nwd = -0.1\nbad = nan\nwhole = 3\n", "t.toml");
  Options t = c.section("train");
  const std::string msg = error_of([&] { t.get_double("lr", 0.1, 0.0, 1.0); });
  EXPECT_THAT(msg, StartsWith("t.toml:2:6: train.lr = 1.5 is out of range [0.0, 1.0]"));
  EXPECT_THAT(msg, HasSubstr("default (0.1)"));
  EXPECT_THAT(error_of([&] { t.get_double("wd", 0.0, 0.0); }),
              StartsWith("t.toml:3:6: train.wd = -0.1 is out of range [0.0, 1e+308]"));
  EXPECT_THAT(error_of([&] { t.get_double("bad", 0.0); }), HasSubstr("train.bad = nan is out of range"));
  EXPECT_THAT(error_of([&] { t.get_double("whole", 0.0, 0.0, 2.5); }),
              HasSubstr("train.whole = 3.0 is out of range [0.0, 2.5]"));
  EXPECT_DOUBLE_EQ(t.get_double("lr", 0.1, 1.5, 1.5), 1.5);
}

TEST(Options, GetChoiceListsChoices) {
  Config c = Config::from_string("[plugin]\nplacement_policy = \"statik\"\nprecision = 16\n", "g.toml");
  Options p = c.section("plugin");
  EXPECT_EQ(error_of([&] {
              p.get_choice("placement_policy", "static", {"static", "auto"});
            }),
            "g.toml:2:20: plugin.placement_policy = \"statik\" is not one of \"static\", \"auto\" "
            "(did you mean \"static\"?)");
  const std::string far = error_of([&] { p.get_choice("placement_policy", "a", {"alpha", "beta"}); });
  EXPECT_THAT(far, HasSubstr("is not one of \"alpha\", \"beta\""));
  EXPECT_THAT(far, Not(HasSubstr("did you mean")));
  EXPECT_EQ(error_of([&] {
              p.get_choice("precision", "fp16", {"fp16", "bf16", "fp32"});
            }),
            "g.toml:3:13: plugin.precision must be one of \"fp16\", \"bf16\", \"fp32\", got integer 16");
}

// ---- unknown keys and sections

TEST(Options, UnknownKeyWithDidYouMean) {
  Config c = Config::from_string(
      "[plugin]\n"
      "stage = 2\n"
      "bucket_cap_m = 25\n"
      "zzz = 1\n",
      "configs/ddp.toml");
  Options p = c.section("plugin");
  EXPECT_EQ(p.get_int("stage", 0), 2);
  EXPECT_EQ(p.get_int("bucket_cap_mb", 25), 25);  // absent: the typo holds the value
  const std::string msg = error_of([&] { p.check_unknown(); });
  EXPECT_THAT(msg, HasSubstr("2 unknown keys in [plugin]:"));
  EXPECT_THAT(msg, HasSubstr("configs/ddp.toml:3:1: plugin.bucket_cap_m (did you mean 'bucket_cap_mb'?)"));
  EXPECT_THAT(msg, HasSubstr("configs/ddp.toml:4:1: plugin.zzz"));
  EXPECT_THAT(msg, HasSubstr("known keys in [plugin]: bucket_cap_mb, stage"));
  EXPECT_LT(msg.find("bucket_cap_m "), msg.find("zzz"));  // file order

  Config one = Config::from_string("[plugin]\nstagee = 2\n", "one.toml");
  Options q = one.section("plugin");
  q.get_int("stage", 0);
  EXPECT_EQ(error_of([&] { q.check_unknown(); }),
            "one.toml:2:1: unknown key plugin.stagee (did you mean 'stage'?)");
}

TEST(Options, CheckUnknownPassesWhenEverythingIsReadOrKnown) {
  Config c = Config::from_string(kDdp, "configs/ddp.toml");
  Options p = c.section("plugin");
  p.get_int("bucket_cap_mb", 25);
  p.get_bool("broadcast_buffers", true);
  EXPECT_THROW(p.check_unknown(), ConfigError);
  p.mark_known({"max_norm", "placement_policy", "extra"});
  EXPECT_NO_THROW(p.check_unknown());
}

TEST(Options, NestedTableCountsAsKnownInParent) {
  Config c = Config::from_string("[plugin]\nstage = 1\n[plugin.extra]\nk = 1\nkk = 2\n", "n.toml");
  Options p = c.section("plugin");
  p.get_int("stage", 0);
  Options extra = p.table("extra");
  EXPECT_EQ(extra.section(), "plugin.extra");
  extra.get_int("k", 0);
  // "extra" is known in [plugin]; the unread key inside it is reported with its full name.
  const std::string msg = error_of([&] { p.check_unknown(); });
  EXPECT_EQ(msg, "n.toml:5:1: unknown key plugin.extra.kk (did you mean 'k'?)");
  EXPECT_EQ(error_of([&] { extra.check_unknown(); }), msg);
  extra.get_int("kk", 0);
  EXPECT_NO_THROW(p.check_unknown());
  EXPECT_NO_THROW(c.section("plugin.extra").check_unknown());
}

TEST(Options, ViewsOfOneSectionShareTheirReadRecord) {
  Config c = Config::from_string("[plugin]\na = 1\nb = 2\nc = 3\n", "s.toml");
  Options v1 = c.section("plugin");
  Options v2 = c.section("plugin");
  EXPECT_EQ(v1.get_int("a", 0), 1);
  EXPECT_EQ(v2.get_int("b", 0), 2);
  // Reads through both views are known to each.
  EXPECT_EQ(error_of([&] { v1.check_unknown(); }),
            "s.toml:4:1: unknown key plugin.c\n  known keys in [plugin]: a, b");
  EXPECT_EQ(error_of([&] { v2.check_unknown(); }), error_of([&] { v1.check_unknown(); }));
  Config copy = c;  // copies share the record too
  copy.section("plugin").mark_known({"c"});
  EXPECT_NO_THROW(v1.check_unknown());
  EXPECT_NO_THROW(v2.check_unknown());
  Options v3 = v2;
  EXPECT_NO_THROW(v3.check_unknown());
  // Another section's record is separate.
  Config d = Config::from_string("[plugin]\na = 1\n[train]\na = 1\n", "d.toml");
  d.section("plugin").get_int("a", 0);
  EXPECT_NO_THROW(d.section("plugin").check_unknown());
  EXPECT_THROW(d.section("train").check_unknown(), ConfigError);
}

TEST(Options, EmptyOptionsAndEmptyConfig) {
  Options o("plugin");
  EXPECT_EQ(o.section(), "plugin");
  EXPECT_FALSE(o.has("x"));
  EXPECT_EQ(o.get_int("x", 3), 3);
  EXPECT_TRUE(o.get_bool("y", true));
  EXPECT_DOUBLE_EQ(o.get_double("z", 0.5), 0.5);
  EXPECT_EQ(o.get_string("s", "d"), "d");
  EXPECT_EQ(o.get_choice("c", "a", {"a", "b"}), "a");
  EXPECT_EQ(o.table("t").get_int("k", 4), 4);
  EXPECT_NO_THROW(o.check_unknown());

  Config c;
  EXPECT_EQ(c.source(), "");
  EXPECT_EQ(c.section("plugin").get_int("stage", 2), 2);
  EXPECT_NO_THROW(c.section("plugin").check_unknown());
  EXPECT_NO_THROW(c.check_sections({}));
  EXPECT_EQ(c.to_toml(), "");
}

TEST(Options, WhereNamesTheFileLocationOrTheOverride) {
  Config c = Config::from_string("[distributed]\nbackend = \"nccl\"\n", "w.toml");
  EXPECT_EQ(c.section("distributed").where("backend"), "w.toml:2:11");
  c.apply_override("distributed.port=1234");
  EXPECT_EQ(c.section("distributed").where("port"), "--set distributed.port");
  EXPECT_EQ(c.section("distributed").where("absent"), "distributed.absent");
}
