// plugin_loader.cpp — finds plugin libraries, checks their descriptor, calls the factory.
#include "booster/plugin_loader.h"

#include <torch/version.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include <dlfcn.h>
#include <elf.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace booster {

namespace fs = std::filesystem;

namespace {

const std::string kPrefix = "booster_plugin_";
const std::string kSuffix = ".so";

// Loaded libraries stay alive for the life of the process (plugins linked to libtorch are NODELETE
// anyway, and objects they created may outlive any handle we could track).
std::mutex g_libs_mutex;
std::vector<std::shared_ptr<boost::dll::shared_library>>& loaded_libraries() {
  static auto* libs = new std::vector<std::shared_ptr<boost::dll::shared_library>>();
  return *libs;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

struct LoadedLibrary {
  std::shared_ptr<boost::dll::shared_library> lib;
  const BoosterPluginDescriptor* descriptor = nullptr;
};

// dlopen maps the file's LOAD segments as the ELF headers describe them: a truncated file (an
// interrupted copy or build) then faults with SIGBUS when the loader touches a page past its end.
// So the headers are checked against the file's size first. Throws PluginError naming the problem.
void check_elf_file(const std::string& path) {
  const std::string fix = " (is it built for this machine and copied whole? rebuild it or copy it again)";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw PluginError("booster: cannot load plugin library " + path + ": cannot open it for reading" + fix);
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  Elf64_Ehdr eh{};
  if (size < sizeof eh || !in.read(reinterpret_cast<char*>(&eh), sizeof eh) ||
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
    throw PluginError("booster: cannot load plugin library " + path + ": not an ELF shared library (" +
                      std::to_string(size) + " bytes, no ELF header)" + fix);
#if defined(__x86_64__)
  constexpr uint16_t kMachine = EM_X86_64;
#elif defined(__aarch64__)
  constexpr uint16_t kMachine = EM_AARCH64;
#else
  const uint16_t kMachine = eh.e_machine;
#endif
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_machine != kMachine ||
      eh.e_type != ET_DYN)
    throw PluginError("booster: cannot load plugin library " + path + ": an ELF file for another machine or not a "
                      "shared library (class " + std::to_string(eh.e_ident[EI_CLASS]) + ", machine " +
                      std::to_string(eh.e_machine) + ", type " + std::to_string(eh.e_type) + ")" + fix);
  auto truncated = [&](const std::string& what, uint64_t end) {
    return PluginError("booster: cannot load plugin library " + path + ": the file is truncated: " + what +
                       " ends at byte " + std::to_string(end) + " but the file has " + std::to_string(size) +
                       " bytes" + fix);
  };
  const uint64_t ph_end = eh.e_phoff + uint64_t{eh.e_phnum} * eh.e_phentsize;
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || ph_end > size || ph_end < eh.e_phoff)
    throw truncated("its program header table", ph_end);
  if (eh.e_shoff != 0) {
    const uint64_t sh_end = eh.e_shoff + uint64_t{eh.e_shnum} * eh.e_shentsize;
    if (sh_end > size || sh_end < eh.e_shoff) throw truncated("its section header table", sh_end);
  }
  in.seekg(static_cast<std::streamoff>(eh.e_phoff));
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    if (!in.read(reinterpret_cast<char*>(&ph), sizeof ph)) throw truncated("its program header table", ph_end);
    const uint64_t end = ph.p_offset + ph.p_filesz;
    if (ph.p_type == PT_LOAD && (end > size || end < ph.p_offset))
      throw truncated("LOAD segment " + std::to_string(i), end);
  }
}

LoadedLibrary open_library(const std::string& path) {
  if (!fs::exists(path))
    throw PluginError("booster: plugin library " + path + " does not exist; check [plugin] path, or remove it to "
                      "search for the plugin by name (BOOSTER_PLUGIN_PATH, the install, the executable's directory)");
  check_elf_file(path);
  auto lib = std::make_shared<boost::dll::shared_library>();
  boost::dll::fs::error_code ec;
  lib->load(boost::dll::fs::path(path), boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now, ec);
  if (ec) {
    throw PluginError("booster: cannot load plugin library " + path + ": " + ec.message() +
                      " (is it built for this machine and is libbooster.so on the library path?)");
  }
  if (!lib->has(BOOSTER_PLUGIN_DESCRIPTOR_SYMBOL)) {
    throw PluginError("booster: " + path + " is not a Booster plugin: it does not export '" +
                      std::string(BOOSTER_PLUGIN_DESCRIPTOR_SYMBOL) +
                      "' (define it with BOOSTER_PLUGIN(name, version, Class) in the plugin's .cpp)");
  }
  auto fn = lib->get<const BoosterPluginDescriptor*()>(BOOSTER_PLUGIN_DESCRIPTOR_SYMBOL);
  const BoosterPluginDescriptor* d = fn();
  if (!d) throw PluginError("booster: " + path + ": booster_plugin_descriptor() returned null");
  {
    std::lock_guard<std::mutex> lock(g_libs_mutex);
    loaded_libraries().push_back(lib);
  }
  return {lib, d};
}

