// The interposed libc entry points of libsluice_preload.so. Each one forwards
// to the next definition (dlsym(RTLD_NEXT)), with the stage's enforcement
// before and the counting after; see preload.h for the flow and runtime.h for
// the inline hot path. These are the only symbols the library exports
// (preload/exports.map).
//
// Semantics kept exactly: the return value and errno are the real call's; a
// partial transfer is counted as the bytes actually moved. A call is charged
// for what it moves: a bounded pre-charge (at most kMaxPreCharge) before it,
// settled after it; vector calls after it; a call the kernel will refuse
// before looking at the file (a size above SSIZE_MAX, an invalid iovcnt) is
// never made to wait. The one exception to "the real call's result": a
// vector call with RWF_NOWAIT that the stage would make wait fails with
// EAGAIN without being made. When the real function cannot be resolved (a
// call from inside dlsym itself) the raw system call is used.
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

// stdio: the stage sees the requested bytes; the count is what the call moved.
template <typename Call>
inline size_t stdio_call(CountedOp cop, Op op, FILE* stream, size_t size, size_t n, Call&& call) {
  if (stream == nullptr) return call();
  sluice::Stage* st = sp::stage_for(fd_of(stream));
  if (st == nullptr) return call();
  const sluice::Context ctx = sp::enforce(st, op, mul_sat(size, n));
  size_t r = call();
  const auto moved = static_cast<long long>(mul_sat(r, size));
  sp::count(cop, moved);
  sp::settle(st, ctx, moved);
  return r;
}

inline long raw(long r) noexcept {
  return r;
}

// route_inline's kEnforce: a selected fd on a stage its shortcut does not
// cover. What data_call does after its checks, which route_inline made: the
// full Context enforced (it may wait), the real call, counted and settled.
// g_stage is read again rather than passed (it is the same stage, or null once
// exit began: then the call passes through, as data_call's would).
template <CountedOp cop, Op op, typename F, typename... A>
[[gnu::noinline]] ssize_t enforced_call(F real, size_t n, A... args) {
  sluice::Stage* st = sp::g_stage.load(std::memory_order_acquire);
  // A size the kernel refuses (EINVAL, EFAULT) is never made to wait.
  if (st == nullptr || n > static_cast<size_t>(SSIZE_MAX)) return real(args...);
  const sluice::Context ctx = sp::context_for(op, n);
  // route_inline just saw the shortcut refuse: no second inline attempt.
  (void)st->enforce_context_slow(ctx);  // fail-open, as enforce()
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

[[gnu::noinline]] ssize_t read_full(int fd, void* buf, size_t n) {
  return sp::data_call(
      CountedOp::kRead, Op::kRead, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<decltype(&::read)>(sp::kSym_read);
        return f ? f(fd, buf, n) : raw(syscall(SYS_read, fd, buf, n));
      });
}

[[gnu::noinline]] ssize_t read_chk_full(int fd, void* buf, size_t n, size_t buflen) {
  return sp::data_call(
      CountedOp::kRead, Op::kRead, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<decltype(&::__read_chk)>(sp::kSym___read_chk);
        return f ? f(fd, buf, n, buflen) : raw(syscall(SYS_read, fd, buf, n));
      });
}

[[gnu::noinline]] ssize_t pread_full(int fd, void* buf, size_t n, off_t off) {
  return sp::data_call(
      CountedOp::kRead, Op::kRead, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<decltype(&::pread)>(sp::kSym_pread);
        return f ? f(fd, buf, n, off) : raw(syscall(SYS_pread64, fd, buf, n, off));
      });
}

[[gnu::noinline]] ssize_t pread64_full(int fd, void* buf, size_t n, off64_t off) {
  return sp::data_call(
      CountedOp::kRead, Op::kRead, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<decltype(&::pread64)>(sp::kSym_pread64);
        return f ? f(fd, buf, n, off) : raw(syscall(SYS_pread64, fd, buf, n, off));
      });
}

