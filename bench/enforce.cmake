add_executable(sluice-bench-enforce ${CMAKE_CURRENT_LIST_DIR}/bench_enforce.cc)
target_link_libraries(sluice-bench-enforce PRIVATE sluice::stage sluice_warnings)
install(TARGETS sluice-bench-enforce RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
