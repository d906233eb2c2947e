// config.h — the run's configuration: one TOML file (toml++), typed per-section option readers,
// dotted command-line overrides, and the effective config written next to the run's outputs.
//
// Sections: [booster] [plugin] [mixed_precision] [checkpoint] [distributed] [train] (the example's
// own). Each consumer reads its section through `Options`, which records what was read, so a key
// nobody read is reported as unknown ("did you mean ...?") by `Options::check_unknown()`.
// toml++ stays behind this header (pimpl) so plugins compile quickly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/did_you_mean.h"  // edit_distance, used by the hints
#include "booster/export.h"

namespace booster {

// Every configuration problem: syntax, unknown key, wrong type, out of range. The message names
// the place ("configs/ddp.toml:4:1" or "--set plugin.x=1") and how to fix it.
class BOOSTER_API ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Config;

// A read-only view of one table of the config (e.g. [plugin]) that remembers which keys were read.
// Getters return the default when the key is absent; they throw ConfigError when the value has the
// wrong type or is out of range, naming "section.key", the source location and the expected value.
class BOOSTER_API Options {
 public:
  // An empty section (every getter returns its default). `section` is the dotted table name.
  explicit Options(std::string section = "");
  ~Options();
  Options(const Options&);
  Options& operator=(const Options&);

  const std::string& section() const;
  bool has(const std::string& key) const;
  // Every key of this table, in file order (does not mark them read).
  std::vector<std::string> keys() const;

  bool get_bool(const std::string& key, bool default_value) const;
  // Integers; [min, max] inclusive. A TOML float is a type error (say 4, not 4.0).
  int64_t get_int(const std::string& key, int64_t default_value, int64_t min = INT64_MIN,
                  int64_t max = INT64_MAX) const;
  // Floats; a TOML integer is accepted and converted. [min, max] inclusive.
  double get_double(const std::string& key, double default_value, double min = -1e308,
                    double max = 1e308) const;
  std::string get_string(const std::string& key, const std::string& default_value) const;
  // A string that must be one of `choices` (error lists them).
  std::string get_choice(const std::string& key, const std::string& default_value,
                         const std::vector<std::string>& choices) const;
  // A sub-table (e.g. [plugin.extra]); keys read from it count as read in this view too.
  Options table(const std::string& key) const;

  // Where `key` of this table was set, for errors about its value that callers raise:
  // "file:line:column" for the file, "--set section.key" for an override, "section.key" when absent.
  std::string where(const std::string& key) const;

  // Marks keys as known without reading them (e.g. handled by someone else).
  void mark_known(const std::vector<std::string>& keys) const;
  // Throws ConfigError naming every key of this table that no getter read, with a
  // "did you mean '<closest read key>'?" hint when one is within edit distance 3.
  void check_unknown() const;

  struct Impl;

 private:
  friend class Config;
  std::shared_ptr<Impl> impl_;
};

// The whole configuration. Cheap to copy (shared, immutable after overrides are applied).
class BOOSTER_API Config {
 public:
  Config();  // empty config: every option at its default
  ~Config();
  Config(const Config&);
  Config& operator=(const Config&);

  // Parses a TOML file. Throws ConfigError "<path>:<line>:<column>: <toml++ message>" on a syntax
  // error, and "cannot read config file <path>" when it cannot be opened.
  static Config from_file(const std::string& path);
  // Parses TOML text; `source_name` is used in error messages instead of a file path.
  static Config from_string(const std::string& toml_text, const std::string& source_name = "<string>");

  // Applies one dotted override "section.key=value" (`--set plugin.bucket_cap_mb=4`). The value is
  // parsed as a TOML value (4, 2.5, true, "x", [1,2]); a bare word that is not TOML is taken as a
  // string. Missing tables are created. Throws ConfigError if there is no '=' or the path is empty
  // or walks through a non-table value.
  void apply_override(const std::string& assignment);
  void apply_overrides(const std::vector<std::string>& assignments);
  // A deep copy: its own table, overrides record and a fresh read-key record (copies made with the
  // copy constructor share all three).
  Config clone() const;
  // Removes the top-level table `name` (nothing when absent). Throws ConfigError when `name` is a
  // value, not a table.
  void remove_section(const std::string& name);

  // The view of one top-level table ("plugin"); empty view if absent. Views of the same section
  // share their read-key record, so check_unknown() sees reads done through any of them. Throws
  // ConfigError (with the source location) when the key exists but is not a table.
  Options section(const std::string& name) const;
  // Throws ConfigError for a top-level key or table not in `known_sections`.
  void check_sections(const std::vector<std::string>& known_sections) const;

  // The effective config (file + overrides) as TOML text.
  std::string to_toml() const;
  // Writes to_toml() to `path` with io::atomic_write_file (crash-safe; parent directories are
  // created). Throws ConfigError "cannot write config file <path>: <reason>".
  void save(const std::string& path) const;
  // Where the config came from: a file path, "<string>", or "" for an empty config.
  const std::string& source() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace booster