[[gnu::noinline]] ssize_t pread_chk_full(int fd, void* buf, size_t n, off_t off, size_t buflen) {
  return sp::data_call(
      CountedOp::kRead, Op::kRead, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<decltype(&::__pread_chk)>(sp::kSym___pread_chk);
        return f ? f(fd, buf, n, off, buflen) : raw(syscall(SYS_pread64, fd, buf, n, off));
      });
}

[[gnu::noinline]] ssize_t pread64_chk_full(int fd, void* buf, size_t n, off64_t off,
                                           size_t buflen) {
  return sp::data_call(
      CountedOp::kRead, Op::kRead, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<decltype(&::__pread64_chk)>(sp::kSym___pread64_chk);
        return f ? f(fd, buf, n, off, buflen) : raw(syscall(SYS_pread64, fd, buf, n, off));
      });
}

[[gnu::noinline]] ssize_t write_full(int fd, const void* buf, size_t n) {
  return sp::data_call(
      CountedOp::kWrite, Op::kWrite, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<decltype(&::write)>(sp::kSym_write);
        return f ? f(fd, buf, n) : raw(syscall(SYS_write, fd, buf, n));
      });
}

[[gnu::noinline]] ssize_t pwrite_full(int fd, const void* buf, size_t n, off_t off) {
  return sp::data_call(
      CountedOp::kWrite, Op::kWrite, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<decltype(&::pwrite)>(sp::kSym_pwrite);
        return f ? f(fd, buf, n, off) : raw(syscall(SYS_pwrite64, fd, buf, n, off));
      });
}

[[gnu::noinline]] ssize_t pwrite64_full(int fd, const void* buf, size_t n, off64_t off) {
  return sp::data_call(
      CountedOp::kWrite, Op::kWrite, fd, [&] { return std::uint64_t{n}; },
      [&] {
        auto f = next<decltype(&::pwrite64)>(sp::kSym_pwrite64);
        return f ? f(fd, buf, n, off) : raw(syscall(SYS_pwrite64, fd, buf, n, off));
      });
}

// The vector calls. Their iovec array is the application's, and only the
// kernel may read it first (it fails an invalid one with EFAULT or EINVAL;
// reading it here would crash the program instead): these calls are charged
// after they return, for the bytes they moved (sp::charge_after), and
// classified by that size. An iovcnt the kernel refuses (< 0, > IOV_MAX)
// passes through.
template <typename Call>
inline ssize_t vector_call(CountedOp cop, Op op, int fd, int cnt, Call&& call) {
  if (static_cast<unsigned>(cnt) > static_cast<unsigned>(IOV_MAX)) return call();
  sluice::Stage* st = sp::stage_for(fd);
  if (st == nullptr) return call();
  const ssize_t r = call();
  sp::count(cop, r);
  sp::charge_after(st, op, r);
  return r;
}

// preadv2/pwritev2 and their 64 forms: as vector_call, except that a call
// with RWF_NOWAIT must not wait in the stage either. Its size is read
// through the kernel (sp::iov_size) and the stage only tried
// (context_flag::kNoWait): when it would make the request wait, the call
// fails with EAGAIN without being made, as the kernel fails one that would
// block; otherwise the call is made and settled (what it did not move is
// given back).
template <typename Call>
inline ssize_t vector2_call(CountedOp cop, Op op, int fd, const struct iovec* iov, int cnt,
                            int flags, Call&& call) {
  if ((flags & RWF_NOWAIT) == 0) return vector_call(cop, op, fd, cnt, call);
  if (static_cast<unsigned>(cnt) > static_cast<unsigned>(IOV_MAX)) return call();
  sluice::Stage* st = sp::stage_for(fd);
  if (st == nullptr) return call();
  std::uint64_t size = 0;
  if (!sp::iov_size(iov, cnt, &size)) return call();  // the kernel refuses the array
  const sluice::Context ctx = sp::context_for(op, size, sluice::context_flag::kNoWait);
  if (st->enforce_context(ctx).outcome == sluice::Outcome::kWouldWait) {
    errno = EAGAIN;
    return -1;
  }
  const ssize_t r = call();
  sp::count(cop, r);
  sp::settle(st, ctx, r);
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------
// read family

SLUICE_EXPORT ssize_t read(int fd, void* buf, size_t n) {
  return fast_data_call<CountedOp::kRead, Op::kRead>(sp::kSym_read, &read_full, fd, n, fd, buf, n);
}

SLUICE_EXPORT ssize_t __read_chk(int fd, void* buf, size_t n, size_t buflen) {
  return fast_data_call<CountedOp::kRead, Op::kRead>(sp::kSym___read_chk, &read_chk_full, fd, n, fd,
                                                     buf, n, buflen);
}

SLUICE_EXPORT ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  return fast_data_call<CountedOp::kRead, Op::kRead>(sp::kSym_pread, &pread_full, fd, n, fd, buf, n,
                                                     off);
}

