# libpulse.so and what `cmake --install` installs (README "Installing").
#
# libpulse.so is the module libraries' objects linked into one shared
# library whose dynamic symbol table holds exactly the documented API: the
# functions the public headers declare (pulse_module_headers collects them),
# listed in a version script generated at build time from those headers and
# the archives (cmake/pulse_exports.cmake); every other symbol is local.
# The SONAME carries the ABI version (libpulse.so.${PULSE_ABI_VERSION}),
# raised whenever a public struct or signature changes incompatibly.
#
# Installed: the public headers (include/pulse/), libpulse.so, the module
# static libraries, the programs (tools/CMakeLists.txt), the CMake package
# (find_package(pulse) -> pulse::pulse), pulse.pc, and the Python package
# (python/pulse, into PULSE_PYTHON_DIR).
include(GNUInstallDirs)
set(PULSE_ABI_VERSION 0)
set(PULSE_PYTHON_DIR lib/python3/dist-packages CACHE STRING
    "Where cmake --install puts the Python package (relative to the prefix)")

set(PULSE_MODULE_LIBRARIES pulse_codec pulse_cuda)
foreach(lib pulse_trainer pulse_inference pulse_loco)
  if(TARGET ${lib})
    list(APPEND PULSE_MODULE_LIBRARIES ${lib})
  endif()
endforeach()
# Their objects go into a shared library (the stub pulse_cuda of a CUDA-off
# build too).
set_target_properties(${PULSE_MODULE_LIBRARIES} PROPERTIES POSITION_INDEPENDENT_CODE ON)
get_property(PULSE_PUBLIC_HEADERS GLOBAL PROPERTY PULSE_PUBLIC_HEADERS)

set(exports_map ${PROJECT_BINARY_DIR}/pulse.map)
set(exports_list ${PROJECT_BINARY_DIR}/pulse.exports)
set(archives "")
foreach(lib ${PULSE_MODULE_LIBRARIES})
  list(APPEND archives $<TARGET_FILE:${lib}>)
endforeach()
add_custom_command(
  OUTPUT ${exports_map} ${exports_list}
  COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} "-DHEADERS=${PULSE_PUBLIC_HEADERS}"
          "-DARCHIVES=${archives}" -DOUT=${exports_map} -DLIST=${exports_list}
          -P ${PROJECT_SOURCE_DIR}/cmake/pulse_exports.cmake
  DEPENDS ${PULSE_MODULE_LIBRARIES} ${PULSE_PUBLIC_HEADERS}
          ${PROJECT_SOURCE_DIR}/cmake/pulse_exports.cmake
  COMMENT "Export list of libpulse.so from the public headers"
  VERBATIM)
add_custom_target(pulse_exports DEPENDS ${exports_map})

set(objects "")
foreach(lib ${PULSE_MODULE_LIBRARIES})
  list(APPEND objects $<TARGET_OBJECTS:${lib}>)
endforeach()
add_library(pulse SHARED ${objects})
add_library(pulse::pulse ALIAS pulse)
add_dependencies(pulse pulse_exports)
# The archives' usage requirements (zstd, OpenSSL, libcurl, libmicrohttpd,
# the CUDA runtime, shared); their objects are already in.
target_link_libraries(pulse PRIVATE ${PULSE_MODULE_LIBRARIES})
target_link_options(pulse PRIVATE -Wl,--version-script=${exports_map})
if(NOT PULSE_SANITIZE AND NOT PULSE_FUZZ)
  # Every symbol resolved at link time (sanitizer runtimes are resolved by
  # the executable that loads the library, so not with them).
  target_link_options(pulse PRIVATE -Wl,--no-undefined)
endif()
set(include_dirs "")
foreach(lib ${PULSE_MODULE_LIBRARIES})
  list(APPEND include_dirs $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include/${lib}>)
endforeach()
target_include_directories(pulse INTERFACE ${include_dirs}
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/pulse>)
set_target_properties(pulse PROPERTIES
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PULSE_ABI_VERSION}
  LINK_DEPENDS ${exports_map}
  EXPORT_NAME pulse)

install(TARGETS pulse EXPORT pulse-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pulse)
install(TARGETS ${PULSE_MODULE_LIBRARIES} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PULSE_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pulse)

include(CMakePackageConfigHelpers)
set(cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/pulse)
install(EXPORT pulse-targets NAMESPACE pulse:: DESTINATION ${cmake_dir})
file(WRITE ${PROJECT_BINARY_DIR}/pulse-config.cmake.in
     "@PACKAGE_INIT@\ninclude(\${CMAKE_CURRENT_LIST_DIR}/pulse-targets.cmake)\n"
     "check_required_components(pulse)\n")
configure_package_config_file(${PROJECT_BINARY_DIR}/pulse-config.cmake.in
                              ${PROJECT_BINARY_DIR}/pulse-config.cmake
                              INSTALL_DESTINATION ${cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pulse-config-version.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pulse-config.cmake
              ${PROJECT_BINARY_DIR}/pulse-config-version.cmake
        DESTINATION ${cmake_dir})

# The prefix relative to the .pc file, so that `cmake --install --prefix`
# anywhere gives a working pulse.pc.
file(RELATIVE_PATH PULSE_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
configure_file(${PROJECT_SOURCE_DIR}/cmake/pulse.pc.in ${PROJECT_BINARY_DIR}/pulse.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pulse.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The Python package, and where it finds libpulse.so once installed (a path
# relative to itself, so that DESTDIR and moved prefixes keep working).
set(python_src ${PROJECT_SOURCE_DIR}/python/pulse)
if(EXISTS ${python_src})
  file(RELATIVE_PATH lib_from_package ${CMAKE_INSTALL_PREFIX}/${PULSE_PYTHON_DIR}/pulse
       ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR})
  file(WRITE ${PROJECT_BINARY_DIR}/python/_installed.py
       "# Written by cmake --install: libpulse.so relative to this package.\n"
       "LIBRARY = \"${lib_from_package}/libpulse.so.${PULSE_ABI_VERSION}\"\n")
  install(DIRECTORY ${python_src} DESTINATION ${PULSE_PYTHON_DIR}
          PATTERN __pycache__ EXCLUDE)
  install(FILES ${PROJECT_BINARY_DIR}/python/_installed.py
          DESTINATION ${PULSE_PYTHON_DIR}/pulse)
endif()
