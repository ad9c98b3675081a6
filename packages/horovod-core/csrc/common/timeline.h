// The timeline: a Chrome trace event file (spec core.md §11) recording, per tensor, the
// negotiation phase on the coordinator and the processing phase with its activities. Written only
// by global rank 0; the engine calls these methods there and nowhere else.
//
// Each tensor name is a trace "process" (pid 1, 2, ... in first-seen order per file). The file is
// valid JSON after every record: each record is appended with a single write that overwrites the
// closing ']' of the previous one, so a job killed at any point leaves a loadable file.
//
// Thread safety: every method may be called from any thread (the background thread records
// events; hvd.start_timeline/stop_timeline switch files from caller threads).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "message.h"

namespace horovod {

// `s` as a JSON string, quotes included.
std::string JsonQuoted(const std::string& s);

class Timeline {
 public:
  Timeline();
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts recording into `path` (truncated), closing the current file first. With the path of the
  // current file only `mark_cycles` changes. Throws EngineError(INVALID_ARGUMENT) naming the path
  // when the file cannot be created.
  void Start(const std::string& path, bool mark_cycles);
  // Closes the file (complete JSON) before returning; a no-op when not recording.
  void Stop();
  // Cheap check for the hot path.
  bool recording() const { return recording_.load(std::memory_order_relaxed); }

  // Negotiation, on the coordinator: B NEGOTIATE_<TYPE> when the first rank reports `tensor`,
  // an X event named after each reporting rank, E when every rank has reported.
  void NegotiateStart(const std::string& tensor, OpType type);
  void NegotiateRankReady(const std::string& tensor, int rank);
  void NegotiateEnd(const std::string& tensor);

  // Processing: B named after the response type; nested activities (names from spec core.md
  // §11.2, e.g. "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "GLOO_ALLREDUCE"); E, with the output's
  // dtype and shape as args when there is an output.
  void Start(const std::string& tensor, OpType type);
  void ActivityStart(const std::string& tensor, const char* activity);
  void ActivityEnd(const std::string& tensor);
  void End(const std::string& tensor);
  void End(const std::string& tensor, DataType dtype, const std::vector<int64_t>& shape);

  // A global "CYCLE_START" instant event, written only when cycle marking is on.
  void MarkCycleStart();

 private:
  // Appends one JSON object (without separators) to the file; caller holds mu_.
  void WriteRecord(const std::string& json);
  // The pid of `tensor` in the current file, writing its metadata records on first use.
  int TensorPid(const std::string& tensor);
  int64_t NowMicros() const;
  void CloseLocked();

  std::mutex mu_;
  std::atomic<bool> recording_{false};
  bool mark_cycles_ = false;
  std::string path_;
  int fd_ = -1;
  int64_t end_offset_ = 0;  // file size; the last byte is the closing ']'
  std::unordered_map<std::string, int> pids_;
  const std::chrono::steady_clock::time_point origin_;
};

// One activity of the tensors of an operation, for as long as the object lives: started (when the
// timeline is recording) on construction, ended on destruction; Next ends it and starts the
// following one. `tensors` must outlive the object; `activity` is read only during the call (no
// string is built for it, so a timeline that is not recording costs one branch).
class ScopedActivity {
 public:
  ScopedActivity(Timeline& timeline, const std::vector<std::string>& tensors, const char* activity)
      : timeline_(timeline), tensors_(&tensors), active_(timeline.recording()) {
    if (active_) Begin(activity);
  }
  ScopedActivity(Timeline& timeline, const std::string& tensor, const char* activity)
      : timeline_(timeline), tensor_(&tensor), active_(timeline.recording()) {
    if (active_) Begin(activity);
  }
  ~ScopedActivity() {
    if (active_) Finish();
  }
  ScopedActivity(const ScopedActivity&) = delete;
  ScopedActivity& operator=(const ScopedActivity&) = delete;
  void Next(const char* activity) {
    if (!active_) return;
    Finish();
    Begin(activity);
  }

 private:
  void Begin(const char* activity) {
    if (tensor_) timeline_.ActivityStart(*tensor_, activity);
    if (tensors_) {
      for (const auto& tensor : *tensors_) timeline_.ActivityStart(tensor, activity);
    }
  }
  void Finish() {
    if (tensor_) timeline_.ActivityEnd(*tensor_);
    if (tensors_) {
      for (const auto& tensor : *tensors_) timeline_.ActivityEnd(tensor);
    }
  }
  Timeline& timeline_;
  const std::vector<std::string>* tensors_ = nullptr;
  const std::string* tensor_ = nullptr;
  bool active_;
};

}  // namespace horovod
