// The stage's side of the board (sluice/board.h): the memfd it makes and
// maps, which of its slots are taken, and each object's link to its slot.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "sluice/board.h"
#include "sluice/enforcement_object.h"
#include "sluice/reserved_fd.h"
#include "sluice/status.h"

namespace sluice::detail {

// The board a stage made: a sealed memfd of kBoardBytes, mapped for its whole
// life (objects' feeds point into it, and threads may read a slot after its
// object was removed). The memfd is a reserved descriptor
// (sluice/reserved_fd.h): a host's dup2() onto its number moves it, and fd()
// then returns the new number (-1 if no number was free: the board is then
// not handed over again, and the mapping stays).
//
// Thread safety: fd() and slot() from any thread; allocate(), release() and
// next_tag() by the stage's control operations only (under its control mutex).
class StageBoard {
 public:
  // Fails when the system offers no sealable memfd (the stage then has no
  // board and works through its messages alone).
  static StatusOr<std::unique_ptr<StageBoard>> create();
  ~StageBoard();
  StageBoard(const StageBoard&) = delete;
  StageBoard& operator=(const StageBoard&) = delete;

  int fd() const noexcept { return fd_.get(); }
  BoardSlot* slot(std::size_t i) const noexcept;
  // A free slot's index, or -1 when every slot is taken.
  int allocate();
  void release(int index);
  // Tags are never reused, so a write meant for a slot's previous owner is
  // told from one for its current owner.
  std::uint64_t next_tag() noexcept { return ++last_tag_; }

 private:
  StageBoard(ReservedFd fd, void* base) : fd_(std::move(fd)), base_(base) {}
  ReservedFd fd_;
  void* base_ = nullptr;
  std::vector<int> free_;  // released slots, reused first
  int next_ = 0;           // slots [next_, kBoardSlots) were never handed out
  std::uint64_t last_tag_ = 0;
};

// An object's link to its slot. It lives as long as the object (in the
// stage's Mechanism), so routing targets point at it.
//
// Thread safety: poll() and take() from any thread; assign() and unassign()
// by the stage's control operations only.
struct Feed {
  std::atomic<BoardSlot*> slot{nullptr};              // null: no board, or no slot free
  std::uint64_t tag = 0;                              // written before `slot` is published
  int index = -1;                                     // control operations only
  std::atomic<std::uint64_t>* stage_taken = nullptr;  // the stage's count of `taken`
  std::atomic<bool> busy{false};                      // one taker at a time
  std::atomic<std::uint64_t> taken{0};                // writes applied
  std::atomic<std::uint64_t> rejected{0};             // writes the object refused

  // Inline on the way of every request to the object: a load of the slot
  // pointer and, with a board, one cache line that changes only when the
  // control plane writes it. A new write goes to take().
  void poll(EnforcementObject& object) noexcept {
    BoardSlot* s = slot.load(std::memory_order_acquire);
    if (s == nullptr || s->seq.load(std::memory_order_acquire) ==
                            s->seen.load(std::memory_order_relaxed)) [[likely]] {
      return;
    }
    take(object, *s);
  }
  // Reads the slot and hands its values to the object when they carry its
  // tag; then marks the write seen. Never waits: when another thread is
  // taking it, or the control plane is mid-write, it returns at once (the
  // next request tries again).
  void take(EnforcementObject& object, BoardSlot& s) noexcept;

  void assign(StageBoard& board, std::atomic<std::uint64_t>* counter);
  void unassign(StageBoard& board);
};

}  // namespace sluice::detail
