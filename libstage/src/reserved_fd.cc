// The table of reserved descriptors (sluice/reserved_fd.h).
//
// Every call here on a descriptor is made under an InternalIoScope: under the
// preload, libc's close and fcntl are the interposed ones, which consult this
// very table for the host's calls and pass Sluice's own through.
#include "sluice/reserved_fd.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <new>

#include "sluice/context.h"
#include "sluice/dcheck.h"
#include "tls.h"

namespace sluice {
namespace {
// Whether this thread holds the table's lock (a signal handler may interrupt
// it there: vacate_reserved_fd and for_unreserved_ranges must not take it).
constinit SLUICE_TLS thread_local bool t_holding = false;
}  // namespace

namespace detail {

// A pthread mutex: constant-initialised (the preload's calls may come before
// any constructor ran), and waited on with a CLOCK_MONOTONIC deadline.
class SLUICE_CAPABILITY("mutex") ReservedFdMutex {
 public:
  void lock() noexcept SLUICE_ACQUIRE() {
    pthread_mutex_lock(&mu_);
    t_holding = true;
  }
  void unlock() noexcept SLUICE_RELEASE() {
    t_holding = false;
    pthread_mutex_unlock(&mu_);
  }
  // For code the analysis cannot follow to the lock (a caller's, held when a
  // signal handler interrupted it): from here on it counts as held.
  void assert_held() const noexcept SLUICE_ASSERT_CAPABILITY(this) {
    SLUICE_DCHECK(t_holding, "this thread holds the reserved-descriptor table's lock");
  }
  // pthread_cond_clockwait on `cond`: releases the lock while blocked.
  int wait_until_locked(pthread_cond_t* cond, const timespec& deadline) noexcept
      SLUICE_REQUIRES(this) {
    t_holding = false;
    const int r = pthread_cond_clockwait(cond, &mu_, CLOCK_MONOTONIC, &deadline);
    t_holding = true;
    return r;
  }
  // Across a fork (pthread_atfork): taken in the prepare handler, given up in
  // the parent's and the child's, which the analysis cannot pair.
  void lock_for_fork() noexcept SLUICE_NO_THREAD_SAFETY_ANALYSIS { pthread_mutex_lock(&mu_); }
  void unlock_after_fork() noexcept SLUICE_NO_THREAD_SAFETY_ANALYSIS { pthread_mutex_unlock(&mu_); }

