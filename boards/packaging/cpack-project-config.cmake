# Read by cpack (CPACK_PROJECT_CONFIG_FILE) when it packages a board's worker: Depends comes
# from the built program (packaging/debian-depends.sh), so it follows what it really links.
if(CPACK_GENERATOR STREQUAL "DEB" AND CPACK_EDGETRAIN_DEPENDS_SCRIPT)
  include("${CPACK_EDGETRAIN_BINARY_FILE}")
  execute_process(COMMAND bash "${CPACK_EDGETRAIN_DEPENDS_SCRIPT}" "${EDGETRAIN_PACKAGED_BINARY}" "${CPACK_EDGETRAIN_SHLIBS_DEBS}"
                  OUTPUT_VARIABLE _depends OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _status)
  if(NOT _status EQUAL 0 OR _depends STREQUAL "")
    message(FATAL_ERROR "cannot derive the Depends of ${EDGETRAIN_PACKAGED_BINARY} (see the message above)")
  endif()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "${_depends}, ${CPACK_EDGETRAIN_EXTRA_DEPENDS}")
endif()