void check_descriptor(const BoosterPluginDescriptor& d, const std::string& path) {
  std::string name = d.name ? d.name : "(unnamed)";
  if (d.abi_version != BOOSTER_PLUGIN_ABI_VERSION) {
    throw PluginError("booster: plugin '" + name + "' (" + path + ") was built for plugin ABI version " +
                      std::to_string(d.abi_version) + ", but this Booster has ABI version " +
                      std::to_string(BOOSTER_PLUGIN_ABI_VERSION) + "; rebuild the plugin against this Booster" +
                      (d.abi_version < BOOSTER_PLUGIN_ABI_VERSION
                           ? " (an older interface: port it first as docs/plugins.md, \"Porting a plugin built "
                             "against another Booster\", describes)"
                           : ""));
  }
  if (d.torch_major != TORCH_VERSION_MAJOR || d.torch_minor != TORCH_VERSION_MINOR) {
    throw PluginError("booster: plugin '" + name + "' (" + path + ") was built with LibTorch " +
                      std::to_string(d.torch_major) + "." + std::to_string(d.torch_minor) +
                      ", but this Booster uses LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                      std::to_string(TORCH_VERSION_MINOR) + "; rebuild the plugin with the same LibTorch");
  }
  if (d.cxx11_abi != _GLIBCXX_USE_CXX11_ABI) {
    throw PluginError("booster: plugin '" + name + "' (" + path + ") was built with _GLIBCXX_USE_CXX11_ABI=" +
                      std::to_string(d.cxx11_abi) + ", but this Booster uses _GLIBCXX_USE_CXX11_ABI=" +
                      std::to_string(_GLIBCXX_USE_CXX11_ABI) + "; rebuild the plugin with the same flag");
  }
  if (!d.create) throw PluginError("booster: plugin '" + name + "' (" + path + ") has no factory function");
}

// Any function of this library: dladdr on it names the file libbooster.so was loaded from.
void locate_this_library() {}

// <directory of libbooster.so>/BOOSTER_PLUGIN_SUBDIR, symlinks resolved; "" if dladdr fails.
std::string install_plugin_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&locate_this_library), &info) == 0 || info.dli_fname == nullptr ||
      info.dli_fname[0] == '\0')
    return "";
  std::error_code ec;
  fs::path library = fs::canonical(info.dli_fname, ec);
  if (ec) library = fs::absolute(info.dli_fname, ec);
  return (library.parent_path() / BOOSTER_PLUGIN_SUBDIR).string();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Search

std::vector<std::string> plugin_search_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("BOOSTER_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':'))
      if (!item.empty()) dirs.push_back(item);
  }
  std::string install_dir = install_plugin_dir();
  if (!install_dir.empty()) dirs.push_back(install_dir);
  boost::dll::fs::error_code ec;
  auto exe = boost::dll::program_location(ec);
  if (!ec) {
    std::string exe_dir = exe.parent_path().string();
    dirs.push_back(exe_dir);
    dirs.push_back(exe_dir + "/plugins");
  }
  return dirs;
}

std::vector<PluginLibraryInfo> find_plugin_files() {
  std::vector<PluginLibraryInfo> found;
  for (const auto& dir : plugin_search_dirs()) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir, ec)) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const auto& p : files) {
      std::string fname = p.filename().string();
      if (fname.rfind(kPrefix, 0) != 0 || fname.size() <= kPrefix.size() + kSuffix.size() ||
          fname.compare(fname.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
        continue;
      std::string name = fname.substr(kPrefix.size(), fname.size() - kPrefix.size() - kSuffix.size());
      bool seen = false;
      for (const auto& f : found) seen = seen || f.name == name;
      if (!seen) found.push_back({name, "", fs::absolute(p).string()});
    }
  }
  return found;
}

PluginLibraryInfo inspect_plugin(const std::string& path) {
  auto lib = open_library(path);
  return {lib.descriptor->name ? lib.descriptor->name : "", lib.descriptor->version ? lib.descriptor->version : "",
          fs::absolute(path).string()};
}

// ---------------------------------------------------------------------------------------------
// Load

std::shared_ptr<Plugin> load_plugin(const PluginContext& ctx, const std::string& explicit_path) {
  std::string path = explicit_path;
  if (path.empty()) {
    auto found = find_plugin_files();
    for (const auto& f : found)
      if (f.name == ctx.name) { path = f.path; break; }
    if (path.empty()) {
      std::vector<std::string> names;
      for (const auto& f : found) names.push_back(f.name + " (" + f.path + ")");
      throw PluginError("booster: plugin '" + ctx.name + "' not found: no file " + kPrefix + ctx.name + kSuffix +
                        " in any of: " + join(plugin_search_dirs(), ", ") + ". Plugins found: " +
                        (names.empty() ? std::string("none") : join(names, ", ")) +
                        ". Set [booster] plugin to one of them, [plugin] path to the .so, or "
                        "BOOSTER_PLUGIN_PATH to its directory.");
    }
  }
  auto lib = open_library(path);
  check_descriptor(*lib.descriptor, path);
  std::string lib_name = lib.descriptor->name ? lib.descriptor->name : "";
  if (explicit_path.empty() && lib_name != ctx.name) {
    throw PluginError("booster: " + path + " is named '" + lib_name + "' in its descriptor, not '" + ctx.name +
                      "'; rename the file or fix BOOSTER_PLUGIN(...)");
  }
  std::shared_ptr<Plugin> plugin = lib.descriptor->create(ctx);
  if (!plugin) throw PluginError("booster: plugin '" + ctx.name + "' factory returned null");
  ctx.options.mark_known({"path"});  // the loader's own key, never the plugin's
  ctx.options.check_unknown();
  return plugin;
}

}  // namespace booster
