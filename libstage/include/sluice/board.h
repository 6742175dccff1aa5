// The board: memory a stage shares with its control plane, through which the
// control plane sets its enforcement objects' tunables (the numeric settings
// an object lists in EnforcementObject::tunables(), e.g. a drl's rate) with
// plain stores instead of a message. A new value is in effect for the stage's
// next request the moment the store lands: no thread of the stage is woken,
// no syscall is made on either side. The rules message carrying the same
// change still follows over the socket (docs/protocol.md, "The board"): it
// re-times requests already waiting in an object, moves the stage's rules
// version and is answered, so the board only ever brings a change earlier.
//
// Layout (version 1), kBoardBytes in all, every field naturally aligned:
//   header, kBoardHeaderBytes: magic "SLUICEB1", layout version, slot size,
//           slot count (informational: both sides know the layout), and
//           the number of times a control plane mapped it
//   kBoardSlots slots of kBoardSlotBytes (two cache lines) each:
//     seq     u64  even when stable, odd while the control plane writes
//     tag     u64  the object the values are meant for (its board tag)
//     mask    u64  bit i set: values[i] is a value for tunable i
//     seen    u64  the last seq the stage took (the stage writes it)
//     values  f64 x kMaxTunables, in the object's tunables() order
//
// Who writes what. The stage makes the board (a memfd sealed against
// shrinking and growing, so that no mapping of it can ever fault), gives each
// of its objects that has tunables a slot and a tag, lists both in its
// description (ObjectInfo::board_slot, board_tag, tunables), and writes only
// `seen`. The control plane writes a slot with a sequence lock (seq odd,
// fields, seq even) and nothing else. The stage reads a slot's values only
// when its seq is even and unchanged across the read, and applies them only
// to the object whose tag they carry: a slot freed by a removed object and
// given to a new one never passes the old one's values on. Values the object
// refuses (a negative rate) are dropped and counted; the message that follows
// reports the error.
//
// A write that lands before the stage took the previous one adds to it: the
// control plane keeps the previous write's mask when `seen` != seq, so a
// change of "rate" followed at once by one of "burst" loses neither.
//
// Trust. What the control plane reads from a board decides nothing but what
// it writes to that same board: `seen`, and its own previous write's tag and
// mask, tell it whether to keep that mask; a stage that scribbles on them only
// confuses its own objects. Indices and sizes come from the control plane's
// own knowledge: the board's size and seals from the kernel's answers (fstat,
// F_GET_SEALS), never from the header, and slots are bounded by kBoardSlots.
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
