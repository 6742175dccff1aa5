// The board: memory a stage shares with its control plane, through which the
// control plane sets objects' tunables (EnforcementObject::tunables()) with
// plain stores, in effect for the stage's next request; the rules message that
// follows re-times waiters and is answered (docs/protocol.md, "The board").
//
// The stage makes it (a memfd sealed against shrinking and growing), gives
// each object with tunables a slot and a tag, and writes only `seen`. The
// control plane writes a slot under its sequence lock and nothing else, keeps
// its previous mask while `seen` != seq, and takes the board's size from the
// kernel (fstat, F_GET_SEALS), never from the header. A stage applies values
// only to the object whose tag they carry.
//
// Thread safety: BoardWriter is a value used by one thread at a time; any
// number of stage threads may read the same board while it writes.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sluice/status.h"

namespace sluice {

// Layout (version 1): a kBoardHeaderBytes header (BoardHeader), then
// kBoardSlots slots of kBoardSlotBytes (BoardSlot). In a slot, `seq` is even
// when stable and odd while the control plane writes; `tag` names the object
// the values are for; bit i of `mask` says values[i] (the object's tunables()
// order) is set; `seen` is the last seq the stage took.
inline constexpr int kBoardLayoutVersion = 1;
inline constexpr std::size_t kMaxTunables = 12;
inline constexpr std::size_t kBoardSlots = 1024;  // as many as a stage's channels and objects
inline constexpr std::size_t kBoardHeaderBytes = 128;
inline constexpr std::size_t kBoardSlotBytes = 128;
inline constexpr std::size_t kBoardBytes = kBoardHeaderBytes + kBoardSlots * kBoardSlotBytes;
inline constexpr char kBoardMagic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 'B', '1'};

// One slot. Every field is an atomic of a lock-free 8-byte type, so that
// concurrent readers and the writer (in another process) never race in the
// C++ sense; values are doubles stored as their bits.
struct BoardSlot {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> tag;
  std::atomic<std::uint64_t> mask;
  std::atomic<std::uint64_t> seen;
  std::array<std::atomic<std::uint64_t>, kMaxTunables> values;
};
static_assert(sizeof(BoardSlot) == kBoardSlotBytes);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

struct BoardHeader {
  char magic[8];
  std::uint32_t layout_version;
  std::uint32_t slot_bytes;
  std::uint32_t slots;
  std::uint32_t reserved;
  // Control planes that mapped the board (each adds one, which also makes
  // its first write to the board's first page happen then rather than in
  // its first change: see BoardWriter::map).
  std::atomic<std::uint64_t> maps;
};
static_assert(sizeof(BoardHeader) <= kBoardHeaderBytes);

// Slot `i` (< kBoardSlots) of a board mapped at `base`: where the stage, the
// control plane and tests all find it.
inline BoardSlot* board_slot(void* base, std::size_t i) noexcept {
  return reinterpret_cast<BoardSlot*>(static_cast<char*>(base) + kBoardHeaderBytes +
                                      i * kBoardSlotBytes);
}

// A stable read of one slot (BoardWriter::read, and the stage's own reads).
struct BoardSlotValue {
  std::uint64_t seq = 0;
  std::uint64_t tag = 0;
  std::uint64_t mask = 0;
  std::array<double, kMaxTunables> values{};
};

// Reads `slot` under its sequence lock: false when the writer is mid-write (or
// wrote during the read) `attempts` times in a row, so the caller never waits.
bool read_board_slot(const BoardSlot& slot, BoardSlotValue& out, int attempts = 4) noexcept;

// The control plane's side: a board a stage handed over, mapped for writing.
class BoardWriter {
 public:
  // Maps the board behind `fd` after checking, with the kernel's answers,
  // that it is one: a file of exactly kBoardBytes sealed against shrinking and
  // growing (F_SEAL_SHRINK | F_SEAL_GROW), as a memfd made by Stage::board()
  // is. The descriptor is not taken; the mapping outlives it. Errors say what
  // was wrong ("board: not sealed against shrinking", "board: 4096 bytes,
  // expected 131200").
  static StatusOr<BoardWriter> map(int fd);

  BoardWriter() = default;
  BoardWriter(BoardWriter&& o) noexcept;
  BoardWriter& operator=(BoardWriter&& o) noexcept;
  BoardWriter(const BoardWriter&) = delete;
  BoardWriter& operator=(const BoardWriter&) = delete;
  ~BoardWriter();

  bool mapped() const noexcept { return base_ != nullptr; }

  // Writes values for the tunables whose bit is set in `mask` (bit i:
  // values[i]) to `slot`, for the object tagged `tag`. When the stage has not
  // taken the slot's previous write for the same tag, that write's mask is
  // kept (its values stay where they are unless overwritten here). False,
  // writing nothing, when the slot or a mask bit is out of range.
  bool write(std::size_t slot, std::uint64_t tag, std::uint64_t mask,
             std::span<const double, kMaxTunables> values) noexcept;

  // A stable read of `slot` (tests, diagnostics): false when out of range or
  // mid-write.
  bool read(std::size_t slot, BoardSlotValue& out) const noexcept;
  // Whether the stage has taken the last write to `slot` (its `seen`).
  bool taken(std::size_t slot) const noexcept;

 private:
  BoardSlot* slot_at(std::size_t i) const noexcept;
  void* base_ = nullptr;
};

// Sends `data` on the stream socket `sock` in one sendmsg, with `fd` attached
// (SCM_RIGHTS) to its first byte. Returns what sendmsg returns (the bytes
// written, or -1 with errno set); the caller writes any rest without the fd.
long send_with_fd(int sock, const void* data, std::size_t size, int fd) noexcept;

}  // namespace sluice
