# sluice-bench-preload: ns per call of pread/pwrite natively and under
# libsluice_preload.so (pass-through, Noop, DRL). See bench/bench_preload.cc.
add_executable(sluice-bench-preload ${CMAKE_CURRENT_LIST_DIR}/bench_preload.cc)
target_link_libraries(sluice-bench-preload PRIVATE sluice_bench_support sluice_warnings ${CMAKE_DL_LIBS})
target_compile_definitions(sluice-bench-preload PRIVATE
  SLUICE_PRELOAD_SO="$<TARGET_FILE:sluice_preload>")
add_dependencies(sluice-bench-preload sluice_preload)
