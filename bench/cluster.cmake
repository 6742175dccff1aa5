# sluice-bench-cluster: the cluster's costs without etcd, for sizing a large
# cluster (bench_cluster.cc): a node's summary of its stages (size, time), and
# the controller's step over many nodes (decode, policy, encode) per node.
add_executable(sluice-bench-cluster ${CMAKE_CURRENT_LIST_DIR}/bench_cluster.cc)
target_link_libraries(sluice-bench-cluster PRIVATE sluice_control sluice_warnings)
# Checks that a small run completes and reports, not the time it takes.
add_test(NAME bench_cluster_smoke COMMAND sluice-bench-cluster --quick)
set_tests_properties(bench_cluster_smoke PROPERTIES LABELS smoke TIMEOUT 60)
add_test(NAME bench_cluster_pisces_smoke COMMAND sluice-bench-cluster --quick --policy pisces)
set_tests_properties(bench_cluster_pisces_smoke PROPERTIES LABELS smoke TIMEOUT 60)
