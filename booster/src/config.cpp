// config.cpp — booster::Config and booster::Options (see booster/config.h) on top of toml++.
//
// A Config owns one parsed toml::table, the name of its source, the set of dotted key paths that
// command-line overrides (--set) wrote, and one "read keys" record (section name -> keys read or
// marked known) shared by every Options view, so check_unknown() sees reads made through any view.
// Copies of a Config share all of this. Options views resolve their table from the root on every
// use, so they stay valid (and see the new values) when overrides are applied after they were made.
// Every error is a ConfigError that starts with where the value came from: "file:line:column" for
// values from the file, "--set a.b" for values an override wrote.

#include "booster/config.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include <toml++/toml.h>

namespace booster {

namespace {

// ---- small string helpers

// Largest edit distance for which a "did you mean" hint is given.
constexpr size_t kMaxHintDistance = 3;

const char* const kOverrideExample = "e.g. --set plugin.bucket_cap_mb=25";

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
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// The closest candidate within kMaxHintDistance of `word` ("" if none); ties go to the first. A
// candidate that shares nothing with the word ("c" for "a") is no hint.
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = kMaxHintDistance + 1;
  for (const auto& c : candidates) {
    if (c == word) continue;
    const size_t d = edit_distance(word, c);
    if (d < best_distance && d < std::max(word.size(), c.size())) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

std::string join_list(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// ---- describing TOML values in messages

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

// ---- the shared "read keys" record

struct ReadRecord {
  std::mutex mutex;
  std::map<std::string, std::set<std::string>> keys;  // section name -> keys read or marked known

  void mark(const std::string& section, const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex);
    keys[section].insert(key);
  }
  void open(const std::string& section) {
    std::lock_guard<std::mutex> lock(mutex);
    keys[section];
  }
  bool opened(const std::string& section) {
    std::lock_guard<std::mutex> lock(mutex);
    return keys.count(section) != 0;
  }
  std::vector<std::string> known(const std::string& section) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = keys.find(section);
    if (it == keys.end()) return {};
    return {it->second.begin(), it->second.end()};
  }
};

}  // namespace

// ---- Config::Impl and Options::Impl

struct Config::Impl {
  toml::table root;
  std::string source;                // file path, "<string>", or "" for an empty config
  std::set<std::string> overridden;  // dotted key paths written by apply_override
  std::shared_ptr<ReadRecord> reads = std::make_shared<ReadRecord>();

  // Where the node at `path` came from: "--set a.b" if an override wrote it (or one of its parent
  // tables), "file:line:column" if it is from the file, "--set a.b.c" for a table an override created.
  std::string where(const std::vector<std::string>& path, const toml::source_region& region) const {
    std::vector<std::string> prefix;
    for (const auto& k : path) {
      prefix.push_back(k);
      const std::string dotted = join_path(prefix);
      if (overridden.count(dotted)) return "--set " + dotted;
    }
    if (region.begin.line > 0) {
      return source + ":" + std::to_string(region.begin.line) + ":" + std::to_string(region.begin.column);
    }
    const std::string dotted = join_path(path) + ".";
    for (const auto& o : overridden) {
      if (o.compare(0, dotted.size(), dotted) == 0) return "--set " + o;
    }
    return source.empty() ? "<config>" : source;
  }
};

struct Options::Impl {
  std::string name;                            // dotted section name ("plugin.extra")
  std::vector<std::string> path;               // keys from the root to this table
  std::shared_ptr<const Config::Impl> config;  // null for a detached, empty view
  std::shared_ptr<ReadRecord> reads;

  // The table this view reads, looked up on every use; null when it does not exist.
  const toml::table* table() const {
    if (!config) return nullptr;
    const toml::table* t = &config->root;
    for (const auto& k : path) {
      const toml::node* n = t->get(k);
      t = n ? n->as_table() : nullptr;
      if (!t) return nullptr;
    }
    return t;
  }
  const toml::node* find(const std::string& key) const {
    const toml::table* t = table();
    return t ? t->get(key) : nullptr;
  }
  std::vector<std::string> child_path(const std::string& key) const {
    std::vector<std::string> p = path;
    p.push_back(key);
    return p;
  }
  // "plugin.key"
  std::string full(const std::string& key) const { return join_path(child_path(key)); }
  std::string where(const std::string& key, const toml::node& n) const {
    return config ? config->where(child_path(key), n.source()) : full(key);
  }
  void mark(const std::string& key) const { reads->mark(name, key); }

