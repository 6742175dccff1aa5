# The shapes the build's own targets share, for the CMakeLists.txt files of
# every folder (included by the top-level CMakeLists.txt).

# sluice_add_library(<name> EXPORT_NAME <export> SOURCES <files...>
#                    [PUBLIC <libs...>] [PRIVATE <libs...>])
# An installed static library of the sluice package: <name> (also its file
# name), aliased sluice::<export> here and exported as sluice::<export> to
# find_package(sluice); its public headers are the folder's include/
# (installed by the caller); built with the project's warnings, which do not
# reach its users.
function(sluice_add_library name)
  cmake_parse_arguments(L "" "EXPORT_NAME" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  add_library(sluice::${L_EXPORT_NAME} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${L_EXPORT_NAME} OUTPUT_NAME ${name})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${name}
    PUBLIC ${L_PUBLIC}
    PRIVATE ${L_PRIVATE} $<BUILD_INTERFACE:sluice_warnings>)
  install(TARGETS ${name} EXPORT sluiceTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# sluice_add_parts(): the folder's parts, so that rooms do not edit a shared
# list: every CMake fragment of its own (<name>.cmake, included in name
# order) and every subfolder with a CMakeLists.txt. A macro: a fragment runs
# in the folder's own scope, as if written there.
macro(sluice_add_parts)
  file(GLOB sluice_parts CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cmake)
  foreach(part ${sluice_parts})
    include(${part})
  endforeach()
  file(GLOB sluice_dirs LIST_DIRECTORIES true CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*)
  foreach(dir ${sluice_dirs})
    if(IS_DIRECTORY ${dir} AND EXISTS ${dir}/CMakeLists.txt)
      add_subdirectory(${dir})
    endif()
  endforeach()
endmacro()
