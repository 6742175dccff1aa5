// A stand-in for libFuzzer's driver, for a short deterministic run of a fuzz
// target in the ordinary build (ctest -L smoke): every seed file as it is,
// then mutations of the seeds (bytes flipped, replaced by JSON's punctuation,
// inserted, erased, repeated; seeds spliced together) drawn from a fixed
// random seed, until --runs inputs or --seconds have passed. It finds what
// blind mutations near the seeds find, every time the suite runs;
// scripts/fuzz.sh fuzzes for real (clang, libFuzzer's coverage guidance).
//
//   TARGET_smoke [--runs N] [--seconds S] [--seed N] [--max-len BYTES]
//                [--timeout S] SEED_DIR...
//
// A target reports a finding by crashing (__builtin_trap, a sanitizer); an
// input that crashes it, or runs longer than --timeout (default 10 s), is
// written to ./smoke-crash-<run> and the run fails.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

// The input being run, for the crash handler.
const std::string* g_current = nullptr;
std::uint64_t g_run = 0;

void on_crash(int sig) {
  if (g_current != nullptr) {
    char name[64];
    std::snprintf(name, sizeof(name), "smoke-crash-%llu", static_cast<unsigned long long>(g_run));
    const int fd = ::open(name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      (void)!::write(fd, g_current->data(), g_current->size());
      ::close(fd);
    }
    const char crashed[] = "fuzz smoke: the target crashed; input written to ./";
    const char slow[] = "fuzz smoke: an input ran past --timeout; it is in ./";
    if (sig == SIGALRM) {
      (void)!::write(2, slow, sizeof(slow) - 1);
    } else {
      (void)!::write(2, crashed, sizeof(crashed) - 1);
    }
    (void)!::write(2, name, std::strlen(name));
    (void)!::write(2, "\n", 1);
  }
  if (sig == SIGALRM) sig = SIGABRT;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

unsigned g_timeout_s = 10;

void run_one(const std::string& input) {
  g_current = &input;
  ::alarm(g_timeout_s);
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
  ::alarm(0);
  g_current = nullptr;
  ++g_run;
}

std::string mutate(const std::vector<std::string>& seeds, std::mt19937_64& rng,
                   std::size_t max_len) {
  static constexpr char kPunctuation[] = "{}[]\",:0123456789-+.eE \\tnul\x00\xff";
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  std::string s = seeds[pick(seeds.size())];
  const int ops = 1 + static_cast<int>(pick(4));
  for (int i = 0; i < ops; ++i) {
    switch (pick(7)) {
      case 0:  // flip a bit
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << pick(8));
        break;
      case 1:  // a byte becomes punctuation
        if (!s.empty()) s[pick(s.size())] = kPunctuation[pick(sizeof(kPunctuation) - 1)];
        break;
      case 2:  // insert a few bytes
        s.insert(pick(s.size() + 1),
                 std::string(1 + pick(4), kPunctuation[pick(sizeof(kPunctuation) - 1)]));
        break;
      case 3:  // erase a range
        if (!s.empty()) {
          const std::size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<std::size_t>(16, s.size() - at)));
        }
        break;
      case 4:  // repeat a range
        if (!s.empty()) {
          const std::size_t at = pick(s.size());
          const std::string part = s.substr(at, 1 + pick(32));
          s.insert(pick(s.size() + 1), part);
        }
        break;
      case 5: {  // splice another seed in
        const std::string& other = seeds[pick(seeds.size())];
        const std::size_t from = pick(other.size() + 1);
        s = s.substr(0, pick(s.size() + 1)) + other.substr(from);
        break;
      }
      default:  // truncate
        s.resize(pick(s.size() + 1));
        break;
    }
  }
  if (s.size() > max_len) s.resize(max_len);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t runs = 20000, seed = 1;
  double seconds = 3;
  std::size_t max_len = 65536;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\n", argv[0], a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--runs") {
      runs = std::strtoull(value(), nullptr, 10);
    } else if (a == "--seconds") {
      seconds = std::strtod(value(), nullptr);
    } else if (a == "--seed") {
      seed = std::strtoull(value(), nullptr, 10);
    } else if (a == "--max-len") {
      max_len = std::strtoull(value(), nullptr, 10);
    } else if (a == "--timeout") {
      g_timeout_s = static_cast<unsigned>(std::strtoul(value(), nullptr, 10));
    } else {
      dirs.push_back(a);
    }
  }
  std::vector<std::string> seeds;
  for (const auto& d : dirs) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(d)) files.push_back(e.path());
    std::sort(files.begin(), files.end());  // the same order everywhere
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "%s: no seeds (give seed directories)\n", argv[0]);
    return 2;
  }
  for (int sig : {SIGILL, SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGALRM}) std::signal(sig, on_crash);
  for (const auto& s : seeds) run_one(s);
  std::mt19937_64 rng(seed);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::uint64_t mutated = 0;
  while (mutated < runs && std::chrono::steady_clock::now() < deadline) {
    run_one(mutate(seeds, rng, max_len));
    ++mutated;
  }
  std::printf("%zu seeds and %llu mutations (seed %llu): no crash\n", seeds.size(),
              static_cast<unsigned long long>(mutated), static_cast<unsigned long long>(seed));
  return 0;
}
