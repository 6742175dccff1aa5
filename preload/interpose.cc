// The interposed libc entry points of libsluice_preload.so, the only symbols it
// exports (preload/exports.map). Each forwards to the next definition
// (dlsym(RTLD_NEXT); a raw system call from inside dlsym itself) with the stage's
// enforcement before and the counting after (preload.h; runtime.h for the inline
// path). The return value and errno are the real call's, but for a vector call with
// RWF_NOWAIT that the stage would make wait (EAGAIN, not made). A call is charged for
// what it moves; a call the kernel will refuse untouched is never made to wait.
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdint>

#include "runtime.h"
#include "sluice/reserved_fd.h"

#define SLUICE_EXPORT extern "C" __attribute__((visibility("default")))

// glibc's fortified entry points (declared by its headers only under
// _FORTIFY_SOURCE, which this file is compiled without).
extern "C" {
ssize_t __read_chk(int fd, void* buf, size_t nbytes, size_t buflen);
ssize_t __pread_chk(int fd, void* buf, size_t nbytes, off_t offset, size_t buflen);
ssize_t __pread64_chk(int fd, void* buf, size_t nbytes, off64_t offset, size_t buflen);
int __open_2(const char* path, int oflag);
int __open64_2(const char* path, int oflag);
int __openat_2(int dirfd, const char* path, int oflag);
int __openat64_2(int dirfd, const char* path, int oflag);
size_t __fread_chk(void* __restrict ptr, size_t ptrlen, size_t size, size_t n,
                   FILE* __restrict stream);
size_t __fread_unlocked_chk(void* __restrict ptr, size_t ptrlen, size_t size, size_t n,
                            FILE* __restrict stream);
}

// Defined in init.cc (a library linked after libstage); referencing it pulls
// the preload's constructor in.
extern "C" int sluice_preload_init_anchor;
__attribute__((used)) static int* const sluice_preload_init_ref = &sluice_preload_init_anchor;

