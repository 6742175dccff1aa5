# The shapes the build's own targets share, for the CMakeLists.txt files of
# every folder (included by the top-level CMakeLists.txt).

# sluice_add_library(<name> EXPORT_NAME <export> SOURCES <files...>
#                    [PUBLIC <libs...>] [PRIVATE <libs...>] [PCH <headers...>])
# An installed static library of the sluice package: <name> (also its file
# name), aliased sluice::<export> here and exported as sluice::<export> to
# find_package(sluice); its public headers are the folder's include/
# (installed by the caller), and the headers the build's own targets may use
# but the package does not install are its internal/; built with the
# project's warnings, which do not reach its users, and the common
# precompiled headers plus PCH's, in unity batches (sluice_unity).
function(sluice_add_library name)
  cmake_parse_arguments(L "" "EXPORT_NAME" "SOURCES;PUBLIC;PRIVATE;PCH" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  add_library(sluice::${L_EXPORT_NAME} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${L_EXPORT_NAME} OUTPUT_NAME ${name})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/internal)
    target_include_directories(${name} PUBLIC
      $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/internal>)
  endif()
  target_link_libraries(${name}
    PUBLIC ${L_PUBLIC}
    PRIVATE ${L_PRIVATE} $<BUILD_INTERFACE:sluice_warnings>)
  sluice_pch(${name} ${L_PCH})
  sluice_unity(${name})
  install(TARGETS ${name} EXPORT sluiceTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# sluice_no_undefined(<shared library>): every symbol the library uses must be
# resolved when it is linked, but for clang's TSan's: clang links that runtime
# into the instrumented program, which provides them (CMakeLists.txt).
function(sluice_no_undefined target)
  if(NOT (SLUICE_SANITIZE MATCHES "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang"))
    target_link_options(${target} PRIVATE -Wl,--no-undefined)
  endif()
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

# Precompiled headers. The third-party headers dominate a compile here: every
# source that includes nlohmann/json, Boost.Asio, spdlog, Catch2 or RocksDB's
# headers spends most of its time parsing them. A library precompiles its own
# set once (sluice_pch); the test rooms share one (tests/CMakeLists.txt).
# Every source still includes what it uses (the thread-safety check parses the
# libraries' sources without them; SLUICE_PCH=OFF builds without).
option(SLUICE_PCH "Precompile the heavy third-party headers" ON)
set(SLUICE_PCH_HEADERS <nlohmann/json.hpp> <algorithm> <atomic> <chrono> <cstdint> <functional>
    <map> <memory> <mutex> <optional> <string> <string_view> <thread> <vector>)

# sluice_pch(<target> [<header>...]): <target>'s sources start from the common
# headers and the extra ones given, precompiled for that target.
function(sluice_pch target)
  if(SLUICE_PCH)
    target_precompile_headers(${target} PRIVATE ${SLUICE_PCH_HEADERS} ${ARGN})
  endif()
endfunction()

# sluice_reuse_pch(<target> <from>): <target> uses <from>'s precompiled
# headers (<from> and <target> must compile with the same options and macros).
function(sluice_reuse_pch target from)
  if(SLUICE_PCH)
    target_precompile_headers(${target} REUSE_FROM ${from})
  endif()
endfunction()

# sluice_programs_pch(<owner> [<header>...]): every executable defined under
# the calling folder (benchmarks, examples: one source each, so a PCH of their
# own would save nothing) uses one set of precompiled headers, owned by the
# executable <owner>, made by the first call. Call it after the folder's parts
# are added.
function(sluice_programs_pch owner)
  if(NOT SLUICE_PCH)
    return()
  endif()
  if(NOT TARGET ${owner})
    add_executable(${owner} ${PROJECT_SOURCE_DIR}/cmake/pch.cc)
    target_link_libraries(${owner} PRIVATE nlohmann_json::nlohmann_json sluice_warnings)
    sluice_pch(${owner} ${ARGN})
  endif()
  set(dirs ${CMAKE_CURRENT_SOURCE_DIR})
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(t ${targets})
      get_target_property(type ${t} TYPE)
      if(type STREQUAL "EXECUTABLE" AND NOT t STREQUAL owner)
        sluice_reuse_pch(${t} ${owner})
      endif()
    endforeach()
  endwhile()
endfunction()

# Unity builds: a library's sources compile in batches of eight, one compiler
# run each, so that the templates they share (nlohmann/json's above all) are
# instantiated and optimised once a batch rather than once a source. Each
# source stays self-contained (names private to a source live in an anonymous
# namespace and must not collide with another source's); diagnostics still
# name the source and line. SLUICE_UNITY=OFF compiles source by source.
option(SLUICE_UNITY "Compile libraries in unity batches" ON)
function(sluice_unity target)
  if(SLUICE_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    # A batch includes the sources, so g++ takes a source's own class with a
    # member of an anonymous-namespace type for a header's: not so here.
    target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-subobject-linkage>)
  endif()
endfunction()