 private:
  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
};

constinit ReservedFdMutex reserved_fd_mutex;

}  // namespace detail

using detail::reserved_fd_mutex;

struct ReservedPoller::Entry {
  WakeFn wake = nullptr;  // set before it is listed, then fixed
  void* ctx = nullptr;
  bool polling SLUICE_GUARDED_BY(reserved_fd_mutex) = false;  // inside poll()
  // The generation its numbers were read at.
  std::uint64_t gen SLUICE_GUARDED_BY(reserved_fd_mutex) = 0;
  // The list it was linked into (see g_list_epoch).
  std::uint64_t list SLUICE_GUARDED_BY(reserved_fd_mutex) = 0;
  Entry* next SLUICE_GUARDED_BY(reserved_fd_mutex) = nullptr;
  Entry* prev SLUICE_GUARDED_BY(reserved_fd_mutex) = nullptr;
};

namespace {

// The highest number a reserved descriptor is moved near: the soft limit,
// capped so that a huge limit does not make the kernel grow the process's
// descriptor table to match.
constexpr rlim_t kTopCap = 4096;
constexpr rlim_t kRoomMax = 32;
// How long a move waits for the polling threads to leave their polls.
constexpr long kMoveWaitNs = 1'000'000'000;

struct Slot {
  std::atomic<int> fd{-1};  // the number now; -1: free, or lost
  std::atomic<std::uint32_t> serial{0};
  bool used SLUICE_GUARDED_BY(reserved_fd_mutex) = false;
};

constinit Slot g_slots[kMaxReservedFds];
std::atomic<int> g_high{0};  // entries [0, g_high) may be in use
std::atomic<std::uint64_t> g_generation{0};
std::atomic<int> g_pid{0};  // the process the table's descriptors belong to
pthread_cond_t g_left_poll = PTHREAD_COND_INITIALIZER;
ReservedPoller::Entry* g_pollers SLUICE_GUARDED_BY(reserved_fd_mutex) = nullptr;
// A fork child starts a new list.
std::uint64_t g_list_epoch SLUICE_GUARDED_BY(reserved_fd_mutex) = 1;

int sys_dupfd(int fd, int from) noexcept {
  InternalIoScope internal;
  return ::fcntl(fd, F_DUPFD_CLOEXEC, from);
}
void sys_close(int fd) noexcept {
  InternalIoScope internal;
  (void)::close(fd);
}
void sys_set_cloexec(int fd) noexcept {
  InternalIoScope internal;
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0 && !(flags & FD_CLOEXEC)) (void)::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

// The lowest number reserved descriptors are moved to.
int reserved_base() noexcept {
  rlimit rl{};
  rlim_t top = kTopCap;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < top) {
    top = rl.rlim_cur;
  }
  const rlim_t room = std::clamp<rlim_t>(top / 4, 1, kRoomMax);
  const rlim_t base = top > room ? top - room : 0;
  return base < 3 ? 3 : static_cast<int>(base);
}

// A copy of `fd` at a high number (else at the lowest free one from 3:
// never 0-2, which a host expects open() to give it back), close-on-exec.
int dup_high(int fd) noexcept {
  int q = sys_dupfd(fd, reserved_base());
  if (q < 0) q = sys_dupfd(fd, 3);
  return q;
}

int find_slot(int fd) noexcept {
  const int high = g_high.load(std::memory_order_acquire);
  for (int i = 0; i < high; ++i) {
    if (g_slots[i].fd.load(std::memory_order_relaxed) == fd) return i;
  }
  return -1;
}

// Whether a poller that read its numbers before generation `gen` is still in
// its poll().
bool stale_poller_locked(std::uint64_t gen) noexcept SLUICE_REQUIRES(reserved_fd_mutex) {
  for (ReservedPoller::Entry* e = g_pollers; e != nullptr; e = e->next) {
    if (e->polling && e->gen < gen) return true;
  }
  return false;
}

int for_unreserved_ranges_locked(unsigned first, unsigned last,
                                 int (*fn)(unsigned, unsigned, void*), void* ctx) noexcept
    SLUICE_REQUIRES(reserved_fd_mutex) {
  int reserved[kMaxReservedFds];
  int count = 0;
  const int high = g_high.load(std::memory_order_acquire);
  for (int i = 0; i < high; ++i) {
    const int n = g_slots[i].fd.load(std::memory_order_relaxed);
    if (n >= 0 && static_cast<unsigned>(n) >= first && static_cast<unsigned>(n) <= last) {
      reserved[count++] = n;
    }
  }
  std::sort(reserved, reserved + count);
  int rc = 0;
  unsigned from = first;
  for (int i = 0; i < count && rc == 0; ++i) {
    const auto n = static_cast<unsigned>(reserved[i]);
    if (n > from) rc = fn(from, n - 1, ctx);
    from = n + 1;  // n < INT_MAX: no wrap
  }
  if (rc == 0 && from <= last) rc = fn(from, last, ctx);
  return rc;
}

void atfork_prepare() noexcept {
  reserved_fd_mutex.lock_for_fork();
}
void atfork_parent() noexcept {
  reserved_fd_mutex.unlock_after_fork();
}
// This thread locked reserved_fd_mutex in prepare and is the child's only thread. The
// parent's polling threads do not exist here.
void atfork_child() noexcept SLUICE_NO_THREAD_SAFETY_ANALYSIS {
  g_pollers = nullptr;
  ++g_list_epoch;
  pthread_cond_init(&g_left_poll, nullptr);
  g_pid.store(static_cast<int>(::getpid()), std::memory_order_relaxed);
  reserved_fd_mutex.unlock_after_fork();
}

// Registered before any handler of the preload (whose initialisation runs
// after libstage's static initialisers), so that a child's handlers find the
// lock released.
[[maybe_unused]] const bool g_registered = [] {
  g_pid.store(static_cast<int>(::getpid()), std::memory_order_relaxed);
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
  return true;
}();

}  // namespace

