# sluice-bench-control: control-plane CPU, collect round time and rule
# propagation latency with 10/100/1000 simulated stages (bench_control.cc).
add_executable(sluice-bench-control ${CMAKE_CURRENT_LIST_DIR}/bench_control.cc)
target_link_libraries(sluice-bench-control PRIVATE sluice_control sluice_warnings)
