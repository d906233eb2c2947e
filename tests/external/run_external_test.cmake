# ctest driver: install the SDK into a fresh prefix, build tests/external against it with
# find_package(Booster), then run the consumer. Variables: BOOSTER_BINARY_DIR, EXTERNAL_SOURCE_DIR, WORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run_step(${CMAKE_COMMAND} --install ${BOOSTER_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
find_program(NINJA ninja)
set(generator)
if(NINJA)
  set(generator -G Ninja)
endif()
run_step(${CMAKE_COMMAND} -S ${EXTERNAL_SOURCE_DIR} -B ${WORK_DIR}/build ${generator}
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step(${CMAKE_COMMAND} -E env BOOSTER_PLUGIN_PATH=${WORK_DIR}/prefix/lib/booster/plugins
         ${WORK_DIR}/build/consumer ${WORK_DIR}/build/booster_plugin_third_party.so)