  // "<where>: plugin.key must be <expected>, got <type value>"
  [[noreturn]] void type_error(const std::string& key, const toml::node& n, const std::string& expected,
                               const std::string& hint = "") const {
    throw ConfigError(where(key, n) + ": " + full(key) + " must be " + expected + ", got " + describe(n) +
                      hint);
  }
  [[noreturn]] void range_error(const std::string& key, const toml::node& n, const std::string& value,
                                const std::string& lo, const std::string& hi,
                                const std::string& default_value) const {
    throw ConfigError(where(key, n) + ": " + full(key) + " = " + value + " is out of range [" + lo + ", " +
                      hi + "]; set a value in that range, or leave it out for the default (" + default_value +
                      ")");
  }
  // For a string option given a non-string on the command line ("--set train.name=4").
  std::string quote_hint(const std::string& key, const toml::node& n) const {
    const std::string w = where(key, n);
    if (w.rfind("--set ", 0) != 0) return "";
    return " (to pass a string on the command line, quote it: --set '" + full(key) + "=\"...\"')";
  }

  struct Unknown {
    std::string where;
    uint32_t line = 0;
    uint32_t column = 0;
    std::string text;
  };
  // Collects the unknown keys of this table and of the sub-tables opened through table().
  void collect_unknown(std::vector<Unknown>& out, std::vector<std::string>& known_lines) const {
    const toml::table* t = table();
    if (!t) return;
    const std::vector<std::string> known = reads->known(name);
    const std::set<std::string> known_set(known.begin(), known.end());
    bool need_known_line = false;
    for (auto&& [k, node] : *t) {
      const std::string key(k.str());
      if (known_set.count(key)) {
        const std::string child = full(key);
        if (node.is_table() && reads->opened(child)) {
          Impl sub{child, child_path(key), config, reads};
          sub.collect_unknown(out, known_lines);
        }
        continue;
      }
      Unknown u;
      u.where = config->where(child_path(key), k.source());
      u.line = k.source().begin.line;
      u.column = k.source().begin.column;
      u.text = full(key);
      const std::string hint = closest(key, known);
      if (!hint.empty()) {
        u.text += " (did you mean '" + hint + "'?)";
      } else {
        need_known_line = true;
      }
      out.push_back(std::move(u));
    }
    if (need_known_line && !known.empty()) {
      known_lines.push_back("known keys in " + table_label(name) + ": " + join_list(known, ", "));
    }
  }
};

// ---- Options

Options::Options(std::string section) : impl_(std::make_shared<Impl>()) {
  impl_->path = split_dotted(section);
  impl_->name = std::move(section);
  impl_->reads = std::make_shared<ReadRecord>();
}
Options::~Options() = default;
Options::Options(const Options&) = default;
Options& Options::operator=(const Options&) = default;

const std::string& Options::section() const { return impl_->name; }

bool Options::has(const std::string& key) const { return impl_->find(key) != nullptr; }

std::vector<std::string> Options::keys() const {
  std::vector<std::string> out;
  if (const toml::table* t = impl_->table())
    for (const auto& [k, v] : *t) out.emplace_back(k.str());
  return out;
}

bool Options::get_bool(const std::string& key, bool default_value) const {
  impl_->mark(key);
  const toml::node* n = impl_->find(key);
  if (!n) return default_value;
  if (auto* b = n->as_boolean()) return b->get();
  impl_->type_error(key, *n, "a boolean (true or false)");
}

int64_t Options::get_int(const std::string& key, int64_t default_value, int64_t min, int64_t max) const {
  impl_->mark(key);
  const toml::node* n = impl_->find(key);
  if (!n) return default_value;
  if (auto* i = n->as_integer()) {
    const int64_t v = i->get();
    if (v < min || v > max) {
      impl_->range_error(key, *n, std::to_string(v), std::to_string(min), std::to_string(max),
                         std::to_string(default_value));
    }
    return v;
  }
  std::string hint;
  if (auto* f = n->as_floating_point()) {
    const double v = f->get();
    if (std::isfinite(v) && std::trunc(v) == v && std::fabs(v) < 9e18) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.0f", v);
      hint = " (write " + std::string(buf) + ", not " + format_double(v) + ")";
    }
  }
  impl_->type_error(key, *n, "an integer", hint);
}

double Options::get_double(const std::string& key, double default_value, double min, double max) const {
  impl_->mark(key);
  const toml::node* n = impl_->find(key);
  if (!n) return default_value;
  double v = 0;
  if (auto* f = n->as_floating_point()) {
    v = f->get();
  } else if (auto* i = n->as_integer()) {
    v = static_cast<double>(i->get());
  } else {
    impl_->type_error(key, *n, "a number");
  }
  if (!(v >= min && v <= max)) {  // also rejects nan
    impl_->range_error(key, *n, format_double(v), format_double(min), format_double(max),
                       format_double(default_value));
  }
  return v;
}

