// Opening a RocksDB database in a benchmark or example program: the database,
// or null after saying on stderr which path failed and why. Header-only, for
// the programs that link RocksDB (sluice_bench_support itself does not).
//
// Thread safety: as rocksdb::DB::Open.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include <rocksdb/db.h>
#include <rocksdb/options.h>

namespace sluice::bench {

// Opens the database at `path` with `options`. On failure prints
// "<prefix>open <path>: <RocksDB's reason>" to stderr and returns null.
inline std::unique_ptr<rocksdb::DB> open_db(const rocksdb::Options& options,
                                            const std::string& path, const char* prefix = "") {
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(options, path, &raw);
  if (!s.ok()) {
    std::fprintf(stderr, "%sopen %s: %s\n", prefix, path.c_str(), s.ToString().c_str());
    return nullptr;
  }
  return std::unique_ptr<rocksdb::DB>(raw);
}

}  // namespace sluice::bench
