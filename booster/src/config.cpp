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

#include <cctype>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "booster/io/atomic_write.h"
#include "config_impl.h"

namespace booster {

using namespace config_text;

namespace {
const char* const kOverrideExample = "e.g. --set plugin.bucket_cap_mb=25";

// toml++ 3.3.0 writes a key that is not bare as a literal string ('key'), which cannot hold a
// single quote or a control character, and then writes such a key bare: the printed config would
// not read back (found by the config fuzzer). Throws ConfigError naming the first such key of
// `node` (tables and tables inside arrays, recursively) and where it is.
void check_printable_keys(const toml::node& node, const std::string& source) {
  auto check_key = [&](const toml::key& key) {
    for (char ch : key.str()) {
      const auto u = static_cast<unsigned char>(ch);
      if (ch != '\'' && u >= 0x20 && u != 0x7f) continue;
      throw ConfigError(source + ":" + std::to_string(key.source().begin.line) + ":" +
                        std::to_string(key.source().begin.column) + ": key " + quote(key.str()) +
                        " has a single quote or a control character, which a saved config cannot hold "
                        "(option names are letters, digits, '_' and '-'): rename the key");
    }
  };
  if (const toml::table* t = node.as_table()) {
    for (const auto& [key, value] : *t) {
      check_key(key);
      check_printable_keys(value, source);
    }
  } else if (const toml::array* a = node.as_array()) {
    for (const auto& value : *a) check_printable_keys(value, source);
  }
}
}  // namespace

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
  check_printable_keys(c.impl_->root, source_name);
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
    // Option names are TOML bare keys; anything else is a typo (and would not print back as TOML).
    for (char c : k)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'))
        throw ConfigError(where + ": key part " + quote(k) + " has the character " + quote(std::string(1, c)) +
                          "; option names are letters, digits, '_' and '-'; expected <section>.<key>=<value>, " +
                          kOverrideExample);
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

Config Config::clone() const {
  Config copy;
  copy.impl_->root = impl_->root;
  copy.impl_->source = impl_->source;
  copy.impl_->overridden = impl_->overridden;
  return copy;
}

void Config::remove_section(const std::string& name) {
  const toml::node* node = impl_->root.get(name);
  if (!node) return;
  if (!node->is_table())
    throw ConfigError(impl_->where({name}, node->source()) + ": " + name + " is a value, not a table; remove_section "
                      "removes tables");
  impl_->root.erase(name);
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
    const std::string hint = closest_match(key, known_sections, kMaxHintDistance);
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
  try {
    io::atomic_write_file(path, to_toml());
  } catch (const io::IoError& e) {
    throw ConfigError("cannot write config file " + path + ": " + e.what());
  }
}

const std::string& Config::source() const { return impl_->source; }

}  // namespace booster
