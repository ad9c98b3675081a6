// Negotiation: deciding, once per cycle, which tensors every rank of a process set runs and in
// which order (spec core.md §7).
//
// Each cycle every rank classifies the requests submitted since the last cycle against the
// response cache. One bitwise-AND round over the set (a bit per cache entry, plus flags) finds the
// cached tensors every rank has submitted; when no rank has anything else to say (the steady
// state of a training loop), that round is the whole negotiation. Otherwise every rank sends its
// uncached requests to the coordinator (rank 0 of the set), which counts, per tensor name, which
// ranks have submitted it; a name is ready once every rank that has not joined has. It checks that
// the ranks agree on the operation (turning disagreement into an ERROR response), and broadcasts
// the ordered response list with the OR of every rank's shutdown flag. Every rank then executes
// cached responses (in bit order), then the coordinator's, fused where possible, so all ranks run
// the same operations in the same order whatever order they submitted them in.
//
// Deadlocks (HOROVOD_DEADLOCK_TIMEOUT_SECONDS). Each rank tells the coordinator whether a caller is
// blocked waiting on an operation of the set: with its request list, and as a bit of the cache
// round's AND (so the coordinator knows "every rank waits" in cycles without a round). When every
// rank that has not joined waits, each has submitted a tensor the coordinator holds, no tensor is
// ready and nothing new arrived for the timeout, no rank can make progress: the coordinator answers
// every pending tensor with an ERROR response naming what each rank waits on, and every rank goes
// on. A rank that computes (waits on nothing) never counts as waiting, so slow ranks never trip it.
// When every rank waits and the ranks submitted one user name as different collectives (rank 0
// "allreduce.m", rank 1 "allgather.m"), that is reported at once as a mismatch, without the timeout.
// A cached tensor held on a waiting rank for half the timeout is negotiated through the coordinator
// (like a stalled one), so that the coordinator sees it.
//
// Eager allreduce. Where the set's communicator can carry an allreduce's data in the cache round
// (Communicator::EagerAllreduceBytes), a rank whose whole business in a cycle is one cached
// allreduce of a CPU tensor that small (no other request, nothing invalid, no flag raised, not
// joined, no prescale) sends the tensor with its bits, tagged with the cache bit. When every rank
// sent the same tag, the round has also reduced the data: the response comes back marked
// `settled`, and the allreduce only applies its postscale. That every rank tagged the same bit
// means every rank holds exactly that hit and nothing else, so the round's verdict is that one
// cached response on every rank; otherwise the data is dropped and the cycle goes on as without
// it. A synchronous small allreduce (a loss, a metric) then costs one exchange
// instead of two. The tensor's data lies in the set's queue (`queue` of ComputeResponseList); which
// hit qualifies is the allreduce's own rule (EagerAllreduceData, collectives/allreduce.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/communicator.h"
#include "common/config.h"
#include "common/message.h"
#include "response_cache.h"
#include "stall_inspector.h"
#include "common/tensor_queue.h"

namespace horovod {

class Timeline;

// Counters of one controller, for benchmarks and tests.
struct NegotiationStats {
  int64_t cycles = 0;            // calls of ComputeResponseList
  int64_t coordinator_rounds = 0;  // cycles that needed the gather/broadcast round
  int64_t cache_hits = 0;        // responses served from the response cache
  int64_t negotiation_us = 0;    // time spent in ComputeResponseList, microseconds
  int64_t eager_allreduces = 0;  // allreduces whose data the cache round carried (settled)
};

class Controller {
 public:
  // `global_ranks[i]` is the global rank of set rank i. `timeline` may be null (it records only on
  // global rank 0, which is the coordinator of every set it belongs to).
  // `set_id` names the process set in messages.
  Controller(Communicator& backend, std::vector<int> global_ranks, const Config& config, Timeline* timeline,
             int32_t set_id = 0);

  // Collective over the set: every member calls it once per cycle with the requests submitted
  // since the last call, and whether a caller of this rank is blocked waiting on one of the set's
  // operations (`waiting`). Returns the ordered, fused responses to execute and the shutdown verdict.
  //
  // Deadlocks across process sets: `stuck` (global set only) says that a caller of this rank has
  // been blocked on some set's operation while nothing completed or was submitted on this rank for
  // the deadlock timeout. When every rank says so in the cache round, the global set fails its
  // pending tensors in this negotiation and job_stuck() is true on every rank; passed to the other
  // sets as `job_deadlocked` in the same cycle, their coordinators fail their pending tensors too.
  //
  // `queue`: the set's tensor queue, where an eager allreduce's data is read (null: no eager
  // allreduce).
  ResponseList ComputeResponseList(std::vector<Request> requests, bool shutdown, const std::string& shutdown_reason,
                                   bool waiting = false, bool stuck = false, bool job_deadlocked = false,
                                   TensorQueue* queue = nullptr);
  // Whether every rank said `stuck` in this cycle's cache round (false without one).
  bool job_stuck() const { return job_stuck_; }