// ---------------------------------------------------------------------------

ReservedFdLock::ReservedFdLock() noexcept {
  reserved_fd_mutex.lock();
}
ReservedFdLock::~ReservedFdLock() {
  reserved_fd_mutex.unlock();
}
std::uint64_t ReservedFdLock::generation() const noexcept {
  return g_generation.load(std::memory_order_relaxed);
}

ReservedFd ReservedFd::adopt(const ReservedFdLock& /*lock*/, int fd) noexcept {
  ReservedFd r;
  if (fd < 0) return r;
  const int saved = errno;
  int q = fd;
  const int base = reserved_base();
  if (fd < base) {
    const int moved = dup_high(fd);
    if (moved >= 0 || fd < 3) sys_close(fd);
    if (moved < 0 && fd < 3) {
      errno = saved;
      return r;  // nowhere to put it but the host's standard numbers
    }
    if (moved >= 0) q = moved;
  }
  if (q == fd) sys_set_cloexec(q);
  for (int i = 0; i < kMaxReservedFds; ++i) {
    Slot& s = g_slots[i];
    if (s.used) continue;
    s.used = true;
    s.fd.store(q, std::memory_order_release);
    if (i >= g_high.load(std::memory_order_relaxed)) g_high.store(i + 1, std::memory_order_release);
    r.slot_ = i;
    r.serial_ = s.serial.load(std::memory_order_relaxed);
    errno = saved;
    return r;
  }
  r.own_ = q;  // the table is full: still high and close-on-exec
  errno = saved;
  return r;
}

ReservedFd::~ReservedFd() {
  close();
}

ReservedFd::ReservedFd(ReservedFd&& o) noexcept : slot_(o.slot_), serial_(o.serial_), own_(o.own_) {
  o.slot_ = -1;
  o.own_ = -1;
}

ReservedFd& ReservedFd::operator=(ReservedFd&& o) noexcept {
  if (this != &o) {
    close();
    slot_ = o.slot_;
    serial_ = o.serial_;
    own_ = o.own_;
    o.slot_ = -1;
    o.own_ = -1;
  }
  return *this;
}

int ReservedFd::get() const noexcept {
  if (slot_ < 0) return own_;
  const Slot& s = g_slots[slot_];
  if (s.serial.load(std::memory_order_acquire) != serial_) return -1;
  return s.fd.load(std::memory_order_acquire);
}

void ReservedFd::close() noexcept {
  if (!held()) return;
  ReservedFdLock lock;
  close(lock);
}

void ReservedFd::close(const ReservedFdLock& /*lock*/) noexcept {
  const int saved = errno;
  if (slot_ >= 0) {
    Slot& s = g_slots[slot_];
    if (s.used && s.serial.load(std::memory_order_relaxed) == serial_) {
      const int n = s.fd.exchange(-1, std::memory_order_acq_rel);
      s.used = false;
      s.serial.fetch_add(1, std::memory_order_release);
      if (n >= 0) sys_close(n);
    }
    slot_ = -1;
  }
  if (own_ >= 0) {
    sys_close(own_);
    own_ = -1;
  }
  errno = saved;
}

// ---------------------------------------------------------------------------

ReservedPoller::ReservedPoller(WakeFn wake, void* ctx) noexcept : entry_(new (std::nothrow) Entry) {
  if (entry_ == nullptr) return;  // then polls are unannounced (no move waits for them)
  entry_->wake = wake;
  entry_->ctx = ctx;
  ReservedFdLock lock;
  entry_->list = g_list_epoch;
  entry_->next = g_pollers;
  if (g_pollers != nullptr) g_pollers->prev = entry_;
  g_pollers = entry_;
}

ReservedPoller::~ReservedPoller() {
  if (entry_ == nullptr) return;
  reserved_fd_mutex.lock();
  if (entry_->list == g_list_epoch) {
    if (entry_->prev != nullptr) {
      entry_->prev->next = entry_->next;
    } else {
      g_pollers = entry_->next;
    }
    if (entry_->next != nullptr) entry_->next->prev = entry_->prev;
  }
  entry_->polling = false;
  pthread_cond_broadcast(&g_left_poll);
  reserved_fd_mutex.unlock();
  delete entry_;
}