SLUICE_EXPORT ssize_t pread64(int fd, void* buf, size_t n, off64_t off) {
  return fast_data_call<CountedOp::kRead, Op::kRead>(sp::kSym_pread64, &pread64_full, fd, n, fd,
                                                     buf, n, off);
}

SLUICE_EXPORT ssize_t __pread_chk(int fd, void* buf, size_t n, off_t off, size_t buflen) {
  return fast_data_call<CountedOp::kRead, Op::kRead>(sp::kSym___pread_chk, &pread_chk_full, fd, n,
                                                     fd, buf, n, off, buflen);
}

SLUICE_EXPORT ssize_t __pread64_chk(int fd, void* buf, size_t n, off64_t off, size_t buflen) {
  return fast_data_call<CountedOp::kRead, Op::kRead>(sp::kSym___pread64_chk, &pread64_chk_full, fd,
                                                     n, fd, buf, n, off, buflen);
}

SLUICE_EXPORT ssize_t readv(int fd, const struct iovec* iov, int cnt) {
  return vector_call(CountedOp::kRead, Op::kRead, fd, cnt, [&] {
    auto f = next<decltype(&::readv)>(sp::kSym_readv);
    return f ? f(fd, iov, cnt) : raw(syscall(SYS_readv, fd, iov, cnt));
  });
}

SLUICE_EXPORT ssize_t preadv(int fd, const struct iovec* iov, int cnt, off_t off) {
  return vector_call(CountedOp::kRead, Op::kRead, fd, cnt, [&] {
    auto f = next<decltype(&::preadv)>(sp::kSym_preadv);
    return f ? f(fd, iov, cnt, off) : raw(syscall(SYS_preadv, fd, iov, cnt, off, 0));
  });
}

SLUICE_EXPORT ssize_t preadv64(int fd, const struct iovec* iov, int cnt, off64_t off) {
  return vector_call(CountedOp::kRead, Op::kRead, fd, cnt, [&] {
    auto f = next<decltype(&::preadv64)>(sp::kSym_preadv64);
    return f ? f(fd, iov, cnt, off) : raw(syscall(SYS_preadv, fd, iov, cnt, off, 0));
  });
}

SLUICE_EXPORT ssize_t preadv2(int fd, const struct iovec* iov, int cnt, off_t off, int flags) {
  return vector2_call(CountedOp::kRead, Op::kRead, fd, iov, cnt, flags, [&] {
    auto f = next<decltype(&::preadv2)>(sp::kSym_preadv2);
    return f ? f(fd, iov, cnt, off, flags) : raw(syscall(SYS_preadv2, fd, iov, cnt, off, 0, flags));
  });
}

SLUICE_EXPORT ssize_t preadv64v2(int fd, const struct iovec* iov, int cnt, off64_t off, int flags) {
  return vector2_call(CountedOp::kRead, Op::kRead, fd, iov, cnt, flags, [&] {
    auto f = next<decltype(&::preadv64v2)>(sp::kSym_preadv64v2);
    return f ? f(fd, iov, cnt, off, flags) : raw(syscall(SYS_preadv2, fd, iov, cnt, off, 0, flags));
  });
}

// ---------------------------------------------------------------------------
// write family

