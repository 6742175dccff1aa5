# sluice-bench-drl: the drl token bucket's achieved rate and largest burst in
# real time (bench/bench_drl.cc).
add_executable(sluice-bench-drl ${CMAKE_CURRENT_LIST_DIR}/bench_drl.cc)
target_link_libraries(sluice-bench-drl PRIVATE sluice::objects sluice_bench_support sluice_warnings)
