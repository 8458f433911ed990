# run_install_test.cmake — install the build into a temporary prefix and use
# it from outside, as another project would (tests/install/CMakeLists.txt
# passes the -D variables):
#   1. cmake --install BUILD_DIR --prefix WORK/prefix; every file is there
#   2. the installed CLI runs and prints the version
#   3. pkg-config: `pkg-config --cflags --libs nvheap` compiles and links
#      consumer.c with the C compiler directly (against libnvheap.so.MAJOR)
#   4. find_package(nvheap CONFIG REQUIRED): consumer/CMakeLists.txt builds it
#      against nvheap::nvheap and nvheap::nvheap_static
# and runs each consumer (create a pool, persist, reopen, check);
#   5. with -DNVCACHED=ON: the installed nvcached is there, prints the version,
#      serves set/get on a free loopback port and keeps the key across a
#      restart (check_nvcached.py)
cmake_minimum_required(VERSION 3.18)
foreach(var BUILD_DIR WORK SOURCE_DIR VERSION VERSION_MAJOR SONAME LIBDIR INCLUDEDIR
            BINDIR MANDIR DOCDIR CC GENERATOR PKG_CONFIG OBJDUMP)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_install_test.cmake: -D${var}=... missing")
  endif()
endforeach()
separate_arguments(extra_flags UNIX_COMMAND "${EXTRA_FLAGS}")   # sanitizer builds

function(run)
  cmake_parse_arguments(R "" "WORKING_DIRECTORY;OUTPUT" "" ${ARGN})
  if(NOT R_WORKING_DIRECTORY)
    set(R_WORKING_DIRECTORY ${WORK})
  endif()
  string(REPLACE ";" " " shown "${R_UNPARSED_ARGUMENTS}")
  message(STATUS "$ ${shown}")
  execute_process(COMMAND ${R_UNPARSED_ARGUMENTS} WORKING_DIRECTORY ${R_WORKING_DIRECTORY}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${shown}\n${out}")
  endif()
  if(R_OUTPUT)
    string(STRIP "${out}" out)
    set(${R_OUTPUT} "${out}" PARENT_SCOPE)
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(prefix ${WORK}/prefix)

# ---- 1. install ----------------------------------------------------------------
unset(ENV{DESTDIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
set(expected_files
  ${INCLUDEDIR}/nvheap.h
  ${LIBDIR}/libnvheap.a
  ${LIBDIR}/libnvheap.so
  ${LIBDIR}/${SONAME}
  ${LIBDIR}/libnvheap.so.${VERSION}
  ${BINDIR}/nvheap
  ${LIBDIR}/pkgconfig/nvheap.pc
  ${LIBDIR}/cmake/nvheap/nvheapConfig.cmake
  ${LIBDIR}/cmake/nvheap/nvheapConfigVersion.cmake
  ${LIBDIR}/cmake/nvheap/nvheapTargets.cmake
  ${MANDIR}/man1/nvheap.1
  ${MANDIR}/man3/libnvheap.3
  ${DOCDIR}/README.md
  ${DOCDIR}/FORMAT.md)
foreach(f ${expected_files})
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()

# ---- 2. the CLI ------------------------------------------------------------------
run(${prefix}/${BINDIR}/nvheap --version OUTPUT cli_version)
if(NOT cli_version MATCHES "^nvheap ${VERSION} ")
  message(FATAL_ERROR "installed nvheap --version printed '${cli_version}', expected nvheap ${VERSION}")
endif()

# ---- 3. pkg-config ------------------------------------------------------------------
set(ENV{PKG_CONFIG_PATH} ${prefix}/${LIBDIR}/pkgconfig)
run(${PKG_CONFIG} --modversion nvheap OUTPUT pc_version)
if(NOT pc_version STREQUAL VERSION)
  message(FATAL_ERROR "pkg-config --modversion nvheap printed '${pc_version}', expected ${VERSION}")
endif()
run(${PKG_CONFIG} --cflags --libs nvheap OUTPUT pc_flags)
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
run(${CC} -std=c11 -Wall -Wextra -Werror ${extra_flags} ${SOURCE_DIR}/consumer/consumer.c
    ${pc_flags} -Wl,-rpath,${prefix}/${LIBDIR} -o ${WORK}/consumer_pc)
run(${OBJDUMP} -p ${WORK}/consumer_pc OUTPUT dyn)
if(NOT dyn MATCHES "NEEDED +${SONAME}")
  message(FATAL_ERROR "consumer_pc does not load ${SONAME}:\n${dyn}")
endif()
run(${WORK}/consumer_pc ${WORK}/pc.pool)

# ---- 4. find_package -----------------------------------------------------------------
string(REPLACE ";" " " extra_flags_str "${extra_flags}")
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/consumer -B ${WORK}/cmake-build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${CC} -DCMAKE_BUILD_TYPE=Debug
    "-DCMAKE_C_FLAGS=${extra_flags_str}" "-DCMAKE_EXE_LINKER_FLAGS=${extra_flags_str}"
    -DNVHEAP_EXPECTED_VERSION=${VERSION} -DNVHEAP_EXPECTED_MAJOR=${VERSION_MAJOR})
run(${CMAKE_COMMAND} --build ${WORK}/cmake-build)
run(${OBJDUMP} -p ${WORK}/cmake-build/consumer_shared OUTPUT dyn)
if(NOT dyn MATCHES "NEEDED +${SONAME}")
  message(FATAL_ERROR "consumer_shared does not load ${SONAME}")
endif()
run(${OBJDUMP} -p ${WORK}/cmake-build/consumer_static OUTPUT dyn)
if(dyn MATCHES "NEEDED +libnvheap")
  message(FATAL_ERROR "consumer_static loads libnvheap dynamically")
endif()
run(${WORK}/cmake-build/consumer_shared ${WORK}/cmake-shared.pool)
run(${WORK}/cmake-build/consumer_static ${WORK}/cmake-static.pool)

# ---- 5. nvcached ------------------------------------------------------------------
if(NVCACHED)
  if(NOT EXISTS ${prefix}/${BINDIR}/nvcached)
    message(FATAL_ERROR "cmake --install did not install ${BINDIR}/nvcached")
  endif()
  run(${PYTHON} ${SOURCE_DIR}/check_nvcached.py ${prefix}/${BINDIR}/nvcached ${VERSION} ${WORK})
endif()

file(REMOVE_RECURSE ${WORK})
message(STATUS "installed nvheap ${VERSION} works with pkg-config and find_package")
