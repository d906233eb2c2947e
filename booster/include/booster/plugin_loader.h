// plugin_loader.h — finds, checks and instantiates plugin libraries (Boost.DLL).
//
// Search order (DESIGN.md): an explicit `path` (file) from [plugin] path, then each directory of
// $BOOSTER_PLUGIN_PATH (':'-separated), the install's plugin directory, the directory of the
// running executable and its plugins/ subdirectory. The file for plugin <name> is
// `booster_plugin_<name>.so`.
//
// The install's plugin directory is <directory of libbooster.so>/booster/plugins (symlinks
// resolved), found at run time from the loaded library itself: an install moved to any prefix
// finds its plugins without BOOSTER_PLUGIN_PATH. In a build tree that is <build>/lib/booster/plugins
// (usually absent; the build puts plugins in <build>/bin/plugins, the executables' plugins/).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "booster/plugin.h"

namespace booster {

struct PluginLibraryInfo {
  std::string name;     // from the descriptor
  std::string version;  // from the descriptor
  std::string path;     // absolute path of the .so
};

// The directories searched, in order (explicit path excluded). Existing or not.
BOOSTER_API std::vector<std::string> plugin_search_dirs();

// Plugin files found in the search directories: name (from the file name) -> path. The first
// occurrence wins, in search order.
BOOSTER_API std::vector<PluginLibraryInfo> find_plugin_files();

// Loads plugin `ctx.name` (or the library at `explicit_path` if non-empty), checks its descriptor
// and calls its factory, then `ctx.options.check_unknown()`. Throws PluginError when:
//  - the file is not found: the message lists every directory searched and the plugins found;
//  - the library cannot be loaded (dlopen message included);
//  - it lacks the `booster_plugin_descriptor` symbol (not a Booster plugin);
//  - ABI version, LibTorch major.minor or C++11 ABI flag differ: both values named;
//  - the descriptor's name differs from the requested one (when loaded by name).
// ConfigError from the factory (bad options) propagates unchanged. The library is never unloaded.
BOOSTER_API std::shared_ptr<Plugin> load_plugin(const PluginContext& ctx,
                                                const std::string& explicit_path = "");

// Loads a plugin library and returns its descriptor info without instantiating it.
BOOSTER_API PluginLibraryInfo inspect_plugin(const std::string& path);

}  // namespace booster