namespace {

namespace sp = sluice::preload;
using sluice::Op;
using sp::CountedOp;

// The tally a data call of `op` is counted in.
constexpr CountedOp counted(Op op) noexcept {
  return op == Op::kRead    ? CountedOp::kRead
         : op == Op::kWrite ? CountedOp::kWrite
                            : CountedOp::kSync;
}

template <typename F>
inline F next(sp::Sym s) noexcept {
  return sp::real<F>(s);
}

inline std::uint64_t mul_sat(size_t a, size_t b) noexcept {
  std::uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

inline bool needs_mode(int flags) noexcept {
  return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE;
}

inline int fd_of(FILE* stream) noexcept {
  return stream != nullptr ? fileno_unlocked(stream) : -1;
}

inline void forget_fd(int fd) noexcept {
  sp::g_fds.forget(fd);
}

// stdio: the stage sees the requested bytes; the count is what the call
// moved. `args` are the real function's (`sym`); `size`, `n` and `stream`
// among them. Without a real function the call fails with ENOSYS.
template <Op op, sp::Sym sym, typename... A>
inline size_t stdio_call(FILE* stream, size_t size, size_t n, A... args) {
  const auto call = [&]() -> size_t {
    auto f = next<size_t (*)(A...)>(sym);
    if (f == nullptr) return errno = ENOSYS, 0;
    return f(args...);
  };
  if (stream == nullptr) return call();
  sluice::Stage* st = sp::stage_for(fd_of(stream));
  if (st == nullptr) return call();
  const sluice::Context ctx = sp::enforce(st, op, mul_sat(size, n));
  size_t r = call();
  const auto moved = static_cast<long long>(mul_sat(r, size));
  sp::count(counted(op), moved);
  sp::settle(st, ctx, moved);
  return r;
}

inline long raw(long r) noexcept {
  return r;
}

// route_inline's kEnforce: a selected fd on a stage its inline shortcut does
// not cover. What data_call does after its checks, which route_inline made:
// the object's grant through the shortcut when it covers the call (no
// Context built), else the full Context enforced (it may wait); the real
// call, counted and settled. g_stage is read again rather than passed (it is
// the same stage, or null once exit began: then the call passes through, as
// data_call's would).
template <CountedOp cop, Op op, typename F, typename... A>
[[gnu::noinline]] ssize_t enforced_call(F real, size_t n, A... args) {
  sluice::Stage* st = sp::g_stage.load(std::memory_order_acquire);
  // A size the kernel refuses (EINVAL, EFAULT) is never made to wait.
  if (st == nullptr || n > static_cast<size_t>(SSIZE_MAX)) return real(args...);
  if (sluice::fast::try_grant(*st, sp::current_origin(), n)) {
    const ssize_t r = real(args...);
    sp::count(cop, r);
    sp::settle(st, op, n, r);
    return r;
  }
  const sluice::Context ctx = sp::context_for(op, n);
  // route_inline just saw the shortcut refuse: no second inline attempt.
  (void)sluice::fast::enforce_rest(*st, ctx);  // fail-open, as enforce()
  const ssize_t r = real(args...);
  sp::count(cop, r);
  sp::settle(st, ctx, r);
  return r;
}

// The data calls whose requested size is their `n` argument (the hot ones):
// route_inline's common cases inline, with the arguments left in their
// registers; enforcing with a full Context (enforced_call) and everything else
// (`full`, data_call) out of line, reached with nothing done yet.
template <CountedOp cop, Op op, typename F, typename... A>
[[gnu::always_inline]] inline ssize_t fast_data_call(sp::Sym s, F full, int fd, size_t n,
                                                     A... args) {
  const sp::Route<F> r = sp::route_inline<F>(s, fd, n);
  if (__builtin_expect(r.path == sp::Path::kCounted, 1)) {
    return sp::finish(cop, op, n, r.real(args...));
  }
  if (r.path == sp::Path::kPass) return r.real(args...);
  if (r.path == sp::Path::kEnforce) return enforced_call<cop, op>(r.real, n, args...);
  return full(args...);
}

// The full path of a data call (`full` in fast_data_call) on the real
// function `s`, of type ssize_t (*)(int, Buf, size_t, Rest...): read, pread,
// write, pwrite, their 64 forms and the fortified __read_chk, __pread_chk and
// __pread64_chk. When `s` cannot be resolved, system call `nr` with the same
// arguments (the kernel reads only those its call takes: a fortified form's
// trailing buffer length is not one of them).
template <Op op, sp::Sym s, long nr, typename Buf, typename... Rest>
[[gnu::noinline]] ssize_t data_full(int fd, Buf buf, size_t n, Rest... rest) {
  return sp::data_call(
      counted(op), op, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<ssize_t (*)(int, Buf, size_t, Rest...)>(s);
        return f ? f(fd, buf, n, rest...) : raw(syscall(nr, fd, buf, n, rest...));
      });
}

// An interposed data call of `n` bytes: fast_data_call, whose full path is
// data_full.
template <Op op, sp::Sym s, long nr, typename Buf, typename... Rest>
[[gnu::always_inline]] inline ssize_t data_entry(int fd, Buf buf, size_t n, Rest... rest) {
  return fast_data_call<counted(op), op>(s, &data_full<op, s, nr, Buf, Rest...>, fd, n, fd, buf, n,
                                         rest...);
}

// The system call behind a vector call, for when its real function cannot be
// resolved: readv's arguments, then the offset as two words (low, high: 0 on
// this 64-bit ABI), then preadv2's flags.
inline long raw_vector(long nr, int fd, const struct iovec* iov, int cnt) noexcept {
  return syscall(nr, fd, iov, cnt);
}
inline long raw_vector(long nr, int fd, const struct iovec* iov, int cnt, off64_t off) noexcept {
  return syscall(nr, fd, iov, cnt, off, 0);
}
inline long raw_vector(long nr, int fd, const struct iovec* iov, int cnt, off64_t off,
                       int flags) noexcept {
  return syscall(nr, fd, iov, cnt, off, 0, flags);
}

// The RWF_ flags of a vector call: preadv2's last argument, else none.
template <typename... Pos>
constexpr int rwf_flags(Pos...) noexcept {
  return 0;
}
constexpr int rwf_flags(off64_t, int flags) noexcept {
  return flags;
}

// The vector calls: readv (`pos` empty), preadv (the offset), preadv2 (the offset and
// RWF_ flags), their write twins and 64 forms, on the real function `s`, or system call
// `nr`. Only the kernel may read the application's iovec array first (reading it here
// would crash on an invalid one), so these calls are charged after they return, for
// the bytes they moved (sp::charge_after). An iovcnt the kernel refuses passes through.
// A call with RWF_NOWAIT is only tried (its size read through the kernel,
// sp::iov_size): it fails with EAGAIN without being made when the stage would make it
// wait; otherwise it is made and settled.
template <Op op, sp::Sym s, long nr, typename... Pos>
inline ssize_t vector_call(int fd, const struct iovec* iov, int cnt, Pos... pos) {
  const auto call = [&]() -> ssize_t {
    auto f = next<ssize_t (*)(int, const struct iovec*, int, Pos...)>(s);
    return f ? f(fd, iov, cnt, pos...) : raw_vector(nr, fd, iov, cnt, pos...);
  };
  if (static_cast<unsigned>(cnt) > static_cast<unsigned>(IOV_MAX)) return call();
  sluice::Stage* st = sp::stage_for(fd);
  if (st == nullptr) return call();
  if ((rwf_flags(pos...) & RWF_NOWAIT) == 0) {
    const ssize_t r = call();
    sp::count(counted(op), r);
    sp::charge_after(st, op, r);
    return r;
  }
  std::uint64_t size = 0;
  if (!sp::iov_size(iov, cnt, &size)) return call();  // the kernel refuses the array
  const sluice::Context ctx = sp::context_for(op, size, sluice::context_flag::kNoWait);
  if (sluice::fast::enforce(*st, ctx).outcome == sluice::Outcome::kWouldWait) {
    errno = EAGAIN;
    return -1;
  }
  const ssize_t r = call();
  sp::count(counted(op), r);
  sp::settle(st, ctx, r);
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------
// read family

SLUICE_EXPORT ssize_t read(int fd, void* buf, size_t n) {
  return data_entry<Op::kRead, sp::kSym_read, SYS_read>(fd, buf, n);
}

SLUICE_EXPORT ssize_t __read_chk(int fd, void* buf, size_t n, size_t buflen) {
  return data_entry<Op::kRead, sp::kSym___read_chk, SYS_read>(fd, buf, n, buflen);
}

SLUICE_EXPORT ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  return data_entry<Op::kRead, sp::kSym_pread, SYS_pread64>(fd, buf, n, off);
}

SLUICE_EXPORT ssize_t pread64(int fd, void* buf, size_t n, off64_t off) {
  return data_entry<Op::kRead, sp::kSym_pread64, SYS_pread64>(fd, buf, n, off);
}

SLUICE_EXPORT ssize_t __pread_chk(int fd, void* buf, size_t n, off_t off, size_t buflen) {
  return data_entry<Op::kRead, sp::kSym___pread_chk, SYS_pread64>(fd, buf, n, off, buflen);
}

SLUICE_EXPORT ssize_t __pread64_chk(int fd, void* buf, size_t n, off64_t off, size_t buflen) {
  return data_entry<Op::kRead, sp::kSym___pread64_chk, SYS_pread64>(fd, buf, n, off, buflen);
}

SLUICE_EXPORT ssize_t readv(int fd, const struct iovec* iov, int cnt) {
  return vector_call<Op::kRead, sp::kSym_readv, SYS_readv>(fd, iov, cnt);
}

SLUICE_EXPORT ssize_t preadv(int fd, const struct iovec* iov, int cnt, off_t off) {
  return vector_call<Op::kRead, sp::kSym_preadv, SYS_preadv>(fd, iov, cnt, off);
}

SLUICE_EXPORT ssize_t preadv64(int fd, const struct iovec* iov, int cnt, off64_t off) {
  return vector_call<Op::kRead, sp::kSym_preadv64, SYS_preadv>(fd, iov, cnt, off);
}

SLUICE_EXPORT ssize_t preadv2(int fd, const struct iovec* iov, int cnt, off_t off, int flags) {
  return vector_call<Op::kRead, sp::kSym_preadv2, SYS_preadv2>(fd, iov, cnt, off, flags);
}

SLUICE_EXPORT ssize_t preadv64v2(int fd, const struct iovec* iov, int cnt, off64_t off, int flags) {
  return vector_call<Op::kRead, sp::kSym_preadv64v2, SYS_preadv2>(fd, iov, cnt, off, flags);
}

// ---------------------------------------------------------------------------
// write family

SLUICE_EXPORT ssize_t write(int fd, const void* buf, size_t n) {
  return data_entry<Op::kWrite, sp::kSym_write, SYS_write>(fd, buf, n);
}

SLUICE_EXPORT ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  return data_entry<Op::kWrite, sp::kSym_pwrite, SYS_pwrite64>(fd, buf, n, off);
}

