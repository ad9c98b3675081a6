// The flight recorder (HOROVOD_FLIGHT_RECORDER_SIZE, HOROVOD_FLIGHT_RECORDER_DIR; docs/engine.md
// "Flight recorder"): each rank keeps its last N operations in a ring (name, collective, dtype,
// shape, bytes, process set, a per-set sequence number, and when each was submitted, negotiated,
// started and finished, with its outcome), and writes them as JSON when asked, on a deadlock,
// mismatch or stall error, or when it loses a peer. Comparing the ranks' files shows where they
// diverged: `python -m horovod.runner.flight_recorder DIR`.
//
// Cost on the hot path: per submitted group and per executed response, one uncontended mutex and
// one clock read, and a copy of each name and shape into a preallocated slot (its strings keep
// their capacity); no allocation once the ring has been round once with names no longer than
// before.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/common.h"
#include "common/message.h"
#include "common/tensor_queue.h"

namespace horovod {

class FlightRecorder {
 public:
  // Identifies one recorded operation; 0 means "not recorded" (the recorder is off).
  using Id = uint64_t;

  // `capacity` operations are kept (0: off). The header of a dump carries `rank`, `size` and
  // `host`; `dir` is where automatic dumps go ("": nowhere).
  FlightRecorder(size_t capacity, std::string dir, int rank, int size, std::string host);

  bool enabled() const { return !ring_.empty(); }
  const std::string& dir() const { return dir_; }

  // Requests submitted together to process set `set_id` (any thread): they get consecutive ids,
  // of which the first is returned (0 when off).
  Id Submitted(const std::vector<Request>& requests, int32_t set_id);
  // The background thread, per response: the coordinator's answer arrived at `negotiated_us`
  // (WallMicros) and execution of `entries` (null ones skipped) starts now; they ended (`error`
  // empty: completed).
  void Started(const std::vector<TensorTableEntry*>& entries, int64_t negotiated_us);
  void Ended(const std::vector<TensorTableEntry*>& entries, const std::string& error);
  // `count` operations from id `first` ended with `error` (a refused submission, a closed queue).
  void Ended(Id first, size_t count, const std::string& error);

  // The records (oldest first) and the header, as one JSON object (format: docs/engine.md);
  // `sets` are the process sets' global ranks by id.
  using Sets = std::map<int32_t, std::vector<int>>;
  std::string ToJson(const std::string& reason, const Sets& sets) const;
  // Writes ToJson to `<dir>/flight_recorder_rank_<rank>.json` (creating `dir`), through a
  // temporary file renamed into place. Returns the path; throws EngineError when it cannot write.
  std::string Dump(const std::string& dir, const std::string& reason, const Sets& sets) const;
  // An automatic dump to dir() (when set and the recorder is on), logged; failures are logged,
  // never thrown.
  void DumpAutomatically(const std::string& reason, const Sets& sets) const;

 private:
  enum class Outcome : uint8_t { PENDING, RUNNING, COMPLETED, FAILED };
  struct Record {
    Id id = 0;
    uint64_t seq = 0;
    int32_t set_id = 0;
    OpType type = OpType::ALLREDUCE;
    DataType dtype = DataType::FLOAT32;
    std::string name;
    std::vector<int64_t> shape;
    int64_t bytes = 0;
    int64_t enqueued_us = 0, negotiated_us = 0, started_us = 0, ended_us = 0;  // microseconds since the Unix epoch; 0: not yet
    Outcome outcome = Outcome::PENDING;
    std::string error;
  };
  Record* Find(Id id);  // under mu_; null when overwritten
  void EndLocked(Id id, int64_t now, const std::string& error);

  mutable std::mutex mu_;
  std::vector<Record> ring_;
  Id next_id_ = 1;
  std::unordered_map<int32_t, uint64_t> next_seq_;  // per process set
  std::string dir_;
  int rank_, size_;
  std::string host_;
};

// Microseconds since the Unix epoch (so that the files of different hosts can be compared).
int64_t WallMicros();

}  // namespace horovod
