#include "flight_recorder.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/logging.h"
#include "common/timeline.h"

namespace horovod {

int64_t WallMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

const char* OutcomeName(int outcome) {
  static const char* const names[] = {"pending", "running", "completed", "failed"};
  return names[outcome];
}

// A JSON number, or null for "not yet" (0).
std::string MicrosOrNull(int64_t us) { return us == 0 ? "null" : std::to_string(us); }

}  // namespace

FlightRecorder::FlightRecorder(size_t capacity, std::string dir, int rank, int size, std::string host)
    : ring_(capacity), dir_(std::move(dir)), rank_(rank), size_(size), host_(std::move(host)) {}

FlightRecorder::Id FlightRecorder::Submitted(const std::vector<Request>& requests, int32_t set_id) {
  if (ring_.empty() || requests.empty()) return 0;
  const int64_t now = WallMicros();
  std::lock_guard<std::mutex> lock(mu_);
  const Id first = next_id_;
  uint64_t& seq = next_seq_[set_id];
  for (const Request& request : requests) {
    const Id id = next_id_++;
    Record& r = ring_[id % ring_.size()];
    r.id = id;
    r.seq = seq++;
    r.set_id = set_id;
    r.type = request.type;
    r.dtype = request.dtype;
    r.name.assign(request.name);
    r.shape.assign(request.shape.begin(), request.shape.end());
    r.bytes = NumElements(request.shape) * static_cast<int64_t>(DataTypeSize(request.dtype));
    r.enqueued_us = now;
    r.negotiated_us = r.started_us = r.ended_us = 0;
    r.outcome = Outcome::PENDING;
    r.error.clear();
  }
  return first;
}

FlightRecorder::Record* FlightRecorder::Find(Id id) {
  if (id == 0 || ring_.empty()) return nullptr;
  Record& r = ring_[id % ring_.size()];
  return r.id == id ? &r : nullptr;
}

void FlightRecorder::Started(const std::vector<TensorTableEntry*>& entries, int64_t negotiated_us) {
  if (ring_.empty()) return;
  const int64_t now = WallMicros();
  std::lock_guard<std::mutex> lock(mu_);
  for (const TensorTableEntry* e : entries) {
    if (Record* r = e ? Find(e->flight_id) : nullptr) {
      r->negotiated_us = negotiated_us;
      r->started_us = now;
      r->outcome = Outcome::RUNNING;
    }
  }
}

void FlightRecorder::EndLocked(Id id, int64_t now, const std::string& error) {
  if (Record* r = Find(id)) {
    r->ended_us = now;
    r->outcome = error.empty() ? Outcome::COMPLETED : Outcome::FAILED;
    r->error.assign(error);
  }
}

void FlightRecorder::Ended(const std::vector<TensorTableEntry*>& entries, const std::string& error) {
  if (ring_.empty()) return;
  const int64_t now = WallMicros();
  std::lock_guard<std::mutex> lock(mu_);
  for (const TensorTableEntry* e : entries) {
    if (e) EndLocked(e->flight_id, now, error);
  }
}

void FlightRecorder::Ended(Id first, size_t count, const std::string& error) {
  if (first == 0) return;
  const int64_t now = WallMicros();
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < count; ++i) EndLocked(first + i, now, error);
}

std::string FlightRecorder::ToJson(const std::string& reason, const Sets& sets) const {
  std::ostringstream out;
  out << "{\"format\": \"horovod-flight-recorder\", \"version\": 1, \"rank\": " << rank_ << ", \"size\": " << size_
      << ", \"host\": " << JsonQuoted(host_) << ", \"pid\": " << getpid() << ", \"reason\": " << JsonQuoted(reason)
      << ", \"dumped_us\": " << WallMicros() << ", \"capacity\": " << ring_.size() << ", \"process_sets\": {";
  const char* sep = "";
  for (const auto& [id, ranks] : sets) {
    out << sep << "\"" << id << "\": [";
    for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
    out << "]";
    sep = ", ";
  }
  out << "}, \"operations\": [";
  std::lock_guard<std::mutex> lock(mu_);
  out << (next_id_ > 1 ? "\n" : "");
  // Oldest first: ids next_id_ - capacity .. next_id_ - 1 (those still in the ring).
  const Id first = next_id_ > ring_.size() ? next_id_ - ring_.size() : 1;
  sep = "";
  for (Id id = first; id < next_id_; ++id) {
    const Record& r = ring_[id % ring_.size()];
    if (r.id != id) continue;
    out << sep << "  {\"seq\": " << r.seq << ", \"process_set\": " << r.set_id << ", \"name\": " << JsonQuoted(r.name)
        << ", \"collective\": \"" << OpTypeName(r.type) << "\", \"dtype\": \"" << DataTypeName(r.dtype)
        << "\", \"shape\": [";
    for (size_t i = 0; i < r.shape.size(); ++i) out << (i ? ", " : "") << r.shape[i];
    out << "], \"bytes\": " << r.bytes << ", \"enqueued_us\": " << r.enqueued_us
        << ", \"negotiated_us\": " << MicrosOrNull(r.negotiated_us) << ", \"started_us\": " << MicrosOrNull(r.started_us)
        << ", \"ended_us\": " << MicrosOrNull(r.ended_us) << ", \"outcome\": \""
        << OutcomeName(static_cast<int>(r.outcome)) << "\"";
    if (!r.error.empty()) out << ", \"error\": " << JsonQuoted(r.error);
    out << "}";
    sep = ",\n";
  }
  out << "]}\n";
  return out.str();
}

std::string FlightRecorder::Dump(const std::string& dir, const std::string& reason, const Sets& sets) const {
  std::error_code failed;
  std::filesystem::create_directories(dir, failed);
  if (failed) {
    throw EngineError(
        Status::InvalidArgument("cannot create the flight recorder's directory '" + dir + "': " + failed.message()));
  }
  const std::string path = dir + "/flight_recorder_rank_" + std::to_string(rank_) + ".json";
  const std::string partial = path + ".part" + std::to_string(getpid());
  {
    std::ofstream file(partial, std::ios::trunc);
    file << ToJson(reason, sets);
    file.close();
    if (!file) {
      std::remove(partial.c_str());
      throw EngineError(Status::InvalidArgument("cannot write the flight recorder's file '" + partial + "'"));
    }
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(partial.c_str());
    throw EngineError(Status::InvalidArgument("cannot write the flight recorder's file '" + path + "': " + why));
  }
  return path;
}

void FlightRecorder::DumpAutomatically(const std::string& reason, const Sets& sets) const {
  if (dir_.empty() || ring_.empty()) return;
  try {
    HVD_LOG(WARNING) << "Flight recorder written to " << Dump(dir_, reason, sets);
  } catch (const std::exception& e) {
    HVD_LOG(ERROR) << "Could not write the flight recorder: " << e.what();
  }
}

}  // namespace horovod