SLUICE_EXPORT ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t off) {
  return data_entry<Op::kWrite, sp::kSym_pwrite64, SYS_pwrite64>(fd, buf, n, off);
}

SLUICE_EXPORT ssize_t writev(int fd, const struct iovec* iov, int cnt) {
  return vector_call<Op::kWrite, sp::kSym_writev, SYS_writev>(fd, iov, cnt);
}

SLUICE_EXPORT ssize_t pwritev(int fd, const struct iovec* iov, int cnt, off_t off) {
  return vector_call<Op::kWrite, sp::kSym_pwritev, SYS_pwritev>(fd, iov, cnt, off);
}

SLUICE_EXPORT ssize_t pwritev64(int fd, const struct iovec* iov, int cnt, off64_t off) {
  return vector_call<Op::kWrite, sp::kSym_pwritev64, SYS_pwritev>(fd, iov, cnt, off);
}

SLUICE_EXPORT ssize_t pwritev2(int fd, const struct iovec* iov, int cnt, off_t off, int flags) {
  return vector_call<Op::kWrite, sp::kSym_pwritev2, SYS_pwritev2>(fd, iov, cnt, off, flags);
}

SLUICE_EXPORT ssize_t pwritev64v2(int fd, const struct iovec* iov, int cnt, off64_t off,
                                  int flags) {
  return vector_call<Op::kWrite, sp::kSym_pwritev64v2, SYS_pwritev2>(fd, iov, cnt, off, flags);
}

