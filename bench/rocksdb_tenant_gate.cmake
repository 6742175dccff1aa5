# What the RocksDB tenant gate adds per Put that does not wait: sluice-bench-tenant-gate.
if(TARGET sluice::rocksdb)
  add_executable(sluice-bench-tenant-gate rocksdb_tenant_gate.cc)
  target_link_libraries(sluice-bench-tenant-gate PRIVATE sluice::rocksdb sluice::objects
                                                 sluice_bench_support sluice_warnings)
  # Checks that every variant runs and prints its line, not the numbers.
  add_test(NAME bench_tenant_gate_smoke
           COMMAND sluice-bench-tenant-gate --ops 2000 --rounds 2
                   --dir ${CMAKE_CURRENT_BINARY_DIR}/bench-tenant-gate-smoke)
  set_tests_properties(bench_tenant_gate_smoke PROPERTIES LABELS smoke
                       PASS_REGULAR_EXPRESSION "gate-stage +[0-9]")
endif()
