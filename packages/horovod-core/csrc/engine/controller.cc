#include "controller.h"

#include <algorithm>
#include <sstream>
#include <string_view>
#include <stdexcept>

#include "collectives/collective.h"
#include "common/fusion.h"
#include "common/logging.h"
#include "common/timeline.h"

namespace horovod {

namespace {

int64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
}

// The user's part of a binding-generated name "<op>.<user name>" (spec core.md §6.1; "grouped_" and
// MXNet's "horovod_" may come before <op>), or an empty view when `name` has no such prefix.
std::string_view UserName(std::string_view name) {
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos) return {};
  std::string_view op = name.substr(0, dot);
  for (std::string_view lead : {"horovod_", "grouped_"}) {
    if (op.substr(0, lead.size()) == lead) op.remove_prefix(lead.size());
  }
  const Collective* collective = CollectiveNamed(op);
  if (collective != nullptr && collective->has_tensors()) return name.substr(dot + 1);
  return {};
}

}  // namespace

Controller::Controller(Communicator& backend, std::vector<int> global_ranks, const Config& config, Timeline* timeline,
                       int32_t set_id)
    : backend_(backend),
      global_ranks_(std::move(global_ranks)),
      config_(config),
      timeline_(timeline),
      cache_(static_cast<size_t>(std::max<int64_t>(config.cache_capacity, 0))),
      fusion_threshold_bytes_(config.fusion_threshold_bytes),
      stall_inspector_(config, global_ranks_),
      set_id_(set_id),
      deadlock_timeout_(std::max(config.deadlock_timeout_seconds, 0.0)),
      last_news_(std::chrono::steady_clock::now()),
      waiting_(global_ranks_.size(), false) {}

void Controller::SetHosts(const std::vector<std::string>& global_hosts) {
  hosts_.clear();
  for (int global : global_ranks_) {
    if (global < 0 || global >= static_cast<int>(global_hosts.size())) {
      hosts_.clear();
      return;
    }
    hosts_.push_back(global_hosts[global]);
  }
}

bool Controller::DeadlockDue(std::chrono::steady_clock::time_point now, const std::vector<bool>& waiting) const {
  if (deadlock_timeout_.count() <= 0 || now - last_news_ < deadlock_timeout_) return false;
  return EveryRankWaitsOnPending(waiting);
}

bool Controller::EveryRankWaitsOnPending(const std::vector<bool>& waiting) const {
  if (pending_.empty()) return false;
  // Every rank that has not joined waits, and waits on something the coordinator holds (a rank
  // waiting on a cached tensor it has not sent yet sends it first).
  std::vector<bool> has_pending(waiting.size(), false);
  for (const auto& [name, tensor] : pending_) {
    for (const Request& r : tensor.requests) has_pending[r.rank] = true;
  }
  for (size_t rank = 0; rank < waiting.size(); ++rank) {
    if (joined_ranks_.count(static_cast<int>(rank))) continue;
    if (!waiting[rank] || !has_pending[rank]) return false;
  }
  return true;
}