SLUICE_EXPORT ssize_t write(int fd, const void* buf, size_t n) {
  return fast_data_call<CountedOp::kWrite, Op::kWrite>(sp::kSym_write, &write_full, fd, n, fd, buf,
                                                       n);
}

SLUICE_EXPORT ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  return fast_data_call<CountedOp::kWrite, Op::kWrite>(sp::kSym_pwrite, &pwrite_full, fd, n, fd,
                                                       buf, n, off);
}

SLUICE_EXPORT ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t off) {
  return fast_data_call<CountedOp::kWrite, Op::kWrite>(sp::kSym_pwrite64, &pwrite64_full, fd, n, fd,
                                                       buf, n, off);
}

SLUICE_EXPORT ssize_t writev(int fd, const struct iovec* iov, int cnt) {
  return vector_call(CountedOp::kWrite, Op::kWrite, fd, cnt, [&] {
    auto f = next<decltype(&::writev)>(sp::kSym_writev);
    return f ? f(fd, iov, cnt) : raw(syscall(SYS_writev, fd, iov, cnt));
  });
}

SLUICE_EXPORT ssize_t pwritev(int fd, const struct iovec* iov, int cnt, off_t off) {
  return vector_call(CountedOp::kWrite, Op::kWrite, fd, cnt, [&] {
    auto f = next<decltype(&::pwritev)>(sp::kSym_pwritev);
    return f ? f(fd, iov, cnt, off) : raw(syscall(SYS_pwritev, fd, iov, cnt, off, 0));
  });
}

SLUICE_EXPORT ssize_t pwritev64(int fd, const struct iovec* iov, int cnt, off64_t off) {
  return vector_call(CountedOp::kWrite, Op::kWrite, fd, cnt, [&] {
    auto f = next<decltype(&::pwritev64)>(sp::kSym_pwritev64);
    return f ? f(fd, iov, cnt, off) : raw(syscall(SYS_pwritev, fd, iov, cnt, off, 0));
  });
}

SLUICE_EXPORT ssize_t pwritev2(int fd, const struct iovec* iov, int cnt, off_t off, int flags) {
  return vector2_call(CountedOp::kWrite, Op::kWrite, fd, iov, cnt, flags, [&] {
    auto f = next<decltype(&::pwritev2)>(sp::kSym_pwritev2);
    return f ? f(fd, iov, cnt, off, flags)
             : raw(syscall(SYS_pwritev2, fd, iov, cnt, off, 0, flags));
  });
}

SLUICE_EXPORT ssize_t pwritev64v2(int fd, const struct iovec* iov, int cnt, off64_t off,
                                  int flags) {
  return vector2_call(CountedOp::kWrite, Op::kWrite, fd, iov, cnt, flags, [&] {
    auto f = next<decltype(&::pwritev64v2)>(sp::kSym_pwritev64v2);
    return f ? f(fd, iov, cnt, off, flags)
             : raw(syscall(SYS_pwritev2, fd, iov, cnt, off, 0, flags));
  });
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
  return stdio_call(CountedOp::kRead, Op::kRead, s, size, n, [&]() -> size_t {
    auto f = next<decltype(&::fread)>(sp::kSym_fread);
    if (f == nullptr) return errno = ENOSYS, 0;
    return f(ptr, size, n, s);
  });
}

SLUICE_EXPORT size_t fread_unlocked(void* __restrict ptr, size_t size, size_t n,
                                    FILE* __restrict s) {
  return stdio_call(CountedOp::kRead, Op::kRead, s, size, n, [&]() -> size_t {
    auto f = next<decltype(&::fread_unlocked)>(sp::kSym_fread_unlocked);
    if (f == nullptr) return errno = ENOSYS, 0;
    return f(ptr, size, n, s);
  });
}

SLUICE_EXPORT size_t __fread_chk(void* __restrict ptr, size_t ptrlen, size_t size, size_t n,
                                 FILE* __restrict s) {
  return stdio_call(CountedOp::kRead, Op::kRead, s, size, n, [&]() -> size_t {
    auto f = next<decltype(&::__fread_chk)>(sp::kSym___fread_chk);
    if (f == nullptr) return errno = ENOSYS, 0;
    return f(ptr, ptrlen, size, n, s);
  });
}

