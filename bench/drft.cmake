# sluice-bench-drft: the drft transaction scheduler's cost per transaction (admission,
# report, release), directly, through a stage, and with admissions that wait
# (bench/bench_drft.cc).
add_executable(sluice-bench-drft ${CMAKE_CURRENT_LIST_DIR}/bench_drft.cc)
target_link_libraries(sluice-bench-drft PRIVATE sluice::objects sluice_bench_support
                                                sluice_warnings)
# Checks that every variant runs and prints its line, not the numbers.
add_test(NAME bench_drft_smoke COMMAND sluice-bench-drft --quick --txns 2000)
set_tests_properties(bench_drft_smoke PROPERTIES LABELS smoke TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "\"variant\":\"contended\"")
