// Deadlocks across process sets (controller.h): this rank is stuck when a caller waits and
// nothing completed or was submitted here for twice the deadlock timeout (so that a deadlock
// within one set, reported after the timeout, or 1.5 times it for cached tensors, is reported as
// such first, and the ranks it frees are no longer stuck).
#include "engine/engine.h"

namespace horovod {

bool Engine::StuckAcrossSets(std::chrono::steady_clock::time_point now) {
  const uint64_t submissions = submissions_.load();
  if (submissions != seen_submissions_) {
    seen_submissions_ = submissions;
    last_activity_ = now;
  }
  const auto timeout = std::chrono::duration<double>(2 * config_.deadlock_timeout_seconds);
  return timeout.count() > 0 && now - last_activity_ >= timeout && sets_->AnyCallerWaiting();
}

}  // namespace horovod
