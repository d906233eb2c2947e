// config_text.h — text helpers of the config module (private to libbooster): TOML-style quoting
// and key paths, float formatting that reads back exactly, and descriptions of TOML values for
// error messages. Used by config.cpp and options.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

namespace booster::config_text {

// `s` without leading and trailing blanks (space, tab, CR, LF).
std::string trim(std::string_view s);
// True for a TOML bare key: non-empty, only A-Z a-z 0-9 _ -.
bool is_bare_key(const std::string& k);
// A string as a double-quoted TOML/JSON-style literal: "a\"b"; control characters escaped.
std::string quote(std::string_view s);
// One key as it would be written in TOML (quoted unless it is a bare key).
std::string display_key(const std::string& k);
// "plugin.extra.key" (each key through display_key); the root (empty path) is "".
std::string join_path(const std::vector<std::string>& path);
// "a . b.c" -> {"a", "b", "c"} (parts trimmed); "" -> {}.
std::vector<std::string> split_dotted(const std::string& s);
// "[plugin]" for a section, "the top level" for the root ("").
std::string table_label(const std::string& name);
// Shortest decimal text that reads back as the same double; always looks like a float ("4.0",
// "0.1", "1e-07"); "nan", "inf", "-inf".
std::string format_double(double v);
// items joined by sep.
std::string join_list(const std::vector<std::string>& items, const std::string& sep);
// The TOML type of a node: "table", "array", "string", "integer", "float", "boolean", "date",
// "time", "date-time".
std::string type_name(const toml::node& n);
// "string \"x\"", "integer 4", "float 4.0", "array [ 1, 2 ]" (cut at 60 chars), "table".
std::string describe(const toml::node& n);

}  // namespace booster::config_text