std::string Options::get_string(const std::string& key, const std::string& default_value) const {
  impl_->mark(key);
  const toml::node* n = impl_->find(key);
  if (!n) return default_value;
  if (auto* s = n->as_string()) return s->get();
  impl_->type_error(key, *n, "a string", impl_->quote_hint(key, *n));
}

std::string Options::get_choice(const std::string& key, const std::string& default_value,
                                const std::vector<std::string>& choices) const {
  impl_->mark(key);
  const toml::node* n = impl_->find(key);
  if (!n) return default_value;
  std::vector<std::string> quoted;
  for (const auto& c : choices) quoted.push_back(quote(c));
  const std::string listed = join_list(quoted, ", ");
  auto* s = n->as_string();
  if (!s) impl_->type_error(key, *n, "one of " + listed, impl_->quote_hint(key, *n));
  const std::string& v = s->get();
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::string msg =
      impl_->where(key, *n) + ": " + impl_->full(key) + " = " + quote(v) + " is not one of " + listed;
  const std::string hint = closest(v, choices);
  if (!hint.empty()) msg += " (did you mean " + quote(hint) + "?)";
  throw ConfigError(msg);
}

Options Options::table(const std::string& key) const {
  impl_->mark(key);
  if (const toml::node* n = impl_->find(key); n && !n->is_table()) impl_->type_error(key, *n, "a table");
  Options sub;
  sub.impl_->path = impl_->child_path(key);
  sub.impl_->name = join_path(sub.impl_->path);
  sub.impl_->config = impl_->config;
  sub.impl_->reads = impl_->reads;
  impl_->reads->open(sub.impl_->name);
  return sub;
}

void Options::mark_known(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) impl_->mark(k);
}

void Options::check_unknown() const {
  std::vector<Impl::Unknown> unknown;
  std::vector<std::string> known_lines;
  impl_->collect_unknown(unknown, known_lines);
  if (unknown.empty()) return;
  // File order first (by line), then keys written by overrides (no line).
  std::stable_sort(unknown.begin(), unknown.end(), [](const Impl::Unknown& a, const Impl::Unknown& b) {
    const auto ka = std::make_pair(a.line == 0 ? UINT32_MAX : a.line, a.column);
    const auto kb = std::make_pair(b.line == 0 ? UINT32_MAX : b.line, b.column);
    return ka < kb;
  });
  std::string msg;
  if (unknown.size() == 1) {
    msg = unknown[0].where + ": unknown key " + unknown[0].text;
  } else {
    msg = std::to_string(unknown.size()) + " unknown keys in " + table_label(impl_->name) + ":";
    for (const auto& u : unknown) msg += "\n  " + u.where + ": " + u.text;
  }
  for (const auto& line : known_lines) msg += "\n  " + line;
  throw ConfigError(msg);
}

// ---- Config: construction and parsing

Config::Config() : impl_(std::make_shared<Impl>()) {}
Config::~Config() = default;
Config::Config(const Config&) = default;
Config& Config::operator=(const Config&) = default;

Config Config::from_string(const std::string& toml_text, const std::string& source_name) {
  Config c;
  c.impl_->source = source_name;
  try {
    c.impl_->root = toml::parse(std::string_view(toml_text), std::string_view(source_name));
  } catch (const toml::parse_error& e) {
    throw ConfigError(source_name + ":" + std::to_string(e.source().begin.line) + ":" +
                      std::to_string(e.source().begin.column) + ": " + std::string(e.description()));
  }
  return c;
}

Config Config::from_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw ConfigError("cannot read config file " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err) throw ConfigError("cannot read config file " + path + ": " + std::strerror(err));
  return from_string(text, path);
}

// ---- Config: overrides

