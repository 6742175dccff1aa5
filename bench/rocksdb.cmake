# RocksDB binding overhead: db_bench with and without the plugin (rocksdb_overhead.sh).
#   ninja bench_rocksdb_overhead      (results in <build>/bench/rocksdb_overhead/)
if(TARGET sluice_rocksdb_plugin)
  add_custom_target(bench_rocksdb_overhead
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/rocksdb_overhead.sh
            --plugin $<TARGET_FILE:sluice_rocksdb_plugin>
            --out ${CMAKE_CURRENT_BINARY_DIR}/rocksdb_overhead
    DEPENDS sluice_rocksdb_plugin
    USES_TERMINAL
    COMMENT "db_bench overhead: plain RocksDB vs the sluice plugin with a pass-through stage")
endif()

# Per-I/O cost of the file-system wrapper alone (no RocksDB work): rocksdb_fs_micro.
if(TARGET sluice::rocksdb)
  add_executable(rocksdb_fs_micro rocksdb_fs_micro.cc)
  target_link_libraries(rocksdb_fs_micro PRIVATE sluice::rocksdb sluice::objects sluice_bench_support
                                         sluice_warnings)
endif()

# The binding's overhead as paired in-process ratios (alternating blocks on a plain and a
# bound DB): sluice-bench-rocksdb.
if(TARGET sluice::rocksdb)
  add_executable(sluice-bench-rocksdb rocksdb_paired.cc)
  target_link_libraries(sluice-bench-rocksdb PRIVATE sluice::rocksdb sluice::objects
                                             sluice_bench_support sluice_warnings)
endif()
if(TARGET sluice-bench-rocksdb)
  # Checks the pipeline (both DBs, every workload, a numeric p99 interval, the summary),
  # not the numbers.
  add_test(NAME bench_rocksdb_smoke
           COMMAND sluice-bench-rocksdb --pairs 10 --keys 5000
                   --dir ${CMAKE_CURRENT_BINARY_DIR}/bench-rocksdb-smoke)
  set_tests_properties(bench_rocksdb_smoke PROPERTIES LABELS smoke
                       PASS_REGULAR_EXPRESSION
                       "\"p99_ratio_ci95_low\":[0-9][^}]*\"workload\":\"readwhilewriting\"")
endif()
