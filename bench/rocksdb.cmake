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
  target_link_libraries(rocksdb_fs_micro PRIVATE sluice::rocksdb sluice_warnings)
endif()