SLUICE_EXPORT size_t __fread_unlocked_chk(void* __restrict ptr, size_t ptrlen, size_t size,
                                          size_t n, FILE* __restrict s) {
  return stdio_call(CountedOp::kRead, Op::kRead, s, size, n, [&]() -> size_t {
    auto f = next<decltype(&::__fread_unlocked_chk)>(sp::kSym___fread_unlocked_chk);
    if (f == nullptr) return errno = ENOSYS, 0;
    return f(ptr, ptrlen, size, n, s);
  });
}

SLUICE_EXPORT size_t fwrite(const void* __restrict ptr, size_t size, size_t n, FILE* __restrict s) {
  return stdio_call(CountedOp::kWrite, Op::kWrite, s, size, n, [&]() -> size_t {
    auto f = next<decltype(&::fwrite)>(sp::kSym_fwrite);
    if (f == nullptr) return errno = ENOSYS, 0;
    return f(ptr, size, n, s);
  });
}

SLUICE_EXPORT size_t fwrite_unlocked(const void* __restrict ptr, size_t size, size_t n,
                                     FILE* __restrict s) {
  return stdio_call(CountedOp::kWrite, Op::kWrite, s, size, n, [&]() -> size_t {
    auto f = next<decltype(&::fwrite_unlocked)>(sp::kSym_fwrite_unlocked);
    if (f == nullptr) return errno = ENOSYS, 0;
    return f(ptr, size, n, s);
  });
}

SLUICE_EXPORT FILE* fopen(const char* path, const char* mode) {
  auto f = next<decltype(&::fopen)>(sp::kSym_fopen);
  if (f == nullptr) return errno = ENOSYS, nullptr;
  FILE* s = f(path, mode);
  if (s != nullptr) sp::after_open(fd_of(s));
  return s;
}

SLUICE_EXPORT FILE* fopen64(const char* path, const char* mode) {
  auto f = next<decltype(&::fopen64)>(sp::kSym_fopen64);
  if (f == nullptr) return errno = ENOSYS, nullptr;
  FILE* s = f(path, mode);
  if (s != nullptr) sp::after_open(fd_of(s));
  return s;
}

SLUICE_EXPORT FILE* freopen(const char* path, const char* mode, FILE* stream) {
  auto f = next<decltype(&::freopen)>(sp::kSym_freopen);
  if (f == nullptr) return errno = ENOSYS, nullptr;
  int old = fd_of(stream);
  FILE* s = f(path, mode, stream);
  int saved = errno;
  forget_fd(old);
  errno = saved;
  if (s != nullptr) sp::after_open(fd_of(s));
  return s;
}

SLUICE_EXPORT FILE* freopen64(const char* path, const char* mode, FILE* stream) {
  auto f = next<decltype(&::freopen64)>(sp::kSym_freopen64);
  if (f == nullptr) return errno = ENOSYS, nullptr;
  int old = fd_of(stream);
  FILE* s = f(path, mode, stream);
  int saved = errno;
  forget_fd(old);
  errno = saved;
  if (s != nullptr) sp::after_open(fd_of(s));
  return s;
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

SLUICE_EXPORT int open(const char* path, int flags, ...) {
  SLUICE_MODE_ARG(flags)
  auto f = next<int (*)(const char*, int, ...)>(sp::kSym_open);
  int fd =
      f ? f(path, flags, mode) : static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, flags, mode));
  sp::after_open(fd);
  return fd;
}

SLUICE_EXPORT int open64(const char* path, int flags, ...) {
  SLUICE_MODE_ARG(flags)
  auto f = next<int (*)(const char*, int, ...)>(sp::kSym_open64);
  int fd = f ? f(path, flags, mode)
             : static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, flags | O_LARGEFILE, mode));
  sp::after_open(fd);
  return fd;
}

