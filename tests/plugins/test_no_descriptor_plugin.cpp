// A shared library without booster_plugin_descriptor: the loader must say it is not a plugin.
extern "C" __attribute__((visibility("default"))) int not_a_booster_plugin() { return 42; }
