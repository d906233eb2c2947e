// A plugin whose descriptor claims plugin ABI version 999: the loader must refuse it.
#include <torch/version.h>

#include "booster/plugin.h"

extern "C" BOOSTER_API const booster::BoosterPluginDescriptor* booster_plugin_descriptor() {
  static const booster::BoosterPluginDescriptor d{999, "test_bad_abi", "0", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
                                                  _GLIBCXX_USE_CXX11_ABI, nullptr};
  return &d;
}
