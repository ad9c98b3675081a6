// The stall inspector (spec core.md §10): on a process set's coordinator, finds tensors that some
// ranks submitted and others have not for longer than HOROVOD_STALL_CHECK_TIME_SECONDS, logs which
// ranks are missing which tensors, and past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS asks for shutdown.
#pragma once

#include <chrono>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "common/message.h"

namespace horovod {

// A tensor the coordinator has heard of from some ranks of the set.
struct PendingTensor {
  std::vector<Request> requests;  // one per submitting rank; Request::rank is the set rank
  std::chrono::steady_clock::time_point first_seen;
};

class StallInspector {
 public:
  // `global_ranks[i]` is the global rank of set rank i (used in messages).
  StallInspector(const Config& config, std::vector<int> global_ranks);

  // Called by the coordinator once per cycle. When the check interval has elapsed, logs one
  // warning listing, per missing global rank, up to 5 of the tensors it has not submitted. Returns
  // the shutdown reason when some tensor has waited past the shutdown time, else "".
  std::string Check(const std::unordered_map<std::string, PendingTensor>& pending,
                    const std::set<int>& joined_set_ranks);

  // How long a cached tensor may wait for the other ranks before it is evicted from the response
  // cache so that it is negotiated (and reported) through the coordinator; 0 when disabled.
  std::chrono::duration<double> eviction_time() const;

 private:
  bool enabled_;
  double warning_seconds_;
  double shutdown_seconds_;
  std::vector<int> global_ranks_;
  std::chrono::steady_clock::time_point last_check_;
};

}  // namespace horovod