std::vector<Response> Controller::FailDeadlock(std::chrono::steady_clock::time_point now, bool across_sets) {
  // Across sets, what fails is what the ranks were stuck on. A tensor that first arrived in this
  // very round was submitted by a rank that the verdict freed a moment ago (the global set fails
  // its tensors first, in the same cycle, and its ranks' callers may submit to this set before its
  // negotiation), so it stays pending: failing it would fail the operation that follows the
  // deadlock, and rank 0 (here, say) would then wait for it alone.
  std::vector<std::string> names;
  for (const std::string& name : arrival_order_) {
    if (!across_sets || pending_.at(name).first_seen < now) names.push_back(name);
  }
  if (names.empty()) return {};
  const int size = backend_.size();
  std::ostringstream msg;
  if (across_sets) {
    msg << "Deadlock across process sets: every rank of the job has waited at least " << 2 * deadlock_timeout_.count()
        << " s (twice HOROVOD_DEADLOCK_TIMEOUT_SECONDS) on operations that cannot complete, and none completed; in "
           "process set "
        << set_id_ << ":";
  } else {
    msg << "Deadlock: every rank of process set " << set_id_ << " has waited "
        << std::chrono::duration<double>(now - last_news_).count()
        << " s (HOROVOD_DEADLOCK_TIMEOUT_SECONDS=" << deadlock_timeout_.count()
        << ") on operations that cannot complete, because the ranks submitted different operations:";
  }
  const char* separator = " ";
  for (int rank = 0; rank < size; ++rank) {
    if (joined_ranks_.count(rank)) continue;
    msg << separator << "rank " << global_ranks_[rank];
    if (!hosts_.empty()) msg << " (host " << hosts_[rank] << ")";
    msg << " waits on ";
    separator = "; ";
    size_t shown = 0;
    for (const std::string& name : names) {
      const PendingTensor& tensor = pending_.at(name);
      const Request* own = nullptr;
      for (const Request& r : tensor.requests) {
        if (r.rank == rank) own = &r;
      }
      if (!own) continue;
      if (shown++ == 5) {
        msg << ", ...";
        break;
      }
      std::vector<int> missing;
      std::vector<bool> submitted(size, false);
      for (const Request& r : tensor.requests) submitted[r.rank] = true;
      for (int r = 0; r < size; ++r) {
        if (!submitted[r] && !joined_ranks_.count(r)) missing.push_back(global_ranks_[r]);
      }
      msg << (shown > 1 ? ", " : "") << name << " (" << OpTypeName(own->type) << ", not submitted by rank"
          << (missing.size() > 1 ? "s " : " ");
      for (size_t i = 0; i < missing.size(); ++i) msg << (i ? ", " : "") << missing[i];
      msg << ")";
    }
    if (shown == 0) msg << "an operation of another process set";  // (only across sets)
  }
  return FailPending(names, msg.str(), now);
}

std::vector<std::string> Controller::SplitNames() const {
  // Pending names by user name; a user name under which the ranks submitted different collectives,
  // each rank exactly one of them and every rank that has not joined some, can never complete.
  std::unordered_map<std::string_view, std::vector<const std::string*>> by_user_name;
  for (const std::string& name : arrival_order_) {
    std::string_view user = UserName(name);
    if (!user.empty()) by_user_name[user].push_back(&name);
  }
  const int size = backend_.size();
  for (const std::string& name : arrival_order_) {
    auto group = by_user_name.find(UserName(name));
    if (group == by_user_name.end() || group->second.size() < 2) continue;
    std::vector<int> submissions(size, 0);
    std::set<OpType> types;
    for (const std::string* member : group->second) {
      for (const Request& r : pending_.at(*member).requests) {
        ++submissions[r.rank];
        types.insert(r.type);
      }
    }
    bool split = types.size() > 1;
    for (int rank = 0; rank < size && split; ++rank) {
      split = joined_ranks_.count(rank) ? submissions[rank] == 0 : submissions[rank] == 1;
    }
    if (!split) continue;
    std::vector<std::string> names;
    for (const std::string* member : group->second) names.push_back(*member);
    return names;
  }
  return {};
}

std::vector<Response> Controller::FailSplit(const std::vector<std::string>& names,
                                            std::chrono::steady_clock::time_point now) {
  std::ostringstream msg;
  msg << "Mismatched operations: the ranks of process set " << set_id_ << " submitted the name '"
      << UserName(names[0]) << "' as different collectives:";
  const char* separator = " ";
  for (int rank = 0; rank < backend_.size(); ++rank) {
    for (const std::string& name : names) {
      for (const Request& r : pending_.at(name).requests) {
        if (r.rank != rank) continue;
        msg << separator << "rank " << global_ranks_[rank];
        if (!hosts_.empty()) msg << " (host " << hosts_[rank] << ")";
        msg << " submitted " << OpTypeName(r.type) << " " << name;
        separator = "; ";
      }
    }
  }
  msg << ". The same name must be the same collective on every rank.";
  return FailPending(names, msg.str(), now);
}

