# check_exports.cmake — the dynamic symbols of libnvheap.so are exactly the
# documented API plus the named internal symbols its inline code needs.
#
#   cmake -DLIBRARY=libnvheap.so -DHEADER_DIR=include -DCC=gcc
#         -DNM=nm -DOBJDUMP=objdump -DSONAME=libnvheap.so.1
#         -DWORK=dir -P check_exports.cmake
#
# The documented API is every function include/nvheap.h declares, listed by
# the compiler itself (gcc -aux-info: one line per declaration, with file and
# line), without the inline ones. A declared name ending in '_' is internal
# and must be one of INLINE_SUPPORT below. The test fails on a symbol
# exported beyond that list (an internal function leaking into the ABI), on a
# declared function the library does not export, on a symbol without the
# version node, and on a wrong SONAME.
cmake_minimum_required(VERSION 3.18)

# The internal symbols the header's inline fast paths (section 4) reach:
# they are part of the ABI — an application compiled against this header
# calls them — so they are exported, and renaming one breaks the ABI.
# (-aux-info lists functions only, so an exported variable is listed here.)
set(INLINE_SUPPORT
  nvh_thread_stripe_      # per-thread statistics stripe (initial-exec TLS)
  nvh_assign_stripe_      # first use of the stripe in a thread
  nvh_flush_slow_         # nvh_flush in the msync and sim domains
  nvh_drain_slow_         # nvh_drain in the msync and sim domains
  nvh_memcpy_nt_          # nvh_memcpy_nodrain's non-temporal copy
)
set(VERSION_NODE_PREFIX "NVHEAP_")

foreach(var LIBRARY HEADER_DIR CC NM OBJDUMP SONAME WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_exports.cmake: -D${var}=... missing")
  endif()
endforeach()
file(MAKE_DIRECTORY ${WORK})

# ---- what the header declares ------------------------------------------------
file(WRITE ${WORK}/probe.c "#include <nvheap.h>\n")
execute_process(
  COMMAND ${CC} -std=c11 -D_GNU_SOURCE -fsyntax-only -aux-info ${WORK}/aux.txt
          -I ${HEADER_DIR} ${WORK}/probe.c
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compiling the header probe failed: ${err}")
endif()
file(STRINGS ${WORK}/aux.txt aux_lines REGEX "nvheap\\.h:[0-9]+:")
set(documented "")
set(internal "")
foreach(line IN LISTS aux_lines)
  # /* .../nvheap.h:83:NC */ extern int nvh_errcode (void);
  if(line MATCHES "\\*/ static ")
    continue()                                     # inline: not a symbol
  endif()
  if(NOT line MATCHES "\\*/ extern [^(]*[ *]([A-Za-z_][A-Za-z0-9_]*) \\(")
    message(FATAL_ERROR "unexpected -aux-info line: ${line}")
  endif()
  set(name ${CMAKE_MATCH_1})
  if(name MATCHES "_$")
    list(APPEND internal ${name})
  else()
    list(APPEND documented ${name})
  endif()
endforeach()
list(LENGTH documented n_documented)
if(n_documented LESS 50)
  message(FATAL_ERROR "only ${n_documented} functions found in ${HEADER_DIR}/nvheap.h: -aux-info output changed?")
endif()
foreach(name IN LISTS internal)
  if(NOT name IN_LIST INLINE_SUPPORT)
    message(FATAL_ERROR "include/nvheap.h declares internal function ${name}: if the inline code "
                        "needs it, add it to INLINE_SUPPORT in ${CMAKE_CURRENT_LIST_FILE}, else "
                        "declare it in a header under src/")
  endif()
endforeach()
foreach(name IN LISTS documented)
  if(NOT name MATCHES "^nvh_")
    message(FATAL_ERROR "include/nvheap.h declares ${name}: every public name starts with nvh_")
  endif()
endforeach()
set(expected ${documented} ${INLINE_SUPPORT})
list(REMOVE_DUPLICATES expected)
list(SORT expected)

# ---- what the library exports --------------------------------------------------
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
                OUTPUT_VARIABLE nm_out RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D ${LIBRARY} failed: ${err}")
endif()
string(REPLACE "\n" ";" nm_lines "${nm_out}")
set(exported "")
set(unversioned "")
foreach(line IN LISTS nm_lines)
  if(line STREQUAL "")
    continue()
  endif()
  # "0000000000012340 T nvh_errcode@@NVHEAP_1.0", "0000000000000000 A NVHEAP_1.0"
  if(NOT line MATCHES "^[0-9a-fA-F]* *([A-Za-z]) ([^@ ]+)(@@?([^ ]+))?$")
    message(FATAL_ERROR "unexpected nm line: '${line}'")
  endif()
  set(type ${CMAKE_MATCH_1})
  set(name ${CMAKE_MATCH_2})
  set(node "${CMAKE_MATCH_4}")
  if(type STREQUAL "A" AND name MATCHES "^${VERSION_NODE_PREFIX}")
    continue()                                     # the version node itself
  endif()
  list(APPEND exported ${name})
  if(NOT node MATCHES "^${VERSION_NODE_PREFIX}")
    list(APPEND unversioned ${name})
  endif()
endforeach()
list(SORT exported)

set(extra ${exported})
list(REMOVE_ITEM extra ${expected})
set(missing ${expected})
if(exported)
  list(REMOVE_ITEM missing ${exported})
endif()
list(LENGTH exported n_exported)
list(LENGTH expected n_expected)
set(problems "")
if(extra)
  list(LENGTH extra n)
  string(REPLACE ";" " " extra "${extra}")
  string(APPEND problems "\n${n} exported symbol(s) are neither declared in nvheap.h nor in "
         "INLINE_SUPPORT (internal symbols leak into the ABI):\n  ${extra}")
endif()
if(missing)
  list(LENGTH missing n)
  string(REPLACE ";" " " missing "${missing}")
  string(APPEND problems "\n${n} declared function(s) are not exported by ${LIBRARY}:\n  ${missing}")
endif()
if(unversioned)
  string(REPLACE ";" " " unversioned "${unversioned}")
  string(APPEND problems "\nsymbols without a ${VERSION_NODE_PREFIX}* version node: ${unversioned}")
endif()

execute_process(COMMAND ${OBJDUMP} -p ${LIBRARY} OUTPUT_VARIABLE dump RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT dump MATCHES "SONAME +([^\n]+)")
  string(APPEND problems "\nno SONAME in ${LIBRARY}")
elseif(NOT CMAKE_MATCH_1 STREQUAL SONAME)
  string(APPEND problems "\nSONAME is ${CMAKE_MATCH_1}, expected ${SONAME}")
endif()

if(problems)
  message(FATAL_ERROR "libnvheap ABI check failed (${n_exported} exported, ${n_expected} expected):${problems}")
endif()
message(STATUS "libnvheap exports exactly ${n_expected} symbols: ${n_documented} declared in "
               "nvheap.h + the inline-support ones; SONAME ${SONAME}")
