#include "sluice/clock.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "sluice/dcheck.h"

namespace sluice {
namespace {

class SystemClock final : public Clock {
 public:
  std::int64_t now_ns() const noexcept override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                  std::int64_t deadline_ns) override {
    cv.wait_until(lock,
                  std::chrono::steady_clock::time_point(std::chrono::nanoseconds(deadline_ns)));
  }

  void wait_briefly(std::unique_lock<std::mutex>& lock, std::condition_variable& /*cv*/,
                    std::int64_t /*deadline_ns*/) override {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
};

}  // namespace

Clock& system_clock() noexcept {
  // Never destroyed: exit handlers (a preloaded stage writing its statistics)
  // may read the time after static destructors ran, and a destroyed clock's
  // vtable is Clock's, whose now_ns() is pure.
  static SystemClock* clock = new SystemClock();
  return *clock;
}

// ManualClock. A sleeper is registered under mu_ while its caller holds the
// sleeper's mutex, and stays in sleepers_ until either the sleeper removes
// itself (woken by its own cv) or wake_due() claims it. A claimed sleeper is
// notified by wake_due() with the sleeper's mutex held, so the notification
// cannot fall between registration and the wait; wake_due() marks it done
// (cv = nullptr) under both locks, and the sleeper does not return (and its
// Sleeper does not go away) before that. Lock order everywhere: the sleeper's
// mutex, then mu_; wake_due() never holds mu_ while it takes a sleeper's mutex.

std::int64_t ManualClock::now_ns() const noexcept {
  MutexLock guard(mu_);
  return now_;
}

void ManualClock::wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                             std::int64_t deadline_ns) {
  Sleeper self{lock.mutex(), &cv, deadline_ns};
  {
    MutexLock guard(mu_);
    if (now_ >= deadline_ns) return;
    sleepers_.push_back(&self);
  }
  for (;;) {
    cv.wait(lock);
    MutexLock guard(mu_);
    auto it = std::find(sleepers_.begin(), sleepers_.end(), &self);
    if (it != sleepers_.end()) {  // woken by the caller's cv or spuriously
      sleepers_.erase(it);
      return;
    }
    if (self.cv == nullptr) return;  // claimed and notified by wake_due()
    // Claimed, but wake_due() has not notified yet: it waits for our mutex,
    // which the next cv.wait releases.
  }
}

void ManualClock::advance(std::int64_t delta_ns) {
  {
    MutexLock guard(mu_);
    now_ += delta_ns;
  }
  wake_due();
}

void ManualClock::set(std::int64_t now_ns) {
  {
    MutexLock guard(mu_);
    now_ = now_ns;
  }
  wake_due();
}

int ManualClock::waiters() const {
  MutexLock guard(mu_);
  return static_cast<int>(sleepers_.size());
}

void ManualClock::wake_due() {
  std::vector<Sleeper*> due;
  {
    MutexLock guard(mu_);
    const std::int64_t now = now_;
    auto first_due = std::stable_partition(sleepers_.begin(), sleepers_.end(),
                                           [now](Sleeper* s) { return s->deadline > now; });
    due.assign(first_due, sleepers_.end());
    sleepers_.erase(first_due, sleepers_.end());
  }
  for (Sleeper* s : due) {
    std::lock_guard<std::mutex> sleeper_lock(*s->mu);
    std::condition_variable* cv = s->cv;
    SLUICE_DCHECK(cv != nullptr, "a sleeper is claimed and notified once");
    {
      MutexLock guard(mu_);
      s->cv = nullptr;  // done: from here on `s` may vanish once its mutex is free
    }
    cv->notify_all();
  }
}

std::int64_t SimClock::now_ns() const noexcept {
  MutexLock guard(mu_);
  return now_;
}

void SimClock::wait_until(std::unique_lock<std::mutex>& /*lock*/, std::condition_variable& /*cv*/,
                          std::int64_t deadline_ns) {
  MutexLock guard(mu_);
  now_ = std::max(now_, deadline_ns);
}

void SimClock::advance(std::int64_t delta_ns) {
  MutexLock guard(mu_);
  now_ += delta_ns;
}

}  // namespace sluice
