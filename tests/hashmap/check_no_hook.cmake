# The test hooks (NVH_TEST_HOOKS: the hash map's, src/ds/hashmap.h, and the
# key-value store's counters, src/kv/kv.h and src/kv/sorted.h) are compiled
# into the in-tree library the tests link, and into nothing that is
# installed: the static library's objects must not name them (the shared
# one is built from the same objects).
set(hooks nvh_hm_test_hook_ nvh_kv_test_bytes_walks_ kvs_test_step_seeks_)
foreach(lib IN ITEMS "${INSTALLED}" "${INTERNAL}")
  execute_process(COMMAND ${NM} ${lib} OUTPUT_VARIABLE syms RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nm ${lib} failed")
  endif()
  foreach(hook IN LISTS hooks)
    string(FIND "${syms}" "${hook}" at)
    if(lib STREQUAL "${INSTALLED}" AND NOT at EQUAL -1)
      message(FATAL_ERROR "${lib} has the test hook ${hook}")
    endif()
    if(lib STREQUAL "${INTERNAL}" AND at EQUAL -1)
      message(FATAL_ERROR "${lib} lacks the test hook ${hook} the tests use")
    endif()
  endforeach()
endforeach()