// ---------------------------------------------------------------------------
// Copies inside the kernel: a read on the source and a write on the target.

namespace {
// What a kernel copy of up to `len` bytes from `in` will move at most: callers
// commonly ask for SSIZE_MAX ("to the end"), which no token bucket could ever
// grant, so a regular source charges what is left of it. Two syscalls, only
// for an enforced copy. Preserves errno.
std::uint64_t copy_charge(int in, const off64_t* in_off, std::uint64_t len) noexcept {
  int saved = errno;
  struct stat st;
  std::uint64_t charge = len;
  if (syscall(SYS_fstat, in, &st) == 0 && S_ISREG(st.st_mode)) {
    long long pos = in_off != nullptr ? *in_off : syscall(SYS_lseek, in, 0, SEEK_CUR);
    if (pos >= 0) {
      std::uint64_t left = st.st_size > pos ? static_cast<std::uint64_t>(st.st_size - pos) : 0;
      if (left < charge) charge = left;
    }
  }
  errno = saved;
  return charge;
}

template <typename Call>
inline ssize_t copy_call(int in, const off64_t* in_off, int out, std::uint64_t len, Call&& call) {
  sluice::Stage* si = sp::stage_for(in);
  sluice::Stage* so = sp::stage_for(out);
  if (si == nullptr && so == nullptr) return call();
  std::uint64_t charge = copy_charge(in, in_off, len);
  sluice::Context ci{}, co{};
  if (si != nullptr) ci = sp::enforce(si, Op::kRead, charge);
  if (so != nullptr) co = sp::enforce(so, Op::kWrite, charge);
  ssize_t r = call();
  if (si != nullptr) {
    sp::count(CountedOp::kRead, r);
    sp::settle(si, ci, r);
  }
  if (so != nullptr) {
    sp::count(CountedOp::kWrite, r);
    sp::settle(so, co, r);
  }
  return r;
}
}  // namespace

SLUICE_EXPORT ssize_t copy_file_range(int in, off64_t* in_off, int out, off64_t* out_off,
                                      size_t len, unsigned int flags) {
  return copy_call(in, in_off, out, len, [&] {
    auto f = next<decltype(&::copy_file_range)>(sp::kSym_copy_file_range);
    return f ? f(in, in_off, out, out_off, len, flags)
             : raw(syscall(SYS_copy_file_range, in, in_off, out, out_off, len, flags));
  });
}

SLUICE_EXPORT ssize_t sendfile(int out, int in, off_t* off, size_t count) noexcept {
  return copy_call(in, off, out, count, [&] {
    auto f = next<decltype(&::sendfile)>(sp::kSym_sendfile);
    return f ? f(out, in, off, count) : raw(syscall(SYS_sendfile, out, in, off, count));
  });
}