int ReservedPoller::poll(ReservedFdLock& /*lock*/, pollfd* fds, nfds_t n, int timeout_ms,
                         bool* moved) noexcept {
  const std::uint64_t gen = g_generation.load(std::memory_order_relaxed);
  if (entry_ != nullptr) {
    entry_->gen = gen;
    entry_->polling = true;
  }
  reserved_fd_mutex.unlock();
  const int r = ::poll(fds, n, timeout_ms);
  const int saved = errno;
  reserved_fd_mutex.lock();
  if (entry_ != nullptr) {
    entry_->polling = false;
    pthread_cond_broadcast(&g_left_poll);
  }
  *moved = g_generation.load(std::memory_order_relaxed) != gen;
  errno = saved;
  return r;
}

// ---------------------------------------------------------------------------

bool is_reserved_fd(int fd) noexcept {
  return fd >= 0 && find_slot(fd) >= 0;
}

std::uint64_t reserved_fd_generation() noexcept {
  return g_generation.load(std::memory_order_acquire);
}

bool vacate_reserved_fd(int fd, bool* busy) noexcept {
  *busy = false;
  if (!is_reserved_fd(fd)) return false;
  if (t_holding) {
    *busy = true;
    return false;
  }
  const int saved = errno;
  // A vfork child shares this memory but has a descriptor table of its own:
  // the number it takes there is only its copy's, and nothing here may change.
  if (static_cast<int>(::getpid()) != g_pid.load(std::memory_order_relaxed)) {
    errno = saved;
    return false;
  }
  reserved_fd_mutex.lock();
  const int i = find_slot(fd);
  if (i < 0) {  // closed or moved meanwhile
    reserved_fd_mutex.unlock();
    errno = saved;
    return false;
  }
  g_slots[i].fd.store(dup_high(fd), std::memory_order_release);  // -1: lost
  const std::uint64_t gen = g_generation.fetch_add(1, std::memory_order_acq_rel) + 1;
  for (ReservedPoller::Entry* e = g_pollers; e != nullptr; e = e->next) {
    if (e->polling && e->gen < gen && e->wake != nullptr) e->wake(e->ctx);
  }
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_nsec += kMoveWaitNs % 1'000'000'000;
  deadline.tv_sec += kMoveWaitNs / 1'000'000'000 + deadline.tv_nsec / 1'000'000'000;
  deadline.tv_nsec %= 1'000'000'000;
  while (stale_poller_locked(gen)) {
    if (reserved_fd_mutex.wait_until_locked(&g_left_poll, deadline) == ETIMEDOUT) break;
  }
  reserved_fd_mutex.unlock();
  errno = saved;
  return true;
}

int for_unreserved_ranges(unsigned first, unsigned last, int (*fn)(unsigned, unsigned, void*),
                          void* ctx) noexcept {
  if (t_holding) {  // a signal handler interrupted this thread inside the lock
    reserved_fd_mutex.assert_held();
    return for_unreserved_ranges_locked(first, last, fn, ctx);
  }
  reserved_fd_mutex.lock();
  const int rc = for_unreserved_ranges_locked(first, last, fn, ctx);
  const int saved = errno;
  reserved_fd_mutex.unlock();
  errno = saved;
  return rc;
}

void close_reserved_fds_in_child() noexcept {
  const int saved = errno;
  reserved_fd_mutex.lock();
  const int high = g_high.load(std::memory_order_relaxed);
  for (int i = 0; i < high; ++i) {
    Slot& s = g_slots[i];
    if (!s.used) continue;
    const int n = s.fd.exchange(-1, std::memory_order_relaxed);
    s.used = false;
    s.serial.fetch_add(1, std::memory_order_relaxed);
    if (n >= 0) sys_close(n);
  }
  reserved_fd_mutex.unlock();
  errno = saved;
}

}  // namespace sluice
