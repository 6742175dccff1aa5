# sluice-bench-control: control-plane CPU, collect round time and rule
# propagation latency with 10/100/1000 simulated stages (bench_control.cc).
add_executable(sluice-bench-control ${CMAKE_CURRENT_LIST_DIR}/bench_control.cc)
target_link_libraries(sluice-bench-control PRIVATE sluice_control sluice_bench_support sluice_warnings)
# Checks the pipeline (daemon, stages, every kind of change, the boards and the probe, the
# floor), not the numbers:
# the bench exits non-zero when a run fails or its stages see errors.
add_test(NAME bench_control_smoke
         COMMAND sluice-bench-control --stages 10 --hz 10 --runs 1 --seconds 0.2 --updates 2
                 --change all --probe-us 0)
set_tests_properties(bench_control_smoke PROPERTIES LABELS smoke TIMEOUT 120)