SLUICE_EXPORT ssize_t sendfile64(int out, int in, off64_t* off, size_t count) noexcept {
  return copy_call(in, off, out, count, [&] {
    auto f = next<decltype(&::sendfile64)>(sp::kSym_sendfile64);
    return f ? f(out, in, off, count) : raw(syscall(SYS_sendfile, out, in, off, count));
  });
}

// ---------------------------------------------------------------------------
// stdio

SLUICE_EXPORT size_t fread(void* __restrict ptr, size_t size, size_t n, FILE* __restrict s) {
  return stdio_call<Op::kRead, sp::kSym_fread>(s, size, n, ptr, size, n, s);
}

SLUICE_EXPORT size_t fread_unlocked(void* __restrict ptr, size_t size, size_t n,
                                    FILE* __restrict s) {
  return stdio_call<Op::kRead, sp::kSym_fread_unlocked>(s, size, n, ptr, size, n, s);
}

SLUICE_EXPORT size_t __fread_chk(void* __restrict ptr, size_t ptrlen, size_t size, size_t n,
                                 FILE* __restrict s) {
  return stdio_call<Op::kRead, sp::kSym___fread_chk>(s, size, n, ptr, ptrlen, size, n, s);
}

SLUICE_EXPORT size_t __fread_unlocked_chk(void* __restrict ptr, size_t ptrlen, size_t size,
                                          size_t n, FILE* __restrict s) {
  return stdio_call<Op::kRead, sp::kSym___fread_unlocked_chk>(s, size, n, ptr, ptrlen, size, n, s);
}

SLUICE_EXPORT size_t fwrite(const void* __restrict ptr, size_t size, size_t n, FILE* __restrict s) {
  return stdio_call<Op::kWrite, sp::kSym_fwrite>(s, size, n, ptr, size, n, s);
}

SLUICE_EXPORT size_t fwrite_unlocked(const void* __restrict ptr, size_t size, size_t n,
                                     FILE* __restrict s) {
  return stdio_call<Op::kWrite, sp::kSym_fwrite_unlocked>(s, size, n, ptr, size, n, s);
}

namespace {
// fopen and freopen (`reopened` their stream), on the real function `s`: a
// reopened stream's former fd is forgotten, the new stream's fd classified.
template <sp::Sym s, typename... Stream>
inline FILE* fopen_call(const char* path, const char* mode, Stream... reopened) {
  auto f = next<FILE* (*)(const char*, const char*, Stream...)>(s);
  if (f == nullptr) return errno = ENOSYS, nullptr;
  const int old[] = {fd_of(reopened)..., -1};
  FILE* r = f(path, mode, reopened...);
  if constexpr (sizeof...(Stream) != 0) {
    int saved = errno;
    forget_fd(old[0]);
    errno = saved;
  }
  if (r != nullptr) sp::after_open(fd_of(r));
  return r;
}
}  // namespace

SLUICE_EXPORT FILE* fopen(const char* path, const char* mode) {
  return fopen_call<sp::kSym_fopen>(path, mode);
}

SLUICE_EXPORT FILE* fopen64(const char* path, const char* mode) {
  return fopen_call<sp::kSym_fopen64>(path, mode);
}

SLUICE_EXPORT FILE* freopen(const char* path, const char* mode, FILE* stream) {
  return fopen_call<sp::kSym_freopen>(path, mode, stream);
}

SLUICE_EXPORT FILE* freopen64(const char* path, const char* mode, FILE* stream) {
  return fopen_call<sp::kSym_freopen64>(path, mode, stream);
}

SLUICE_EXPORT int fclose(FILE* stream) {
  int fd = fd_of(stream);
  if (fd >= 0) sp::before_close(fd);
  auto f = next<decltype(&::fclose)>(sp::kSym_fclose);
  if (f == nullptr) return errno = ENOSYS, EOF;
  int r = f(stream);
  forget_fd(fd);  // the stream's fd is closed even when fclose reports an error
  return r;
}

// ---------------------------------------------------------------------------
// open family: classify the new fd after the call, then enforce Op::kOpen.

#define SLUICE_MODE_ARG(flags)                   \
  mode_t mode = 0;                               \
  if (needs_mode(flags)) {                       \
    va_list ap;                                  \
    va_start(ap, flags);                         \
    mode = static_cast<mode_t>(va_arg(ap, int)); \
    va_end(ap);                                  \
  }

