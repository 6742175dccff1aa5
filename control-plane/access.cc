// Per-action authorisation of the daemon's peers (access.h).
#include "access.h"

#include <algorithm>
#include <string>

namespace sluice::control {

std::string_view action_name(Action a) noexcept {
  switch (a) {
    case Action::kConnect:
      return "use this daemon";
    case Action::kRead:
      return "read the daemon's state";
    case Action::kHello:
      return "register a stage";
    case Action::kApplyRules:
      return "apply rules";
    case Action::kSetPolicy:
      return "set the policy";
  }
  return "?";
}

bool AccessRules::is_admin(std::uint32_t uid) const noexcept {
  return uid == 0 || uid == daemon_uid ||
         std::find(admin_uids.begin(), admin_uids.end(), uid) != admin_uids.end();
}

bool AccessRules::admits(std::uint32_t uid) const noexcept {
  return is_admin(uid) || std::find(allow_uids.begin(), allow_uids.end(), uid) != allow_uids.end();
}

Status authorize(const AccessRules& rules, std::uint32_t uid, Action action, std::string_view stage,
                 std::uint32_t stage_owner) {
  const std::string who = "permission denied: uid " + std::to_string(uid) + " may not ";
  const std::string admins =
      "root, the daemon's uid " + std::to_string(rules.daemon_uid) + " or an --admin-uid";
  if (!rules.admits(uid)) {
    return Status::permission_denied(who + std::string(action_name(Action::kConnect)) +
                                     " (admitted: " + admins + ", or an --allow-uid)");
  }
  switch (action) {
    case Action::kConnect:
    case Action::kRead:
    case Action::kHello:
      return Status::ok();
    case Action::kApplyRules:
      if (uid == stage_owner || rules.is_admin(uid)) return Status::ok();
      return Status::permission_denied(
          who + "apply rules to stage '" + std::string(stage) + "', which uid " +
          std::to_string(stage_owner) +
          " owns (only a stage's owner or an administrator may: " + admins + ")");
    case Action::kSetPolicy:
      if (rules.is_admin(uid)) return Status::ok();
      return Status::permission_denied(
          who + "set the policy (only an administrator may: " + admins + ")");
  }
  return Status::permission_denied(who + std::string(action_name(action)));
}

}  // namespace sluice::control
