# The hash map's test hook (src/ds/hashmap.h, NVH_TEST_HOOKS) is compiled
# into the in-tree library the tests link, and into nothing that is
# installed: the static library's objects must not name it (the shared one
# is built from the same objects).
foreach(lib IN ITEMS "${INSTALLED}" "${INTERNAL}")
  execute_process(COMMAND ${NM} ${lib} OUTPUT_VARIABLE syms RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nm ${lib} failed")
  endif()
  string(FIND "${syms}" "nvh_hm_test_hook_" at)
  if(lib STREQUAL "${INSTALLED}" AND NOT at EQUAL -1)
    message(FATAL_ERROR "${lib} has the hash map's test hook")
  endif()
  if(lib STREQUAL "${INTERNAL}" AND at EQUAL -1)
    message(FATAL_ERROR "${lib} lacks the test hook the crash tests use")
  endif()
endforeach()