  // Autotune hooks (spec core.md §12); see autotune/parameter_manager.h.
  // Coordinator of the global set only: send `parameters` to every rank with the next response
  // list (a cache-only cycle then takes the coordinator round).
  void PublishParameters(const TunedParameters& parameters) { outgoing_parameters_ = parameters; }
  // Every rank, at the same point of the cycle: fuse up to `fusion_threshold_bytes` from the next
  // cycle on, and resize the response cache (`cache_capacity` 0 turns it off). A changed capacity
  // empties the cache, which keeps it identical on every rank.
  void ApplyParameters(int64_t fusion_threshold_bytes, size_t cache_capacity);

  // Host name of each global rank (indexed by global rank), named in deadlock errors; unset: none.
  void SetHosts(const std::vector<std::string>& global_hosts);

  // Whether this rank has joined and the list containing the JOIN response has not been executed.
  bool joined() const { return local_joined_; }
  const NegotiationStats& stats() const { return stats_; }

 private:
  struct Held {
    Request request;
    std::chrono::steady_clock::time_point since;
  };
  // The gather / coordinate / broadcast round.
  ResponseList Negotiate(const RequestList& mine);
  // Coordinator only: every rank's request list (indexed by set rank) -> the new responses.
  ResponseList Coordinate(std::vector<RequestList>& lists);
  Response BuildResponse(const std::string& name, std::vector<Request> requests);
  // Coordinator: whether every rank waits, each on a pending tensor, and nothing arrived for the
  // deadlock timeout (as of `now`).
  bool DeadlockDue(std::chrono::steady_clock::time_point now, const std::vector<bool>& waiting) const;
  // Coordinator: whether every rank that has not joined waits (as `waiting` says), each on a
  // pending tensor.
  bool EveryRankWaitsOnPending(const std::vector<bool>& waiting) const;
  // Coordinator: pending names that carry one user name ("allreduce.m", "allgather.m") submitted as
  // different collectives, each rank one of them; empty when there are none.
  std::vector<std::string> SplitNames() const;
  // Coordinator: the ERROR responses failing `names` (from SplitNames), which it forgets.
  std::vector<Response> FailSplit(const std::vector<std::string>& names, std::chrono::steady_clock::time_point now);
  // Coordinator: ERROR responses with `message` for pending `names`, which it forgets.
  std::vector<Response> FailPending(const std::vector<std::string>& names, const std::string& message,
                                    std::chrono::steady_clock::time_point now);
  // Coordinator: the ERROR responses failing every pending tensor, which it forgets.
  // `across_sets`: the verdict came from the whole job being stuck (job_deadlocked), not from this
  // set; tensors that first arrived in this round (at `now`) are not failed then.
  std::vector<Response> FailDeadlock(std::chrono::steady_clock::time_point now, bool across_sets = false);

  Communicator& backend_;
  std::vector<int> global_ranks_;
  const Config& config_;
  Timeline* timeline_;
  ResponseCache cache_;
  int64_t fusion_threshold_bytes_;
  std::optional<TunedParameters> outgoing_parameters_;
  StallInspector stall_inspector_;
  NegotiationStats stats_;

  // This rank: cache hits not yet submitted by every rank, and the uncached requests sent to the
  // coordinator and not answered yet (the own request stored with a cached response).
  std::vector<Held> held_;
  std::unordered_map<std::string, Request> sent_;
  bool local_joined_ = false;
  bool join_completed_ = false;
  bool any_joined_ = false;

  // Coordinator: per tensor name, the requests of the ranks that have submitted it, and the names
  // in arrival order; the set ranks that have joined and the global rank that joined last.
  std::unordered_map<std::string, PendingTensor> pending_;
  std::vector<std::string> arrival_order_;
  std::set<int> joined_ranks_;
  int last_joined_ = -1;
  std::string stall_reason_;  // set when the stall inspector gave up

  // Deadlock detection (coordinator): the timeout (0: off), when a request last arrived or a
  // tensor last completed, which set ranks waited as of the last round, and whether the next
  // cycle must take the coordinator round to report a deadlock.
  int32_t set_id_;
  std::chrono::duration<double> deadlock_timeout_;
  std::chrono::steady_clock::time_point last_news_;
  std::vector<bool> waiting_;
  bool force_round_ = false;
  bool job_stuck_ = false;         // every rank stuck, as of this cycle's cache round
  bool job_deadlocked_ = false;    // this cycle's verdict for the job (coordinator's Coordinate reads it)
  std::vector<std::string> hosts_;  // by set rank; empty when unknown
};

}  // namespace horovod
