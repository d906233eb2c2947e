// config_text.cpp — text helpers of the config module (see config_text.h).
#include "config_text.h"

#include "number_text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace booster::config_text {

std::string trim(std::string_view s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

bool is_bare_key(const std::string& k) {
  if (k.empty()) return false;
  return std::all_of(k.begin(), k.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// A string as a double-quoted TOML/JSON-style literal: "a\"b".
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// One key as it would be written in TOML (quoted unless it is a bare key).
std::string display_key(const std::string& k) { return is_bare_key(k) ? k : quote(k); }

// "plugin.extra.key"; the root is "".
std::string join_path(const std::vector<std::string>& path) {
  std::string out;
  for (const auto& k : path) {
    if (!out.empty()) out += '.';
    out += display_key(k);
  }
  return out;
}

std::vector<std::string> split_dotted(const std::string& s) {
  std::vector<std::string> parts;
  if (s.empty()) return parts;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    parts.push_back(
        trim(std::string_view(s).substr(start, dot == std::string::npos ? std::string::npos : dot - start)));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

// "[plugin]" for a section, "the top level" for the root.
std::string table_label(const std::string& name) { return name.empty() ? "the top level" : "[" + name + "]"; }

// Shortest decimal text that reads back as the same double; always looks like a float ("4.0").
std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {  // whole numbers: "10.0", not "1e+01"
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
  }
  std::string s = text::shortest_double(v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string join_list(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    default:
      return "nothing";
  }
}

// "string \"x\"", "integer 4", "float 4.0", "array [ 1, 2 ]", "table".
std::string describe(const toml::node& n) {
  std::string text;
  if (auto* s = n.as_string()) {
    text = quote(s->get());
  } else if (auto* i = n.as_integer()) {
    text = std::to_string(i->get());
  } else if (auto* f = n.as_floating_point()) {
    text = format_double(f->get());
  } else if (auto* b = n.as_boolean()) {
    text = b->get() ? "true" : "false";
  } else if (!n.is_table()) {
    std::ostringstream os;
    n.visit([&os](const auto& v) { os << v; });
    text = os.str();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
  }
  return text.empty() ? type_name(n) : type_name(n) + " " + text;
}

}  // namespace booster::config_text