namespace {
// The open calls, on the real function `s` of type F with `args`; when it
// cannot be resolved, openat(dirfd, path, flags | large, mode) (`large`:
// O_LARGEFILE for a 64 form). The new fd is classified.
template <typename F, int large = 0, typename... A>
inline int open_call(sp::Sym s, int dirfd, const char* path, int flags, mode_t mode, A... args) {
  auto f = next<F>(s);
  const int fd =
      f ? f(args...) : static_cast<int>(syscall(SYS_openat, dirfd, path, flags | large, mode));
  sp::after_open(fd);
  return fd;
}
using OpenFn = int (*)(const char*, int, ...);
using OpenatFn = int (*)(int, const char*, int, ...);
constexpr int kCreat = O_CREAT | O_WRONLY | O_TRUNC;
}  // namespace

SLUICE_EXPORT int open(const char* path, int flags, ...) {
  SLUICE_MODE_ARG(flags)
  return open_call<OpenFn>(sp::kSym_open, AT_FDCWD, path, flags, mode, path, flags, mode);
}

SLUICE_EXPORT int open64(const char* path, int flags, ...) {
  SLUICE_MODE_ARG(flags)
  return open_call<OpenFn, O_LARGEFILE>(sp::kSym_open64, AT_FDCWD, path, flags, mode, path, flags,
                                        mode);
}

SLUICE_EXPORT int openat(int dirfd, const char* path, int flags, ...) {
  SLUICE_MODE_ARG(flags)
  return open_call<OpenatFn>(sp::kSym_openat, dirfd, path, flags, mode, dirfd, path, flags, mode);
}

SLUICE_EXPORT int openat64(int dirfd, const char* path, int flags, ...) {
  SLUICE_MODE_ARG(flags)
  return open_call<OpenatFn, O_LARGEFILE>(sp::kSym_openat64, dirfd, path, flags, mode, dirfd, path,
                                          flags, mode);
}

#undef SLUICE_MODE_ARG

SLUICE_EXPORT int creat(const char* path, mode_t mode) {
  return open_call<decltype(&::creat)>(sp::kSym_creat, AT_FDCWD, path, kCreat, mode, path, mode);
}

SLUICE_EXPORT int creat64(const char* path, mode_t mode) {
  return open_call<decltype(&::creat64), O_LARGEFILE>(sp::kSym_creat64, AT_FDCWD, path, kCreat,
                                                      mode, path, mode);
}

SLUICE_EXPORT int __open_2(const char* path, int flags) {
  return open_call<decltype(&::__open_2)>(sp::kSym___open_2, AT_FDCWD, path, flags, 0, path, flags);
}

SLUICE_EXPORT int __open64_2(const char* path, int flags) {
  return open_call<decltype(&::__open64_2), O_LARGEFILE>(sp::kSym___open64_2, AT_FDCWD, path, flags,
                                                         0, path, flags);
}

SLUICE_EXPORT int __openat_2(int dirfd, const char* path, int flags) {
  return open_call<decltype(&::__openat_2)>(sp::kSym___openat_2, dirfd, path, flags, 0, dirfd, path,
                                            flags);
}

SLUICE_EXPORT int __openat64_2(int dirfd, const char* path, int flags) {
  return open_call<decltype(&::__openat64_2), O_LARGEFILE>(sp::kSym___openat64_2, dirfd, path,
                                                           flags, 0, dirfd, path, flags);
}

// ---------------------------------------------------------------------------
// close and fd replacement
//
// Sluice's own descriptors (the control client's socket and wake eventfd, the
// board: sluice/reserved_fd.h) are not the host's: to the host's calls their
// numbers are not open. close() and fcntl() of one fail with EBADF, dup()
// and dup2()/dup3() from one too, close_range() and closefrom() skip them,
// and a dup2()/dup3() onto one succeeds, Sluice's descriptor moving away
// first. Sluice's own calls (InternalIoScope) pass through.

