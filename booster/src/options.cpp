// options.cpp — booster::Options, the typed view of one config section (see booster/config.h).
// Reads resolve the section's table from the root on every use, record the key as read, and throw
// ConfigError starting with where the value came from (see config.cpp).
#include <algorithm>
#include <cmath>
#include <limits>

#include "config_impl.h"

namespace booster {

using namespace config_text;


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

std::string Options::where(const std::string& key) const {
  const toml::node* n = impl_->find(key);
  return n ? impl_->where(key, *n) : impl_->full(key);
}

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
  const std::string hint = closest_match(v, choices, kMaxHintDistance);
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

}  // namespace booster
