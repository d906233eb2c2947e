# booster_add_plugin(<name> sources...): builds a Booster plugin, the MODULE library
# booster_plugin_<name>.so that booster::load_plugin finds by name.
#
# The one definition: Booster's own build includes this file for its plugins and test plugins, and
# the installed package (BoosterConfig.cmake) includes it for third-party plugins after
# find_package(Booster). Every plugin gets the same properties:
#  - linked PRIVATE to the core library through its package name Booster::booster (in Booster's
#    own build an alias of the `booster` target);
#  - no "lib" prefix, hidden visibility (only the BOOSTER_PLUGIN descriptor is exported);
#  - INSTALL_RPATH $ORIGIN/../.. : installed into <libdir>/booster/plugins (BOOSTER_PLUGIN_DIR),
#    the plugin finds libbooster.so in <libdir> wherever the install was put;
#  - built into BOOSTER_PLUGIN_OUTPUT_DIR when that variable is set, and compiled with
#    BOOSTER_WARNINGS when that is set (Booster's own build sets both).
# Installing is the caller's: install(TARGETS booster_plugin_<name> LIBRARY DESTINATION
# ${BOOSTER_PLUGIN_DIR}) puts it where the installed Booster searches (see README).

# Where plugins live, relative to the directory of libbooster.so: <libdir>/booster/plugins.
set(BOOSTER_PLUGIN_SUBDIR "booster/plugins")
file(RELATIVE_PATH _booster_plugin_to_libdir "/lib/${BOOSTER_PLUGIN_SUBDIR}" "/lib")  # "../../"
string(REGEX REPLACE "/$" "" _booster_plugin_to_libdir "${_booster_plugin_to_libdir}")
set(BOOSTER_PLUGIN_INSTALL_RPATH "$ORIGIN/${_booster_plugin_to_libdir}")

function(booster_add_plugin name)
  if(NOT ARGN)
    message(FATAL_ERROR "booster_add_plugin(${name}) needs source files: booster_add_plugin(${name} my_plugin.cpp)")
  endif()
  set(target booster_plugin_${name})
  add_library(${target} MODULE ${ARGN})
  target_link_libraries(${target} PRIVATE Booster::booster)
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "${BOOSTER_PLUGIN_INSTALL_RPATH}")
  if(BOOSTER_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${BOOSTER_PLUGIN_OUTPUT_DIR})
  endif()
  if(BOOSTER_WARNINGS)
    target_compile_options(${target} PRIVATE ${BOOSTER_WARNINGS})
  endif()
endfunction()
