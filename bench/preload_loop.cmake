# sluice-preload-loop: a bare pread loop to count the preload's instructions
# per call under callgrind. See bench/preload_loop.cc.
add_executable(sluice-preload-loop ${CMAKE_CURRENT_LIST_DIR}/preload_loop.cc)
target_link_libraries(sluice-preload-loop PRIVATE sluice_warnings)
