// A plugin as built against the previous plugin ABI (BOOSTER_PLUGIN_ABI_VERSION - 1): the loader must
// refuse it, naming both versions and the porting guide.
#include <torch/version.h>

#include "booster/plugin.h"

extern "C" BOOSTER_API const booster::BoosterPluginDescriptor* booster_plugin_descriptor() {
  static const booster::BoosterPluginDescriptor d{booster::BOOSTER_PLUGIN_ABI_VERSION - 1, "test_old_abi", "0",
                                                  TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, _GLIBCXX_USE_CXX11_ABI,
                                                  nullptr};
  return &d;
}
