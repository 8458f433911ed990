# cmake/install.cmake — what `cmake --install` puts where (GNUInstallDirs):
#
#   include/nvheap.h                       the API
#   lib/libnvheap.so.MAJOR, libnvheap.a    shared and static library
#   bin/nvheap                             the CLI (tools/CMakeLists.txt)
#   lib/pkgconfig/nvheap.pc                pkg-config --cflags --libs nvheap
#   lib/cmake/nvheap/                      find_package(nvheap CONFIG):
#                                          nvheap::nvheap (shared),
#                                          nvheap::nvheap_static
#   share/man/man1/nvheap.1, man3/libnvheap.3   (from man/*.in)
#   share/doc/nvheap/                      README.md and docs/
#
# Every installed file is relocatable: the pkg-config file finds the prefix
# from its own location (${pcfiledir}), the CMake package from its own, so
# `cmake --install build --prefix DIR` works for any DIR, and so does DESTDIR.
include(CMakePackageConfigHelpers)

set(NVH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/nvheap)

install(FILES ${PROJECT_SOURCE_DIR}/include/nvheap.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS nvheap_shared nvheap_static EXPORT nvheap-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT nvheap-targets NAMESPACE nvheap:: FILE nvheapTargets.cmake
        DESTINATION ${NVH_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/nvheapConfig.cmake.in
  ${PROJECT_BINARY_DIR}/nvheapConfig.cmake INSTALL_DESTINATION ${NVH_CMAKE_DIR})
# Same major version = same SONAME = compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/nvheapConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/nvheapConfig.cmake ${PROJECT_BINARY_DIR}/nvheapConfigVersion.cmake
        DESTINATION ${NVH_CMAKE_DIR})

# pkg-config: prefix relative to the .pc file's directory, unless the
# directories were given as absolute paths.
set(NVH_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
set(NVH_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(NVH_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(NVH_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH nvh_pc_up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" nvh_pc_up "${nvh_pc_up}")
  set(NVH_PC_PREFIX "\${pcfiledir}/${nvh_pc_up}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(NVH_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/nvheap.pc.in ${PROJECT_BINARY_DIR}/nvheap.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/nvheap.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Man pages are written in roff (man/*.in: no generator needed); only the
# version is filled in. tests/install/test_man checks them with groff.
foreach(page nvheap.1 libnvheap.3)
  configure_file(${PROJECT_SOURCE_DIR}/man/${page}.in ${PROJECT_BINARY_DIR}/man/${page} @ONLY)
  string(REGEX REPLACE ".*\\." "" section ${page})
  install(FILES ${PROJECT_BINARY_DIR}/man/${page} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section})
endforeach()

install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
