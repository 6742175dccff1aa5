add_executable(sluice-bench-enforce ${CMAKE_CURRENT_LIST_DIR}/bench_enforce.cc)
target_link_libraries(sluice-bench-enforce PRIVATE sluice::objects sluice_bench_support sluice_warnings)
# The rocksdb-limiter baseline (RocksDB's GenericRateLimiter), when RocksDB is found.
if(TARGET RocksDB::rocksdb-shared)
  target_link_libraries(sluice-bench-enforce PRIVATE RocksDB::rocksdb-shared)
  target_compile_definitions(sluice-bench-enforce PRIVATE SLUICE_BENCH_ROCKSDB=1)
endif()
install(TARGETS sluice-bench-enforce RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
