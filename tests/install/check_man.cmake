# check_man.cmake — each man page renders with groff without a warning
# (-ww: all warnings; -z: no output). -DGROFF=groff -DMAN_DIR=build/man
cmake_minimum_required(VERSION 3.18)
file(GLOB pages ${MAN_DIR}/*.[1-9])
if(NOT pages)
  message(FATAL_ERROR "no man pages in ${MAN_DIR}")
endif()
foreach(page IN LISTS pages)
  execute_process(COMMAND ${GROFF} -man -ww -z -Tutf8 ${page}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT err STREQUAL "")
    message(FATAL_ERROR "${page}: groff reports:\n${err}")
  endif()
  message(STATUS "${page}: ok")
endforeach()