std::vector<Response> Controller::FailPending(const std::vector<std::string>& names, const std::string& message,
                                              std::chrono::steady_clock::time_point now) {
  HVD_LOG(ERROR) << message;
  const bool record = timeline_ != nullptr && timeline_->recording();
  std::vector<Response> out;
  for (const std::string& name : names) {
    if (record) timeline_->NegotiateEnd(name);
    Response error;
    error.type = OpType::ERROR;
    error.names.push_back(name);
    error.error_message = message;
    out.push_back(std::move(error));
    pending_.erase(name);
  }
  arrival_order_.erase(std::remove_if(arrival_order_.begin(), arrival_order_.end(),
                                      [&](const std::string& n) {
                                        return std::find(names.begin(), names.end(), n) != names.end();
                                      }),
                       arrival_order_.end());
  last_news_ = now;
  return out;
}

void Controller::ApplyParameters(int64_t fusion_threshold_bytes, size_t cache_capacity) {
  fusion_threshold_bytes_ = fusion_threshold_bytes;
  // Held hits go to the coordinator next cycle when the cache is off; sent_ keeps waiting for
  // its responses either way.
  if (cache_capacity != cache_.capacity()) cache_ = ResponseCache(cache_capacity);
}

Response Controller::BuildResponse(const std::string& name, std::vector<Request> requests) {
  Response response;
  response.names.push_back(name);
  std::string mismatch = FindMismatch(requests, {!joined_ranks_.empty(), fusion_threshold_bytes_});
  if (!mismatch.empty()) {
    response.type = OpType::ERROR;
    response.error_message = mismatch;
    return response;
  }
  const Request& first = requests[0];
  response.type = first.type;
  response.dtype = first.dtype;
  response.reduce_op = first.reduce_op;
  response.prescale_factor = first.prescale_factor;
  response.postscale_factor = first.postscale_factor;
  response.root_rank = first.root_rank;
  response.device = first.device;
  response.group_id = first.group_id;
  CollectiveFor(first.type).Describe(requests, backend_.size(), &response);
  return response;
}

ResponseList Controller::Coordinate(std::vector<RequestList>& lists) {
  ResponseList out;
  const auto now = std::chrono::steady_clock::now();
  const bool record = timeline_ != nullptr && timeline_->recording();
  for (int rank = 0; rank < static_cast<int>(lists.size()); ++rank) {
    RequestList& list = lists[rank];
    waiting_[rank] = list.waiting;
    if (!list.requests.empty()) last_news_ = now;
    if (list.shutdown) {
      out.shutdown = true;
      if (out.shutdown_reason.empty()) out.shutdown_reason = list.shutdown_reason;
    }
    for (Request& request : list.requests) {
      request.rank = rank;
      if (request.type == OpType::JOIN) {
        joined_ranks_.insert(rank);
        last_joined_ = global_ranks_[rank];
        continue;
      }
      auto [it, inserted] = pending_.try_emplace(request.name);
      if (inserted) {
        it->second.first_seen = now;
        arrival_order_.push_back(request.name);
        if (record) timeline_->NegotiateStart(request.name, request.type);
      }
      if (record) timeline_->NegotiateRankReady(request.name, global_ranks_[rank]);
      it->second.requests.push_back(std::move(request));
    }
  }

  // A name is ready once every rank that has not joined has submitted it.
  const int size = backend_.size();
  const int active = size - static_cast<int>(joined_ranks_.size());
  std::vector<std::string> still_pending;
  for (const std::string& name : arrival_order_) {
    auto it = pending_.find(name);
    int submitted = 0;
    for (const Request& r : it->second.requests) submitted += joined_ranks_.count(r.rank) ? 0 : 1;
    if (active > 0 && submitted == active) {
      if (record) timeline_->NegotiateEnd(name);
      out.responses.push_back(BuildResponse(name, std::move(it->second.requests)));
      pending_.erase(it);
    } else {
      still_pending.push_back(name);
    }
  }
  arrival_order_.swap(still_pending);
  if (!out.responses.empty()) {
    last_news_ = now;
  } else if (job_deadlocked_ && !pending_.empty()) {
    out.responses = FailDeadlock(now, /*across_sets=*/true);
  } else if (EveryRankWaitsOnPending(waiting_)) {
    // Nothing completes while every rank waits: either the ranks used one name for different
    // collectives (reported at once), or a deadlock once nothing arrived for the timeout.
    std::vector<std::string> split = SplitNames();
    if (!split.empty()) {
      out.responses = FailSplit(split, now);
    } else if (DeadlockDue(now, waiting_)) {
      out.responses = FailDeadlock(now);
    }
  }

  if (static_cast<int>(joined_ranks_.size()) == size) {
    Response join;
    join.type = OpType::JOIN;
    join.names.push_back("join.noname");
    join.tensor_sizes.push_back(last_joined_);
    out.responses.push_back(std::move(join));
    joined_ranks_.clear();
  }
  out.any_joined = !joined_ranks_.empty();
  return out;
}

