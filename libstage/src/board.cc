// The board (sluice/board.h): the sequence-locked slots, the control plane's
// writer, and the stage's memfd and feeds (board_stage.h).
#include "sluice/board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "board_stage.h"
#include "sluice/context.h"

namespace sluice {
namespace {

constexpr std::uint64_t kAllTunables = (std::uint64_t{1} << kMaxTunables) - 1;
constexpr std::size_t kBoardPage = 4096;

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

}  // namespace

bool read_board_slot(const BoardSlot& slot, BoardSlotValue& out, int attempts) noexcept {
  for (int i = 0; i < attempts; ++i) {
    const std::uint64_t before = slot.seq.load(std::memory_order_acquire);
    if (before & 1) continue;  // mid-write
    // Acquire loads (plain loads on x86): the second load of seq below cannot
    // move above them, and one that reads a field of a write in progress
    // synchronises with its release store, after that write's odd seq, so
    // the second load sees seq moved. (No fences: TSan does not model them.)
    out.tag = slot.tag.load(std::memory_order_acquire);
    out.mask = slot.mask.load(std::memory_order_acquire);
    for (std::size_t v = 0; v < kMaxTunables; ++v) {
      out.values[v] = std::bit_cast<double>(slot.values[v].load(std::memory_order_acquire));
    }
    if (slot.seq.load(std::memory_order_relaxed) == before) {
      out.seq = before;
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------
// The control plane's writer.

StatusOr<BoardWriter> BoardWriter::map(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::invalid(errno_text("board: fstat"));
  if (!S_ISREG(st.st_mode)) return Status::invalid("board: not a memory file");
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return Status::invalid("board: not a sealable memory file (memfd)");
  // Sealed against shrinking, no page of the mapping can vanish under a
  // write (which would be SIGBUS); against growing, the size checked below is
  // the size for good.
  if (!(seals & F_SEAL_SHRINK)) return Status::invalid("board: not sealed against shrinking");
  if (!(seals & F_SEAL_GROW)) return Status::invalid("board: not sealed against growing");
  if (static_cast<std::uint64_t>(st.st_size) != kBoardBytes) {
    return Status::invalid("board: " + std::to_string(st.st_size) + " bytes, expected " +
                           std::to_string(kBoardBytes));
  }
  void* p = ::mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::invalid(errno_text("board: mmap"));
  // The first page (the header and the first 31 slots, where a stage's
  // objects usually are) is made writable here, by populating it and by a
  // first write to `maps` (the count of control planes that mapped the board),
  // so that the first change written does not pay for it, stage after stage
  // (docs/benchmarks.md). Before Linux 5.14 the write alone faults it in.
  (void)::madvise(p, kBoardPage, MADV_POPULATE_WRITE);
  static_cast<BoardHeader*>(p)->maps.fetch_add(1, std::memory_order_relaxed);
  BoardWriter w;
  w.base_ = p;
  return w;
}

BoardWriter::BoardWriter(BoardWriter&& o) noexcept : base_(o.base_) {
  o.base_ = nullptr;
}

BoardWriter& BoardWriter::operator=(BoardWriter&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, kBoardBytes);
    base_ = o.base_;
    o.base_ = nullptr;
  }
  return *this;
}

BoardWriter::~BoardWriter() {
  if (base_ != nullptr) ::munmap(base_, kBoardBytes);
}

BoardSlot* BoardWriter::slot_at(std::size_t i) const noexcept {
  if (base_ == nullptr || i >= kBoardSlots) return nullptr;
  return board_slot(base_, i);
}

bool BoardWriter::write(std::size_t slot, std::uint64_t tag, std::uint64_t mask,
                        std::span<const double, kMaxTunables> values) noexcept {
  BoardSlot* s = slot_at(slot);
  if (s == nullptr || (mask & ~kAllTunables) != 0) return false;
  const std::uint64_t seq = s->seq.load(std::memory_order_relaxed);
  // Not taken yet, and for the same object: keep what that write set too.
  std::uint64_t all = mask;
  if (s->seen.load(std::memory_order_relaxed) != seq &&
      s->tag.load(std::memory_order_relaxed) == tag) {
    all |= s->mask.load(std::memory_order_relaxed) & kAllTunables;
  }
  // Odd whatever seq held (a writer that died mid-write left it odd).
  const std::uint64_t begin = (seq + 1) | 1;
  s->seq.store(begin, std::memory_order_relaxed);
  // Release stores (plain stores on x86) order the odd seq before each
  // field: a reader that reads any new field sees the odd seq (or later) on
  // its second load of seq.
  s->tag.store(tag, std::memory_order_release);
  s->mask.store(all, std::memory_order_release);
  for (std::size_t v = 0; v < kMaxTunables; ++v) {
    if (mask & (std::uint64_t{1} << v)) {
      s->values[v].store(std::bit_cast<std::uint64_t>(values[v]), std::memory_order_release);
    }
  }
  s->seq.store(begin + 1, std::memory_order_release);
  return true;
}

bool BoardWriter::read(std::size_t slot, BoardSlotValue& out) const noexcept {
  const BoardSlot* s = slot_at(slot);
  return s != nullptr && read_board_slot(*s, out);
}

bool BoardWriter::taken(std::size_t slot) const noexcept {
  const BoardSlot* s = slot_at(slot);
  return s != nullptr &&
         s->seen.load(std::memory_order_acquire) == s->seq.load(std::memory_order_acquire);
}

long send_with_fd(int sock, const void* data, std::size_t size, int fd) noexcept {
  iovec iov{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  ssize_t n;
  do {
    n = ::sendmsg(sock, &mh, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return static_cast<long>(n);
}

// ---------------------------------------------------------------------------
// The stage's side.

namespace detail {

StatusOr<std::unique_ptr<StageBoard>> StageBoard::create() {
  InternalIoScope internal;  // a preloaded stage's own calls
  // Made, moved high and set up under the lock of reserved descriptors, so
  // that no host dup2 or close_range acts on it meanwhile.
  ReservedFdLock lock;
  ReservedFd rfd =
      ReservedFd::adopt(lock, ::memfd_create("sluice-board", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  const int fd = rfd.get();
  if (fd < 0) return Status::unavailable(errno_text("board: memfd_create"));
  auto fail = [&rfd, &lock](const char* what) SLUICE_REQUIRES(detail::reserved_fd_mutex) {
    Status s = Status::unavailable(errno_text(what));
    rfd.close(lock);
    return s;
  };
  if (::ftruncate(fd, static_cast<off_t>(kBoardBytes)) != 0) return fail("board: ftruncate");
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail("board: sealing");
  }
  void* p = ::mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("board: mmap");
  // The slots are left as the memfd's zeroes, which is what zero-valued
  // atomics hold (constructing them would touch every page).
  auto* h = new (p) BoardHeader{};
  std::memcpy(h->magic, kBoardMagic, sizeof(h->magic));
  h->layout_version = kBoardLayoutVersion;
  h->slot_bytes = kBoardSlotBytes;
  h->slots = kBoardSlots;
  return std::unique_ptr<StageBoard>(new StageBoard(std::move(rfd), p));
}

StageBoard::~StageBoard() {
  InternalIoScope internal;
  ::munmap(base_, kBoardBytes);
  fd_.close();
}

BoardSlot* StageBoard::slot(std::size_t i) const noexcept {
  return board_slot(base_, i);
}

int StageBoard::allocate() {
  if (!free_.empty()) {
    const int i = free_.back();
    free_.pop_back();
    return i;
  }
  return next_ < static_cast<int>(kBoardSlots) ? next_++ : -1;
}

void StageBoard::release(int index) {
  free_.push_back(index);
}

void Feed::take(EnforcementObject& object, BoardSlot& s) noexcept {
  bool idle = false;
  if (!busy.compare_exchange_strong(idle, true, std::memory_order_acquire)) return;
  BoardSlotValue v;
  // Another thread may have taken this write between our poll and here.
  const bool pending =
      s.seq.load(std::memory_order_acquire) != s.seen.load(std::memory_order_acquire);
  if (pending && read_board_slot(s, v)) {
    if (v.tag == tag) {
      if (object.set_tunables(v.mask & kAllTunables, v.values).is_ok()) {
        taken.fetch_add(1, std::memory_order_relaxed);
        if (stage_taken != nullptr) stage_taken->fetch_add(1, std::memory_order_relaxed);
      } else {
        rejected.fetch_add(1, std::memory_order_relaxed);
      }
    }
    // A write for another tag (the slot's previous owner, told by a control
    // plane that had not heard of the change yet) is nothing for this object
    // but is seen all the same, so later requests skip it. Not when the slot
    // was taken from this object meanwhile: its new owner's write is not
    // ours to mark.
    if (slot.load(std::memory_order_relaxed) == &s) {
      s.seen.store(v.seq, std::memory_order_release);
    }
  }
  busy.store(false, std::memory_order_release);
}

void Feed::assign(StageBoard& board, std::atomic<std::uint64_t>* counter) {
  if (index >= 0) return;
  const int i = board.allocate();
  if (i < 0) return;  // every slot taken: this object goes without
  index = i;
  tag = board.next_tag();
  stage_taken = counter;
  BoardSlot* s = board.slot(static_cast<std::size_t>(i));
  // Whatever the slot held was for its previous owner.
  s->seen.store(s->seq.load(std::memory_order_acquire), std::memory_order_release);
  slot.store(s, std::memory_order_release);
}

void Feed::unassign(StageBoard& board) {
  if (index < 0) return;
  slot.store(nullptr, std::memory_order_release);
  board.release(index);
  index = -1;
}

}  // namespace detail
}  // namespace sluice