namespace {

// Whether the host (not Sluice itself) named one of Sluice's descriptors.
inline bool host_reserved(int fd) noexcept {
  return sluice::detail::t_thread_context.internal_depth == 0 && sluice::is_reserved_fd(fd);
}

// Before the host's dup2/dup3 onto `newfd` (from a valid-looking `oldfd`):
// moves Sluice's descriptor away when `newfd` is one. Returns false, with
// errno EBUSY, when that cannot be done now (see vacate_reserved_fd);
// `*moved` says whether `newfd` still holds Sluice's former descriptor, which
// after_replace() closes if the host's call failed.
inline bool before_replace(int oldfd, int newfd, bool* moved) noexcept {
  *moved = false;
  if (oldfd < 0 || oldfd == newfd || !host_reserved(newfd)) return true;
  bool busy = false;
  *moved = sluice::vacate_reserved_fd(newfd, &busy);
  if (busy) errno = EBUSY;
  return !busy;
}

inline void after_replace(int newfd, bool moved, int r) noexcept {
  if (r >= 0 || !moved) return;
  int saved = errno;
  (void)syscall(SYS_close, newfd);
  errno = saved;
}

}  // namespace

SLUICE_EXPORT int close(int fd) {
  if (__builtin_expect(host_reserved(fd), 0)) return errno = EBADF, -1;
  sp::before_close(fd);
  auto f = next<decltype(&::close)>(sp::kSym_close);
  int r = f ? f(fd) : static_cast<int>(syscall(SYS_close, fd));
  forget_fd(fd);  // after the call: an fd reused meanwhile is merely re-resolved
  return r;
}

SLUICE_EXPORT int dup(int fd) noexcept {
  if (host_reserved(fd)) fd = -1;  // as for a number that is not open
  auto f = next<decltype(&::dup)>(sp::kSym_dup);
  return f ? f(fd) : static_cast<int>(syscall(SYS_dup, fd));
}

SLUICE_EXPORT int dup2(int oldfd, int newfd) noexcept {
  if (host_reserved(oldfd)) oldfd = -1;  // EBADF, newfd untouched, even when oldfd == newfd
  bool moved = false;
  if (!before_replace(oldfd, newfd, &moved)) return -1;
  auto f = next<decltype(&::dup2)>(sp::kSym_dup2);
  int r = f ? f(oldfd, newfd) : static_cast<int>(syscall(SYS_dup2, oldfd, newfd));
  after_replace(newfd, moved, r);
  if (r >= 0 && oldfd != newfd) forget_fd(newfd);
  return r;
}

SLUICE_EXPORT int dup3(int oldfd, int newfd, int flags) noexcept {
  // dup3(fd, fd, ...) fails with EINVAL before the kernel looks at fd.
  if (oldfd != newfd && host_reserved(oldfd)) oldfd = -1;
  bool moved = false;
  if (!before_replace(oldfd, newfd, &moved)) return -1;
  auto f = next<decltype(&::dup3)>(sp::kSym_dup3);
  int r = f ? f(oldfd, newfd, flags) : static_cast<int>(syscall(SYS_dup3, oldfd, newfd, flags));
  after_replace(newfd, moved, r);
  if (r >= 0) forget_fd(newfd);
  return r;
}

namespace {

struct CloseRangeCall {
  int (*real)(unsigned, unsigned, int);
  int flags;
};

int close_range_part(unsigned first, unsigned last, void* ctx) {
  auto* c = static_cast<CloseRangeCall*>(ctx);
  return c->real ? c->real(first, last, c->flags)
                 : static_cast<int>(syscall(SYS_close_range, first, last, c->flags));
}

// closefrom's parts: [first, ~0U] by the real closefrom (which falls back to
// closing what /proc/self/fd lists on kernels without close_range), the parts
// below a reserved descriptor by close_range, else one close() at a time.
struct CloseFromCall {
  decltype(&::closefrom) real;
};

int closefrom_part(unsigned first, unsigned last, void* ctx) {
  auto real = static_cast<CloseFromCall*>(ctx)->real;
  if (last == ~0U) {
    if (real != nullptr) {
      real(static_cast<int>(first));
    } else {
      (void)syscall(SYS_close_range, first, ~0U, 0);
    }
    return 0;
  }
  if (syscall(SYS_close_range, first, last, 0) == 0) return 0;
  for (unsigned fd = first; fd <= last; ++fd) (void)syscall(SYS_close, fd);
  return 0;
}

}  // namespace

SLUICE_EXPORT int close_range(unsigned int first, unsigned int last, int flags) noexcept {
  CloseRangeCall call{next<decltype(&::close_range)>(sp::kSym_close_range), flags};
  int r;
  if (first > last || sluice::detail::t_thread_context.internal_depth != 0) {
    r = close_range_part(first, last, &call);  // (first > last: EINVAL, as natively)
  } else {
    r = sluice::for_unreserved_ranges(first, last, &close_range_part, &call);
  }
  if (r == 0 && (flags & CLOSE_RANGE_CLOEXEC) == 0) sp::g_fds.forget_range(first, last);
  return r;
}

