# sluice-bench-rules-message: the stage side of one rules message (parse,
# apply, ack) alone, for callgrind instruction counts (bench_rules_message.cc).
add_executable(sluice-bench-rules-message ${CMAKE_CURRENT_LIST_DIR}/bench_rules_message.cc)
target_link_libraries(sluice-bench-rules-message PRIVATE sluice::stage sluice_warnings)