void Config::apply_override(const std::string& assignment) {
  const std::string where = "--set " + assignment;
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos) {
    throw ConfigError(where + ": expected <section>.<key>=<value>, " + kOverrideExample);
  }
  const std::string key_text = trim(std::string_view(assignment).substr(0, eq));
  const std::string value_text = trim(std::string_view(assignment).substr(eq + 1));
  if (key_text.empty()) {
    throw ConfigError(where + ": the key before '=' is empty; expected <section>.<key>=<value>, " +
                      kOverrideExample);
  }
  const std::vector<std::string> path = split_dotted(key_text);
  for (const auto& k : path) {
    if (k.empty()) {
      throw ConfigError(where + ": empty key part in " + quote(key_text) +
                        "; expected <section>.<key>=<value>, " + kOverrideExample);
    }
  }

  // The value: TOML if it parses as exactly one TOML value, else the raw text as a string.
  toml::table parsed;
  bool is_toml = false;
  try {
    parsed = toml::parse(std::string_view("v = " + value_text), std::string_view("--set"));
    is_toml = parsed.size() == 1 && parsed.contains("v");
  } catch (const toml::parse_error&) {
  }
  if (!is_toml) {
    parsed = toml::table{};
    parsed.insert("v", value_text);
  }

  // Walk (and create) the tables down to the last key.
  toml::table* t = &impl_->root;
  std::vector<std::string> walked;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    walked.push_back(path[i]);
    toml::node* n = t->get(path[i]);
    if (!n) n = &t->insert(path[i], toml::table{}).first->second;
    if (!n->is_table()) {
      throw ConfigError(where + ": " + join_path(walked) + " is " + describe(*n) + " (" +
                        impl_->where(walked, n->source()) + "), not a table, so it cannot hold key " +
                        display_key(path[i + 1]));
    }
    t = n->as_table();
  }
  const std::string& last = path.back();
  if (const toml::node* existing = t->get(last); existing && existing->is_table()) {
    throw ConfigError(where + ": " + join_path(path) +
                      " is a table; set its keys one at a time, e.g. --set " + join_path(path) +
                      ".<key>=<value>");
  }
  parsed.get("v")->visit([&](auto& v) { t->insert_or_assign(last, std::move(v)); });
  impl_->overridden.insert(join_path(path));
}

void Config::apply_overrides(const std::vector<std::string>& assignments) {
  for (const auto& a : assignments) apply_override(a);
}

// ---- Config: sections

Options Config::section(const std::string& name) const {
  Options view(name);
  Options::Impl& v = *view.impl_;
  v.config = impl_;
  v.reads = impl_->reads;
  v.name = join_path(v.path);
  // Every level must be a table (or absent); intermediate levels count as read in their parent.
  const toml::table* t = &impl_->root;
  std::vector<std::string> walked;
  for (const auto& k : v.path) {
    if (!walked.empty()) impl_->reads->mark(join_path(walked), k);
    walked.push_back(k);
    const toml::node* n = t ? t->get(k) : nullptr;
    if (n && !n->is_table()) {
      throw ConfigError(impl_->where(walked, n->source()) + ": " + join_path(walked) + " must be a table ([" +
                        join_path(walked) + "]), got " + describe(*n));
    }
    t = n ? n->as_table() : nullptr;
  }
  impl_->reads->open(v.name);
  return view;
}

void Config::check_sections(const std::vector<std::string>& known_sections) const {
  std::vector<std::string> entries;
  for (auto&& [k, node] : impl_->root) {
    const std::string key(k.str());
    if (std::find(known_sections.begin(), known_sections.end(), key) != known_sections.end()) continue;
    std::string e = impl_->where({key}, k.source()) + ": ";
    e += node.is_table() ? "unknown section [" + display_key(key) + "]"
                         : "unknown top-level key " + display_key(key);
    const std::string hint = closest(key, known_sections);
    if (!hint.empty()) e += " (did you mean [" + hint + "]?)";
    entries.push_back(std::move(e));
  }
  if (entries.empty()) return;
  std::string msg;
  if (entries.size() == 1) {
    msg = entries[0];
  } else {
    msg = std::to_string(entries.size()) + " unknown sections:";
    for (const auto& e : entries) msg += "\n  " + e;
  }
  msg += "\n  known sections: " + join_list(known_sections, ", ");
  throw ConfigError(msg);
}

// ---- Config: output

std::string Config::to_toml() const {
  std::ostringstream os;
  os << toml::toml_formatter(impl_->root,
                             toml::toml_formatter::default_flags & ~toml::format_flags::indent_sub_tables);
  std::string text = os.str();
  if (!text.empty() && text.back() != '\n') text += '\n';
  return text;
}

void Config::save(const std::string& path) const {
  namespace fs = std::filesystem;
  const std::string text = to_toml();
  auto fail = [&path](const std::string& reason) {
    throw ConfigError("cannot write config file " + path + ": " + reason);
  };
  const fs::path target(path);
  if (target.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec) fail("cannot create directory " + target.parent_path().string() + ": " + ec.message());
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(std::string(std::strerror(errno)));
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    done += static_cast<size_t>(w);
  }
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (err) {
    ::unlink(tmp.c_str());
    fail(std::strerror(err));
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    ::unlink(tmp.c_str());
    fail(ec.message());
  }
}

const std::string& Config::source() const { return impl_->source; }

// ---- edit distance

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace booster