SLUICE_EXPORT int openat(int dirfd, const char* path, int flags, ...) {
  SLUICE_MODE_ARG(flags)
  auto f = next<int (*)(int, const char*, int, ...)>(sp::kSym_openat);
  int fd = f ? f(dirfd, path, flags, mode)
             : static_cast<int>(syscall(SYS_openat, dirfd, path, flags, mode));
  sp::after_open(fd);
  return fd;
}

SLUICE_EXPORT int openat64(int dirfd, const char* path, int flags, ...) {
  SLUICE_MODE_ARG(flags)
  auto f = next<int (*)(int, const char*, int, ...)>(sp::kSym_openat64);
  int fd = f ? f(dirfd, path, flags, mode)
             : static_cast<int>(syscall(SYS_openat, dirfd, path, flags | O_LARGEFILE, mode));
  sp::after_open(fd);
  return fd;
}

#undef SLUICE_MODE_ARG

SLUICE_EXPORT int creat(const char* path, mode_t mode) {
  auto f = next<decltype(&::creat)>(sp::kSym_creat);
  int fd =
      f ? f(path, mode)
        : static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode));
  sp::after_open(fd);
  return fd;
}

SLUICE_EXPORT int creat64(const char* path, mode_t mode) {
  auto f = next<decltype(&::creat64)>(sp::kSym_creat64);
  int fd = f ? f(path, mode)
             : static_cast<int>(syscall(SYS_openat, AT_FDCWD, path,
                                        O_CREAT | O_WRONLY | O_TRUNC | O_LARGEFILE, mode));
  sp::after_open(fd);
  return fd;
}

SLUICE_EXPORT int __open_2(const char* path, int flags) {
  auto f = next<decltype(&::__open_2)>(sp::kSym___open_2);
  int fd = f ? f(path, flags) : static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, flags));
  sp::after_open(fd);
  return fd;
}

SLUICE_EXPORT int __open64_2(const char* path, int flags) {
  auto f = next<decltype(&::__open64_2)>(sp::kSym___open64_2);
  int fd = f ? f(path, flags)
             : static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, flags | O_LARGEFILE));
  sp::after_open(fd);
  return fd;
}

SLUICE_EXPORT int __openat_2(int dirfd, const char* path, int flags) {
  auto f = next<decltype(&::__openat_2)>(sp::kSym___openat_2);
  int fd = f ? f(dirfd, path, flags) : static_cast<int>(syscall(SYS_openat, dirfd, path, flags));
  sp::after_open(fd);
  return fd;
}

SLUICE_EXPORT int __openat64_2(int dirfd, const char* path, int flags) {
  auto f = next<decltype(&::__openat64_2)>(sp::kSym___openat64_2);
  int fd = f ? f(dirfd, path, flags)
             : static_cast<int>(syscall(SYS_openat, dirfd, path, flags | O_LARGEFILE));
  sp::after_open(fd);
  return fd;
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

SLUICE_EXPORT int fsync(int fd) {
  return sp::data_call(
      CountedOp::kSync, Op::kSync, fd, [] { return std::uint64_t{0}; },
      [&] {
        auto f = next<decltype(&::fsync)>(sp::kSym_fsync);
        return f ? f(fd) : static_cast<int>(syscall(SYS_fsync, fd));
      });
}

SLUICE_EXPORT int fdatasync(int fd) {
  return sp::data_call(
      CountedOp::kSync, Op::kSync, fd, [] { return std::uint64_t{0}; },
      [&] {
        auto f = next<decltype(&::fdatasync)>(sp::kSym_fdatasync);
        return f ? f(fd) : static_cast<int>(syscall(SYS_fdatasync, fd));
      });
}

SLUICE_EXPORT int sync_file_range(int fd, off64_t off, off64_t nbytes, unsigned int flags) {
  return sp::data_call(
      CountedOp::kSync, Op::kSync, fd, [] { return std::uint64_t{0}; },
      [&] {
        auto f = next<decltype(&::sync_file_range)>(sp::kSym_sync_file_range);
        return f ? f(fd, off, nbytes, flags)
                 : static_cast<int>(syscall(SYS_sync_file_range, fd, off, nbytes, flags));
      });
}
