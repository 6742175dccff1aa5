// Hold (sluice/hold.h): capacity held in one object for one flow.
#include "sluice/hold.h"

#include <algorithm>
#include <utility>

namespace sluice {

Hold::Hold(std::shared_ptr<EnforcementObject> object, const Context& ctx, std::uint64_t amount,
           Verdict verdict) noexcept
    : ctx_(ctx), verdict_(verdict) {
  if (object != nullptr && verdict.ok() && amount > 0) {
    object_ = std::move(object);
    amount_ = amount;
  }
}

Hold::Hold(Hold&& other) noexcept
    : object_(std::move(other.object_)),
      ctx_(other.ctx_),
      amount_(std::exchange(other.amount_, 0)),
      verdict_(other.verdict_) {}

Hold& Hold::operator=(Hold&& other) noexcept {
  if (this != &other) {
    release_all();
    object_ = std::move(other.object_);
    ctx_ = other.ctx_;
    amount_ = std::exchange(other.amount_, 0);
    verdict_ = other.verdict_;
  }
  return *this;
}

void Hold::release(std::uint64_t n) noexcept {
  const std::uint64_t m = std::min(n, amount_);
  if (m == 0) return;
  object_->release(ctx_, m);
  amount_ -= m;
  if (amount_ == 0) object_.reset();  // lets the object go as soon as nothing is held
}

bool Hold::same_place(const Hold& other) const noexcept {
  return object_ != nullptr && object_ == other.object_ && object_->same_flow(ctx_, other.ctx_);
}

bool Hold::absorb(Hold&& other) noexcept {
  if (&other == this) return false;
  if (!other.holds()) {
    other = Hold(other.verdict_);
    return true;
  }
  if (!holds()) {
    *this = std::move(other);
    return true;
  }
  if (!same_place(other)) return false;
  amount_ += std::exchange(other.amount_, 0);
  other.object_.reset();
  return true;
}

}  // namespace sluice
