# sluice-bench-rules-message: the stage side of one rules message (parse,
# apply, ack) alone, for callgrind instruction counts (bench_rules_message.cc).
add_executable(sluice-bench-rules-message ${CMAKE_CURRENT_LIST_DIR}/bench_rules_message.cc)
target_link_libraries(sluice-bench-rules-message PRIVATE sluice::objects sluice_warnings)
# Checks that both kinds of message apply without error (the bench exits 1 otherwise), not the
# time they take.
add_test(NAME bench_rules_message_smoke
         COMMAND sh -c "$<TARGET_FILE:sluice-bench-rules-message> 200 --change configure && $<TARGET_FILE:sluice-bench-rules-message> 200 --change layout --stages 3")
set_tests_properties(bench_rules_message_smoke PROPERTIES LABELS smoke TIMEOUT 60)
