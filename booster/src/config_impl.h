// config_impl.h — the shared state behind booster::Config and its Options views (private to
// libbooster; see config.cpp for the model).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "booster/config.h"
#include "booster/did_you_mean.h"
#include "config_text.h"

namespace booster {

using config_text::describe;
using config_text::join_list;
using config_text::join_path;
using config_text::table_label;

// Largest edit distance for which a "did you mean" hint is given.
constexpr size_t kMaxHintDistance = 3;

// The shared "read keys" record: section name -> keys read or marked known.
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
      const std::string hint = closest_match(key, known, kMaxHintDistance);
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

}  // namespace booster
