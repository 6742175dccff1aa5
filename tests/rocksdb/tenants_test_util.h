// What the tenant gate's tests share: two tenant column families "a" and "b" on
// a real RocksDB behind a gate, and their keys and values.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <rocksdb/db.h>
#include <catch2/catch.hpp>

#include "sluice/rocksdb_tenants.h"

namespace rb = sluice::rocksdb_binding;

namespace {

constexpr std::uint32_t kA = 1;
constexpr std::uint32_t kB = 2;

std::string tenant_key(const char* prefix, int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%06d", prefix, i);
  return buf;
}
std::string tenant_value(int i) {
  return std::string(100, static_cast<char>('a' + i % 26));
}

struct Opened {
  std::unique_ptr<rb::TenantGate> gate;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // default, a, b (owned by the gate)
  rocksdb::ColumnFamilyHandle* a() const { return handles[1]; }
  rocksdb::ColumnFamilyHandle* b() const { return handles[2]; }
};

rb::TenantGateOptions cf_gate(std::shared_ptr<rb::Admission> pool) {
  rb::TenantGateOptions g;
  g.admission = std::move(pool);
  g.tenants.mode = rb::TenantMode::kColumnFamily;
  g.tenants.cf_tenants = {{"a", kA}, {"b", kB}, {"default", 0}};
  g.refresh_interval = std::chrono::milliseconds(0);  // the listener alone
  return g;
}

// Two tenant column families with memtables large enough that only the gate flushes.
Opened open_two(const std::string& path, rb::TenantGateOptions g, rocksdb::DBOptions db = {}) {
  db.create_if_missing = true;
  db.create_missing_column_families = true;
  rocksdb::ColumnFamilyOptions cf;
  cf.write_buffer_size = 8 << 20;
  cf.arena_block_size = 4096;  // the memtable's size follows its contents closely
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
      {rocksdb::kDefaultColumnFamilyName, cf}, {"a", cf}, {"b", cf}};
  Opened o;
  auto r = rb::TenantGate::Open(db, path, cfs, &o.handles, std::move(g));
  INFO(r.status().to_string());
  REQUIRE(r.is_ok());
  o.gate = std::move(r).value();
  REQUIRE(o.handles.size() == 3);
  return o;
}

}  // namespace