ResponseList Controller::Negotiate(const RequestList& mine) {
  ++stats_.coordinator_rounds;
  force_round_ = false;
  if (backend_.size() == 1) {
    std::vector<RequestList> lists{mine};
    ResponseList list = Coordinate(lists);
    list.parameters = std::move(outgoing_parameters_);
    outgoing_parameters_.reset();
    return list;
  }
  const int root = 0;
  std::vector<std::vector<char>> gathered = backend_.Gatherv(Serialize(mine), root);
  std::vector<char> reply;
  if (backend_.rank() != root) {
    backend_.BroadcastBytes(reply, root);
    return DeserializeResponseList(reply);
  }
  std::vector<RequestList> lists;
  lists.reserve(gathered.size());
  for (const auto& bytes : gathered) lists.push_back(DeserializeRequestList(bytes));
  ResponseList list = Coordinate(lists);
  list.parameters = std::move(outgoing_parameters_);
  outgoing_parameters_.reset();
  reply = Serialize(list);
  backend_.BroadcastBytes(reply, root);
  return list;
}

ResponseList Controller::ComputeResponseList(std::vector<Request> requests, bool shutdown,
                                             const std::string& shutdown_reason, bool waiting, bool stuck,
                                             bool job_deadlocked, TensorQueue* queue) {
  const auto start = std::chrono::steady_clock::now();
  ++stats_.cycles;
  // A join completed in the previous cycle's list; this rank stayed joined while executing it.
  if (join_completed_) {
    local_joined_ = false;
    join_completed_ = false;
  }
  const bool use_cache = cache_.capacity() > 0;
  job_stuck_ = false;
  const auto eviction_time = stall_inspector_.eviction_time();

  // The coordinator inspects stalls every cycle (the cache fast path skips Coordinate); giving up
  // is a shutdown request of its own, carried by the next rounds.
  if (backend_.rank() == 0 && !pending_.empty() && stall_reason_.empty()) {
    stall_reason_ = stall_inspector_.Check(pending_, joined_ranks_);
  }
  // A deadlock seen in the cache round of an earlier cycle is reported through a coordinator round.
  job_deadlocked_ = job_deadlocked;
  if (backend_.rank() == 0 && (DeadlockDue(start, waiting_) || (job_deadlocked && !pending_.empty()) ||
                               (EveryRankWaitsOnPending(waiting_) && !SplitNames().empty()))) {
    force_round_ = true;
  }
  std::string reason = shutdown_reason;
  if (!stall_reason_.empty()) {
    shutdown = true;
    reason = stall_reason_;
  }

  // 1. Classify this rank's requests: held cache hits first (they were submitted earlier).
  std::vector<Held> candidates;
  candidates.swap(held_);
  for (Request& r : requests) candidates.push_back(Held{std::move(r), start});
  std::vector<Request> uncached;
  std::vector<Held> hits;
  std::vector<uint32_t> hit_bits;
  std::set<uint32_t> local_invalid;
  for (Held& held : candidates) {
    Request& r = held.request;
    if (r.type == OpType::JOIN) local_joined_ = true;
    uint32_t bit = 0;
    ResponseCache::Lookup found = ResponseCache::Lookup::MISS;
    if (use_cache && CollectiveFor(r.type).cacheable()) found = cache_.Find(r, &bit);
    if (found == ResponseCache::Lookup::HIT) {
      const bool join_error_path = any_joined_ && !CollectiveFor(cache_.response(bit).type).joined_ranks_take_part();
      const bool stalled = (eviction_time.count() > 0 && start - held.since > eviction_time) ||
                           (waiting && deadlock_timeout_.count() > 0 && start - held.since > deadlock_timeout_ / 2);
      if (join_error_path || stalled) {
        // Negotiated through the coordinator: it reports the join error, or the stall.
        if (stalled) local_invalid.insert(bit);
        uncached.push_back(std::move(r));
      } else {
        hits.push_back(std::move(held));
        hit_bits.push_back(bit);
      }
    } else {
      if (found == ResponseCache::Lookup::INVALID) local_invalid.insert(bit);
      uncached.push_back(std::move(r));
    }
  }

  // 2. Agree on the cache: one bitwise AND over [flags | hit bits | not-invalid bits].
  bool need_round = true;
  std::vector<Response> cached_responses;
  if (use_cache) {
    const size_t num_bits = cache_.num_bits();
    const size_t words = (num_bits + 63) / 64;
    std::vector<uint64_t> vec(1 + 2 * words, 0);
    constexpr uint64_t kNoShutdown = 1, kNothingUncached = 2, kNoParameters = 4, kNoDeadlock = 8, kWaiting = 16,
                       kStuck = 32;
    constexpr uint64_t kQuiet = kNoShutdown | kNothingUncached | kNoParameters | kNoDeadlock;
    vec[0] = (shutdown ? 0 : kNoShutdown) | (uncached.empty() ? kNothingUncached : 0) |
             (outgoing_parameters_ ? 0 : kNoParameters) | (force_round_ ? 0 : kNoDeadlock) | (waiting ? kWaiting : 0) |
             (stuck ? kStuck : 0);
    auto set_bit = [&](size_t section, uint32_t bit) { vec[1 + section * words + bit / 64] |= uint64_t{1} << (bit % 64); };
    auto get_bit = [&](size_t section, uint32_t bit) {
      return (vec[1 + section * words + bit / 64] >> (bit % 64)) & 1;
    };
    for (uint32_t bit : hit_bits) set_bit(0, bit);
    if (local_joined_) {
      // A joined rank takes part in every cached allreduce the others run (with zeros).
      for (uint32_t bit = 0; bit < num_bits; ++bit) {
        if (cache_.occupied(bit) && CollectiveFor(cache_.response(bit).type).joined_ranks_take_part()) {
          set_bit(0, bit);
        }
      }
    }
    // Not-invalid section: all ones, then this rank's invalid entries cleared.
    std::fill(vec.begin() + 1 + words, vec.end(), ~uint64_t{0});
    for (uint32_t bit : local_invalid) vec[1 + words + bit / 64] &= ~(uint64_t{1} << (bit % 64));
    bool settled = false;
    if (backend_.size() > 1) {
      const int64_t eager_bytes = backend_.EagerAllreduceBytes();
      if (eager_bytes > 0) {
        const bool alone = hits.size() == 1 && uncached.empty() && local_invalid.empty() && !local_joined_ &&
                           (vec[0] & kQuiet) == kQuiet && !stuck;
        const EagerAllreduceOptions eager =
            alone ? EagerAllreduceData(cache_.response(hit_bits[0]), hits[0].request, hit_bits[0], eager_bytes,
                                       backend_.size(), queue)
                  : EagerAllreduceOptions{};
        settled = backend_.AllreduceBitsAndEager(vec, eager);
      } else {
        backend_.AllreduceBitsAnd(vec);
      }
    }
    need_round = (vec[0] & kQuiet) != kQuiet;
    // Every rank stuck (global set): its pending tensors fail in a coordinator round now.
    job_stuck_ = (vec[0] & kStuck) != 0;
    if (job_stuck_) {
      job_deadlocked_ = true;
      need_round = true;
    }
    // The coordinator learns whether every rank waits (kept for the next cycle's DeadlockDue).
    if (backend_.rank() == 0) waiting_.assign(waiting_.size(), (vec[0] & kWaiting) != 0);

    // Every rank applies the same cache operations in the same order.
    std::set<uint32_t> invalid;
    for (uint32_t bit = 0; bit < num_bits; ++bit) {
      if (!get_bit(1, bit)) invalid.insert(bit);
    }
    std::vector<uint32_t> common;
    for (uint32_t bit = 0; bit < num_bits; ++bit) {
      if (get_bit(0, bit) && !invalid.count(bit) && cache_.occupied(bit)) common.push_back(bit);
    }
    for (size_t i = 0; i < hits.size(); ++i) {
      uint32_t bit = hit_bits[i];
      if (invalid.count(bit)) {
        uncached.push_back(std::move(hits[i].request));
      } else if (!std::binary_search(common.begin(), common.end(), bit)) {
        held_.push_back(std::move(hits[i]));  // not submitted by every rank yet
      }
    }
    if (!common.empty()) last_news_ = start;
    if (settled && (need_round || common.size() != 1 || common[0] != hit_bits[0])) {
      throw std::logic_error("eager allreduce: every rank sent the data of cache bit " + std::to_string(hit_bits[0]) +
                             " but the round did not settle on it alone");
    }
    for (uint32_t bit : common) {
      cached_responses.push_back(cache_.response(bit));
      cached_responses.back().settled = settled;
      cache_.Touch(bit);
    }
    stats_.eager_allreduces += settled ? 1 : 0;
    for (uint32_t bit : invalid) cache_.Erase(bit);
    stats_.cache_hits += static_cast<int64_t>(common.size());
    if (!need_round && !uncached.empty()) {
      throw std::logic_error("response cache: uncached requests left without a negotiation round");
    }
  }

  // 3. The coordinator round, when some rank has something uncached or asks to shut down.
  ResponseList list;
  if (need_round) {
    RequestList mine;
    mine.shutdown = shutdown;
    mine.shutdown_reason = reason;
    mine.waiting = waiting;
    if (use_cache) {
      for (const Request& r : uncached) {
        if (CollectiveFor(r.type).cacheable()) sent_[r.name] = r;
      }
    }
    mine.requests = std::move(uncached);
    list = Negotiate(mine);
    any_joined_ = list.any_joined;
    for (const Response& response : list.responses) {
      if (response.type == OpType::JOIN) join_completed_ = true;
      if (response.type == OpType::ERROR) {
        // A deadlock error fails this rank's entry of the name even where its request is still a
        // held cache hit (submitted after the coordinator's last news): it must not run later.
        held_.erase(std::remove_if(held_.begin(), held_.end(),
                                   [&](const Held& h) {
                                     return std::find(response.names.begin(), response.names.end(),
                                                      h.request.name) != response.names.end();
                                   }),
                    held_.end());
      }
      if (response.names.size() != 1) continue;
      std::optional<Request> own;
      auto it = sent_.find(response.names[0]);
      if (it != sent_.end()) {
        own = std::move(it->second);
        sent_.erase(it);
      }
      if (use_cache && response.type != OpType::ERROR && CollectiveFor(response.type).cacheable()) {
        cache_.Put(response, own);
      }
    }
  }

  // 4. Cached responses first, then the coordinator's; fused.
  if (!cached_responses.empty()) {
    for (Response& r : list.responses) cached_responses.push_back(std::move(r));
    list.responses = std::move(cached_responses);
  }
  list.responses = FuseResponses(std::move(list.responses), fusion_threshold_bytes_, config_.disable_group_fusion);
  stats_.negotiation_us += MicrosSince(start);
  return list;
}

}  // namespace horovod
