// A plugin whose descriptor claims LibTorch 0.9: the loader must refuse it.
#include "booster/plugin.h"

extern "C" BOOSTER_API const booster::BoosterPluginDescriptor* booster_plugin_descriptor() {
  static const booster::BoosterPluginDescriptor d{booster::BOOSTER_PLUGIN_ABI_VERSION, "test_wrong_torch", "0", 0, 9,
                                                  _GLIBCXX_USE_CXX11_ABI, nullptr};
  return &d;
}
