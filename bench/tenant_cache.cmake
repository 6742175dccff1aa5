# The tenant-aware block cache against RocksDB's NewLRUCache: readrandom with a cache
# that holds the working set (interleaved runs, min/median/max, ratio of the medians)
# and the caches' per-operation cost on 1 and 2 threads: sluice-bench-tenant-cache.
if(TARGET sluice::rocksdb)
  add_executable(sluice-bench-tenant-cache bench_tenant_cache.cc)
  target_link_libraries(sluice-bench-tenant-cache PRIVATE sluice::rocksdb sluice::objects
                                                  sluice_warnings)
  # Checks that both caches run and the summary is complete, not the numbers.
  add_test(NAME bench_tenant_cache_smoke
           COMMAND sluice-bench-tenant-cache --quick
                   --dir ${CMAKE_CURRENT_BINARY_DIR}/bench-tenant-cache-smoke)
  set_tests_properties(bench_tenant_cache_smoke PROPERTIES LABELS smoke
                       PASS_REGULAR_EXPRESSION "\"insert_evict\":[0-9].*\"ratio_of_medians\":[0-9]")
endif()
