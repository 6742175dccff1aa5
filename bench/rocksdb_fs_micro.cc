// Per-I/O cost of the RocksDB binding, isolated from RocksDB's own work: the same file
// operations through FileSystem::Default() and through a StageFileSystem on a stage with
// no rules (pass-through) and with per-origin noop channels, interleaved, several rounds.
//   4 KiB random reads from a page-cached file (FSRandomAccessFile::Read)
//   100 B appends to a writable file (FSWritableFile::Append; the OS write included)
// Prints JSON lines and a table: ns per operation min/median/max and the difference.
// Time is the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so that being preempted by
// other processes on a busy machine does not count; the OS work of each call does.
//
// Usage: rocksdb_fs_micro [--ops N] [--rounds R] [--dir DIR]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <rocksdb/file_system.h>

#include "rocksdb_rules.h"
#include "sluice/objects/builtin.h"
#include "sluice/rocksdb.h"
#include "sluice/stage.h"
#include "support/percentile.h"

namespace {

namespace rdb = ::rocksdb;
double cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

double read_ns(rdb::FileSystem& fs, const std::string& path, std::size_t ops,
               std::uint64_t file_size) {
  std::unique_ptr<rdb::FSRandomAccessFile> f;
  if (!fs.NewRandomAccessFile(path, rdb::FileOptions(), &f, nullptr).ok()) std::abort();
  std::vector<char> scratch(4096);
  std::mt19937_64 rng(1);
  rdb::Slice result;
  const rdb::IOOptions io;
  const double t0 = cpu_ns();
  for (std::size_t i = 0; i < ops; ++i) {
    const std::uint64_t off = (rng() % (file_size / 4096)) * 4096;
    if (!f->Read(off, 4096, io, &result, scratch.data(), nullptr).ok()) std::abort();
  }
  return (cpu_ns() - t0) / static_cast<double>(ops);
}

double append_ns(rdb::FileSystem& fs, const std::string& path, std::size_t ops) {
  std::unique_ptr<rdb::FSWritableFile> f;
  if (!fs.NewWritableFile(path, rdb::FileOptions(), &f, nullptr).ok()) std::abort();
  const std::string data(100, 'x');
  const rdb::IOOptions io;
  const double t0 = cpu_ns();
  for (std::size_t i = 0; i < ops; ++i) {
    if (!f->Append(data, io, nullptr).ok()) std::abort();
  }
  const double ns = (cpu_ns() - t0) / static_cast<double>(ops);
  f->Close(io, nullptr).PermitUncheckedError();
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  std::size_t ops = 200000;
  int rounds = 5;
  std::string dir = "/tmp/sluice-rocksdb-fs-micro";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--ops") ops = std::strtoull(argv[i + 1], nullptr, 10);
    if (k == "--rounds") rounds = std::atoi(argv[i + 1]);
    if (k == "--dir") dir = argv[i + 1];
  }
  std::filesystem::create_directories(dir);
  const std::string data_file = dir + "/000001.sst";  // a table file: foreground reads
  const std::uint64_t file_size = 64 << 20;
  {
    auto base = rdb::FileSystem::Default();
    std::unique_ptr<rdb::FSWritableFile> f;
    if (!base->NewWritableFile(data_file, rdb::FileOptions(), &f, nullptr).ok()) return 1;
    const std::string block(1 << 20, 'd');
    for (std::uint64_t i = 0; i < file_size / block.size(); ++i) {
      if (!f->Append(block, rdb::IOOptions(), nullptr).ok()) return 1;
    }
    f->Close(rdb::IOOptions(), nullptr).PermitUncheckedError();
  }

  auto plain_stage = sluice::Stage::create({});
  auto noop_stage = sluice::Stage::create({});
  if (!plain_stage.is_ok() || !noop_stage.is_ok()) return 1;
  if (!(*noop_stage)->apply(sluice::bench::per_origin_noop_rules()).is_ok()) return 1;
  auto base = rdb::FileSystem::Default();
  sluice::rocksdb_binding::StageFileSystem pass(base, **plain_stage);
  sluice::rocksdb_binding::StageFileSystem noop(base, **noop_stage);
  struct Variant {
    const char* name;
    rdb::FileSystem* fs;
    std::vector<double> read, append;
  };
  std::vector<Variant> vs = {{"plain", base.get(), {}, {}},
                             {"stage-no-rules", &pass, {}, {}},
                             {"stage-noop-channels", &noop, {}, {}}};
  read_ns(*base, data_file, ops / 4, file_size);  // warm the page cache
  for (int r = 0; r < rounds; ++r) {
    for (auto& v : vs) {
      v.read.push_back(read_ns(*v.fs, data_file, ops, file_size));
      v.append.push_back(append_ns(*v.fs, dir + "/000002.log", ops));
    }
  }
  std::filesystem::remove_all(dir);

  const double base_read = sluice::bench::spread(vs[0].read).median;
  const double base_append = sluice::bench::spread(vs[0].append).median;
  std::printf("%-20s %-7s %28s %10s\n", "variant", "op", "CPU ns/op min / median / max",
              "delta ns");
  for (auto& v : vs) {
    for (auto [op, xs, b] :
         {std::tuple{"read4k", &v.read, base_read}, std::tuple{"append", &v.append, base_append}}) {
      const sluice::bench::Spread x = sluice::bench::spread(*xs);
      std::printf("%-20s %-7s %8.0f / %8.0f / %8.0f %+10.0f\n", v.name, op, x.min, x.median, x.max,
                  x.median - b);
      std::fprintf(stderr,
                   "{\"variant\":\"%s\",\"op\":\"%s\",\"ns_min\":%.1f,\"ns_median\":%.1f,"
                   "\"ns_max\":%.1f,\"delta_ns\":%.1f}\n",
                   v.name, op, x.min, x.median, x.max, x.median - b);
    }
  }
  return 0;
}
