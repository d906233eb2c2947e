# ctest driver: the SDK as users get it. Installs the SDK into a fresh prefix, builds tests/external
# against it with find_package(Booster) and installs that into the same prefix, then runs, each in a
# clean environment (env -i PATH=/usr/bin:/bin: no LD_LIBRARY_PATH, no BOOSTER_PLUGIN_PATH):
#  1. the consumer from its build tree, with the third-party plugin given by path;
#  2. after the whole prefix is moved elsewhere (nothing may depend on where it was installed):
#     the installed consumer, loading the third-party and torch_ddp plugins by name from the
#     install's plugin directory, and the installed `booster ckpt inspect` on the checkpoint the
#     consumer saved (booster execs booster-ckpt from its own directory, which is not in PATH).
# Variables: BOOSTER_BINARY_DIR, EXTERNAL_SOURCE_DIR, WORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
set(moved ${WORK_DIR}/moved-prefix)

# run_step(<output variable> command...): runs the command, fails the test with its output if it
# exits non-zero, and stores its stdout in the variable.
function(run_step out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "step failed (${rc}): ${command}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

find_program(ENV_PROGRAM env PATHS /usr/bin /bin REQUIRED)
set(clean_env ${ENV_PROGRAM} -i PATH=/usr/bin:/bin)

run_step(out ${CMAKE_COMMAND} --install ${BOOSTER_BINARY_DIR} --prefix ${prefix})
find_program(NINJA ninja)
set(generator)
if(NINJA)
  set(generator -G Ninja)
endif()
run_step(out ${CMAKE_COMMAND} -S ${EXTERNAL_SOURCE_DIR} -B ${WORK_DIR}/build ${generator}
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
run_step(out ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step(out ${CMAKE_COMMAND} --install ${WORK_DIR}/build --prefix ${prefix})

# 1. The consumer's build tree: CMake's default build RPATH names the install's lib directory.
run_step(out ${clean_env} ${WORK_DIR}/build/consumer ${WORK_DIR}/checkpoint-build-tree
         ${WORK_DIR}/build/booster_plugin_third_party.so)

# 2. The installed programs, from a prefix other than the one they were installed into.
file(RENAME ${prefix} ${moved})
run_step(out ${clean_env} ${moved}/bin/consumer ${WORK_DIR}/checkpoint)
if(NOT out MATCHES "third_party \\(by name\\)")
  message(FATAL_ERROR "the installed consumer did not load the third-party plugin by name:\n${out}")
endif()
run_step(out ${clean_env} ${moved}/bin/booster ckpt inspect ${WORK_DIR}/checkpoint)
foreach(expected "weight" "bias")
  if(NOT out MATCHES "${expected}")
    message(FATAL_ERROR "booster ckpt inspect does not list '${expected}':\n${out}")
  endif()
endforeach()