SLUICE_EXPORT void closefrom(int lowfd) noexcept {
  CloseFromCall call{next<decltype(&::closefrom)>(sp::kSym_closefrom)};
  const unsigned low = lowfd < 0 ? 0u : static_cast<unsigned>(lowfd);  // as glibc's
  if (sluice::detail::t_thread_context.internal_depth != 0) {
    (void)closefrom_part(low, ~0U, &call);
  } else {
    (void)sluice::for_unreserved_ranges(low, ~0U, &closefrom_part, &call);
  }
  sp::g_fds.forget_range(low, ~0U);
}

// fcntl's third argument is an int, a pointer or absent, by command; it is
// read and passed on as what it is. A command not listed here is passed as
// a pointer (the widest: what glibc itself reads for every command).
namespace {

enum class FcntlArg { kNone, kInt, kPointer };

FcntlArg fcntl_arg(int cmd) noexcept {
  switch (cmd) {
    case F_GETFD:
    case F_GETFL:
    case F_GETOWN:
    case F_GETSIG:
    case F_GETLEASE:
    case F_GETPIPE_SZ:
    case F_GET_SEALS:
      return FcntlArg::kNone;
    case F_DUPFD:
    case F_DUPFD_CLOEXEC:
    case F_SETFD:
    case F_SETFL:
    case F_SETOWN:
    case F_SETSIG:
    case F_SETLEASE:
    case F_NOTIFY:
    case F_SETPIPE_SZ:
    case F_ADD_SEALS:
      return FcntlArg::kInt;
    default:
      return FcntlArg::kPointer;
  }
}

using FcntlFn = int (*)(int, int, ...);

int fcntl_call(sp::Sym s, int fd, int cmd, va_list ap) noexcept {
  // Any command on one of Sluice's descriptors: EBADF, as for a number that
  // is not open (F_DUPFD never returns one: they are open).
  if (host_reserved(fd)) fd = -1;
  auto f = next<FcntlFn>(s);
  switch (fcntl_arg(cmd)) {
    case FcntlArg::kNone:
      return f ? f(fd, cmd) : static_cast<int>(syscall(SYS_fcntl, fd, cmd));
    case FcntlArg::kInt: {
      const int arg = va_arg(ap, int);
      return f ? f(fd, cmd, arg) : static_cast<int>(syscall(SYS_fcntl, fd, cmd, arg));
    }
    case FcntlArg::kPointer:
      break;
  }
  void* arg = va_arg(ap, void*);
  return f ? f(fd, cmd, arg) : static_cast<int>(syscall(SYS_fcntl, fd, cmd, arg));
}

}  // namespace

SLUICE_EXPORT int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  const int r = fcntl_call(sp::kSym_fcntl, fd, cmd, ap);
  va_end(ap);
  return r;
}

SLUICE_EXPORT int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  const int r = fcntl_call(sp::kSym_fcntl64, fd, cmd, ap);
  va_end(ap);
  return r;
}

// ---------------------------------------------------------------------------
// sync

namespace {
// fsync, fdatasync and sync_file_range: an Op::kSync of no bytes, on the real
// function `s`, or system call `nr` when it cannot be resolved.
template <sp::Sym s, long nr, typename... Rest>
inline int sync_call(int fd, Rest... rest) {
  return sp::data_call(
      CountedOp::kSync, Op::kSync, fd, [] { return std::uint64_t{0}; },
      [&] {
        auto f = next<int (*)(int, Rest...)>(s);
        return f ? f(fd, rest...) : static_cast<int>(syscall(nr, fd, rest...));
      });
}
}  // namespace

SLUICE_EXPORT int fsync(int fd) {
  return sync_call<sp::kSym_fsync, SYS_fsync>(fd);
}

SLUICE_EXPORT int fdatasync(int fd) {
  return sync_call<sp::kSym_fdatasync, SYS_fdatasync>(fd);
}

SLUICE_EXPORT int sync_file_range(int fd, off64_t off, off64_t nbytes, unsigned int flags) {
  return sync_call<sp::kSym_sync_file_range, SYS_sync_file_range>(fd, off, nbytes, flags);
}
