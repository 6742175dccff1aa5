// Not built: scripts/check-thread-safety.sh runs clang's analysis over this
// file with -verify: every contract broken below must be reported exactly as
// the comment before it expects (no more, no fewer). It shows that the
// annotations of sluice/thread_annotations.h reach the analysis, so a clean
// run over the tree means the contracts hold rather than went unchecked.
#include <condition_variable>

#include "sluice/thread_annotations.h"

namespace {

class Account {
 public:
  void deposit(int n) {
    sluice::MutexLock lock(mu_);
    add_locked(n);
  }
  void deposit_unlocked(int n) {
    // expected-warning@+1 {{calling function 'add_locked' requires holding mutex 'mu_'}}
    add_locked(n);
  }
  int peek() const {
    // expected-warning@+1 {{reading variable 'balance_' requires holding mutex 'mu_'}}
    return balance_;
  }
  void poke() {
    // expected-warning@+1 {{writing variable 'balance_' requires holding mutex 'mu_'}}
    balance_ = 0;
  }
  void relock() {
    sluice::MutexLock lock(mu_);
    lock.unlock();
    // expected-warning@+1 {{writing variable 'balance_' requires holding mutex 'mu_'}}
    balance_ = 1;
    lock.lock();
    balance_ = 2;
  }
  void wait_for_money(std::condition_variable& cv) {
    sluice::MutexLock lock(mu_);
    while (balance_ == 0) lock.wait(cv);
    balance_ -= 1;
  }
  void twice() {
    // expected-note@+1 {{mutex acquired here}}
    sluice::MutexLock lock(mu_);
    // expected-warning@+1 {{acquiring mutex 'mu_' that is already held}}
    sluice::MutexLock again(mu_);
  }
  void leak() {
    // expected-note@+1 {{mutex acquired here}}
    mu_.lock();
    // expected-warning@+1 {{mutex 'mu_' is still held at the end of function}}
  }
  void outside() SLUICE_EXCLUDES(mu_) {}
  void call_outside() {
    sluice::MutexLock lock(mu_);
    // expected-warning@+1 {{cannot call function 'outside' while mutex 'mu_' is held}}
    outside();
  }

 private:
  void add_locked(int n) SLUICE_REQUIRES(mu_) { balance_ += n; }
  mutable sluice::Mutex mu_;
  int balance_ SLUICE_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Account a;
  a.deposit(1);
  a.deposit_unlocked(1);
  a.relock();
  a.twice();
  a.leak();
  a.call_outside();
  return a.peek();
}
