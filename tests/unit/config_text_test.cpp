// config_text_test.cpp — the config module's text helpers (booster/src/config_text.h, compiled into
// this test binary): quoting, key paths, exact float text, value descriptions for messages.
#include "config_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace {

using namespace booster::config_text;

TEST(ConfigText, QuoteAndKeys) {
  EXPECT_EQ(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(quote("tab\there\nline"), "\"tab\\there\\nline\"");
  EXPECT_EQ(quote(std::string("\x01", 1)), "\"\\u0001\"");
  EXPECT_TRUE(is_bare_key("bucket_cap_mb"));
  EXPECT_TRUE(is_bare_key("a-b9"));
  EXPECT_FALSE(is_bare_key(""));
  EXPECT_FALSE(is_bare_key("a.b"));
  EXPECT_FALSE(is_bare_key("with space"));
  EXPECT_EQ(display_key("stage"), "stage");
  EXPECT_EQ(display_key("my key"), "\"my key\"");
  EXPECT_EQ(join_path({"plugin", "extra", "my key"}), "plugin.extra.\"my key\"");
  EXPECT_EQ(join_path({}), "");
  EXPECT_EQ(split_dotted(" plugin . bucket_cap_mb"), (std::vector<std::string>{"plugin", "bucket_cap_mb"}));
  EXPECT_EQ(split_dotted("a..b"), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_TRUE(split_dotted("").empty());
  EXPECT_EQ(trim(" \t x y \r\n"), "x y");
  EXPECT_EQ(table_label(""), "the top level");
  EXPECT_EQ(table_label("plugin"), "[plugin]");
  EXPECT_EQ(join_list({"a", "b", "c"}, ", "), "a, b, c");
}

TEST(ConfigText, FormatDoubleIsShortestExactAndLooksLikeAFloat) {
  EXPECT_EQ(format_double(4), "4.0");
  EXPECT_EQ(format_double(-10), "-10.0");
  EXPECT_EQ(format_double(0.1), "0.1");
  EXPECT_EQ(format_double(1e-7), "1e-07");
  EXPECT_EQ(format_double(1e300), "1e+300");
  EXPECT_EQ(format_double(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(format_double(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(format_double(std::nan("")), "nan");
  for (double v : {1.0 / 3, 2.0 / 3e10, 123456.789, 5e-324}) {
    const std::string s = format_double(v);
    EXPECT_EQ(std::strtod(s.c_str(), nullptr), v) << s;  // reads back exactly
  }
}

TEST(ConfigText, DescribeNamesTypeAndValue) {
  const toml::table t = toml::parse(R"(s = "x"
i = 4
f = 4.0
b = true
a = [1, 2]
d = 1979-05-27
[sub]
k = 1
)");
  EXPECT_EQ(describe(*t.get("s")), "string \"x\"");
  EXPECT_EQ(describe(*t.get("i")), "integer 4");
  EXPECT_EQ(describe(*t.get("f")), "float 4.0");
  EXPECT_EQ(describe(*t.get("b")), "boolean true");
  EXPECT_EQ(describe(*t.get("a")), "array [ 1, 2 ]");
  EXPECT_EQ(describe(*t.get("d")), "date 1979-05-27");
  EXPECT_EQ(describe(*t.get("sub")), "table");
  EXPECT_EQ(type_name(*t.get("f")), "float");
}

}  // namespace
