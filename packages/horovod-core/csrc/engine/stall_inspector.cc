#include "stall_inspector.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "common/logging.h"

namespace horovod {

namespace {
constexpr size_t kNamesPerRank = 5;
}

StallInspector::StallInspector(const Config& config, std::vector<int> global_ranks)
    : enabled_(!config.stall_check_disable && config.stall_check_time_seconds > 0),
      warning_seconds_(config.stall_check_time_seconds),
      shutdown_seconds_(config.stall_shutdown_time_seconds),
      global_ranks_(std::move(global_ranks)),
      last_check_(std::chrono::steady_clock::now()) {
  if (shutdown_seconds_ > 0 && shutdown_seconds_ < warning_seconds_) {
    HVD_LOG(WARNING) << "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (" << shutdown_seconds_
                     << ") is less than HOROVOD_STALL_CHECK_TIME_SECONDS (" << warning_seconds_
                     << "); stalls will be reported but will not shut Horovod down.";
    shutdown_seconds_ = 0;
  }
}

std::chrono::duration<double> StallInspector::eviction_time() const {
  return std::chrono::duration<double>(enabled_ ? warning_seconds_ : 0.0);
}

std::string StallInspector::Check(const std::unordered_map<std::string, PendingTensor>& pending,
                                  const std::set<int>& joined_set_ranks) {
  if (!enabled_) return "";
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_check_).count() < warning_seconds_) return "";
  last_check_ = now;

  const int size = static_cast<int>(global_ranks_.size());
  // Per missing global rank: the stalled tensors it has not submitted, and whether any of them is
  // past the shutdown time.
  std::map<int, std::vector<std::string>> missing;
  std::map<int, bool> past_shutdown;
  // The tensors past the shutdown time, longest-waiting first: (seconds, name, missing ranks).
  std::vector<std::tuple<double, std::string, std::vector<int>>> over_shutdown;
  for (const auto& [name, tensor] : pending) {
    double waited = std::chrono::duration<double>(now - tensor.first_seen).count();
    if (waited < warning_seconds_) continue;
    std::vector<bool> submitted(size, false);
    for (const Request& r : tensor.requests) submitted[r.rank] = true;
    bool over = shutdown_seconds_ > 0 && waited >= shutdown_seconds_;
    std::vector<int> absent;
    for (int r = 0; r < size; ++r) {
      if (submitted[r] || joined_set_ranks.count(r)) continue;
      int global = global_ranks_[r];
      absent.push_back(global);
      missing[global].push_back(name);
      past_shutdown[global] = past_shutdown[global] || over;
    }
    if (over && !absent.empty()) over_shutdown.emplace_back(waited, name, absent);
  }
  if (missing.empty()) return "";

  std::ostringstream msg;
  msg << "Stalled tensors: some ranks submitted the tensors below more than " << warning_seconds_
      << " seconds ago and other ranks have not submitted them yet. This usually means ranks are submitting "
         "different tensors, or only some ranks are submitting, and the job will deadlock. Missing ranks "
         "(global rank: tensors it has not submitted";
  if (shutdown_seconds_ > 0) msg << "; '!' marks ranks stalled longer than " << shutdown_seconds_ << " seconds";
  msg << "):";
  for (auto& [rank, names] : missing) {
    msg << "\n" << rank << (past_shutdown[rank] ? "!" : "") << ": [";
    for (size_t i = 0; i < names.size() && i < kNamesPerRank; ++i) msg << (i ? ", " : "") << names[i];
    if (names.size() > kNamesPerRank) msg << ", ...";
    msg << "]";
  }
  HVD_LOG(WARNING) << msg.str();

  if (over_shutdown.empty()) return "";
  std::sort(over_shutdown.begin(), over_shutdown.end(), [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  std::ostringstream reason;
  reason << "Horovod shut down: " << over_shutdown.size() << (over_shutdown.size() > 1 ? " tensors" : " tensor")
         << " waited more than " << shutdown_seconds_
         << " seconds (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS) for ranks that did not submit them:";
  for (size_t i = 0; i < over_shutdown.size() && i < kNamesPerRank; ++i) {
    const auto& [waited, name, absent] = over_shutdown[i];
    reason << (i ? "; '" : " '") << name << "' (" << static_cast<int64_t>(waited) << " s, not submitted by rank"
           << (absent.size() > 1 ? "s " : " ");
    for (size_t j = 0; j < absent.size(); ++j) reason << (j ? ", " : "") << absent[j];
    reason << ")";
  }
  if (over_shutdown.size() > kNamesPerRank) reason << "; ...";
  reason << ". The ranks were submitting different collectives.";
  HVD_LOG(ERROR) << "A rank marked '!' has stalled longer than " << shutdown_seconds_
                 << " seconds; shutting Horovod down. " << reason.str();
  return reason.str();
}

}  // namespace horovod
