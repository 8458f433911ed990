# pmdk_tree_map.cmake — compile PMDK's btree_map example into bench_btree.
#
# Debian's libpmemobj-dev installs the example sources as documentation
# (/usr/share/doc/libpmemobj-dev/examples/tree_map, possibly gzipped). They
# are copied (or decompressed) into the build directory at build time and
# compiled from there — never copied into the repository. Without them,
# bench_btree still builds and notes that PMDK was not measured.
set(NVH_PMDK_TREE_MAP_DIR /usr/share/doc/libpmemobj-dev/examples/tree_map
    CACHE PATH "Where PMDK's tree_map example sources are installed")
if(TARGET bench_btree)
  get_target_property(nvh_btree_type bench_btree TYPE)
endif()
if(TARGET bench_btree AND nvh_btree_type STREQUAL "EXECUTABLE")
  set(out ${CMAKE_CURRENT_BINARY_DIR}/pmdk_tree_map)
  set(found TRUE)
  set(generated "")
  foreach(f btree_map.c btree_map.h)
    if(EXISTS ${NVH_PMDK_TREE_MAP_DIR}/${f})
      add_custom_command(OUTPUT ${out}/${f}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
        COMMAND ${CMAKE_COMMAND} -E copy ${NVH_PMDK_TREE_MAP_DIR}/${f} ${out}/${f}
        DEPENDS ${NVH_PMDK_TREE_MAP_DIR}/${f} VERBATIM)
    elseif(EXISTS ${NVH_PMDK_TREE_MAP_DIR}/${f}.gz)
      add_custom_command(OUTPUT ${out}/${f}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
        COMMAND sh -c "gzip -dc '${NVH_PMDK_TREE_MAP_DIR}/${f}.gz' > '${out}/${f}'"
        DEPENDS ${NVH_PMDK_TREE_MAP_DIR}/${f}.gz VERBATIM)
    else()
      set(found FALSE)
    endif()
    list(APPEND generated ${out}/${f})
  endforeach()
  if(found)
    target_sources(bench_btree PRIVATE ${generated})
    target_include_directories(bench_btree PRIVATE ${out})
    target_compile_definitions(bench_btree PRIVATE NVH_BENCH_PMDK_BTREE=1)
    # third-party example code: not held to the project's -Werror
    set_source_files_properties(${out}/btree_map.c PROPERTIES GENERATED TRUE
      COMPILE_OPTIONS "-w;-Wno-error;-std=gnu11")
  else()
    message(STATUS "bench_btree: PMDK tree_map example not found in ${NVH_PMDK_TREE_MAP_DIR}; pmdk not measured")
  endif()
endif()
