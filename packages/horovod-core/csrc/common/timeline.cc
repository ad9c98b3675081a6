#include "timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "logging.h"

namespace horovod {

namespace {

// `s` as the body of a JSON string (without the surrounding quotes).
std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// {"ph": "<ph>", "name": "<name>", "ts": <ts>, "pid": <pid><extra>}; no name when `name` is null.
std::string Event(const char* ph, const char* name, int64_t ts, int pid, const std::string& extra = "") {
  std::string r = "{\"ph\": \"";
  r += ph;
  r += "\"";
  if (name != nullptr) r += ", \"name\": " + JsonQuoted(name);
  r += ", \"ts\": " + std::to_string(ts) + ", \"pid\": " + std::to_string(pid) + extra + "}";
  return r;
}

std::string Metadata(const char* name, int pid, const std::string& args) {
  return std::string("{\"name\": \"") + name + "\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
         ", \"args\": {" + args + "}}";
}

// Writes all of `data` at `offset`, retrying on EINTR and short writes. Returns 0 or an errno.
int PwriteAll(int fd, const std::string& data, int64_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

std::string JsonQuoted(const std::string& s) { return "\"" + JsonEscape(s) + "\""; }

Timeline::Timeline() : origin_(std::chrono::steady_clock::now()) {}

Timeline::~Timeline() { Stop(); }

int64_t Timeline::NowMicros() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - origin_)
      .count();
}

void Timeline::Start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0 && path == path_) {
    mark_cycles_ = mark_cycles;
    return;
  }
  CloseLocked();
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    throw EngineError(Status::InvalidArgument("timeline: cannot create file '" + path + "': " +
                                              std::strerror(err)));
  }
  fd_ = fd;
  path_ = path;
  end_offset_ = 0;
  pids_.clear();
  mark_cycles_ = mark_cycles;

  // Wall-clock time of ts == 0 (the moment this Timeline was constructed).
  int64_t wall_now = std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  int64_t start_epoch = wall_now - NowMicros();
  WriteRecord(Metadata("process_name", 0, "\"start_time_since_epoch_in_micros\": " + std::to_string(start_epoch)));
  WriteRecord(Metadata("process_sort_index", 0, "\"sort_index\": 0"));
  if (fd_ >= 0) recording_.store(true);
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  CloseLocked();
}

void Timeline::CloseLocked() {
  recording_.store(false);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  path_.clear();
  end_offset_ = 0;
  pids_.clear();
}

void Timeline::WriteRecord(const std::string& json) {
  if (fd_ < 0) return;
  std::string data;
  int64_t offset;
  if (end_offset_ == 0) {
    data = "[" + json + "]";
    offset = 0;
  } else {
    // One write replaces the closing ']' so that the file is complete JSON before and after it.
    data = ",\n" + json + "]";
    offset = end_offset_ - 1;
  }
  int err = PwriteAll(fd_, data, offset);
  if (err != 0) {
    HVD_LOG(WARNING) << "timeline: writing '" << path_ << "' failed (" << std::strerror(err)
                     << "); the timeline is stopped";
    CloseLocked();
    return;
  }
  end_offset_ = offset + static_cast<int64_t>(data.size());
}

int Timeline::TensorPid(const std::string& tensor) {
  auto it = pids_.find(tensor);
  if (it != pids_.end()) return it->second;
  int pid = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(tensor, pid);
  WriteRecord(Metadata("process_name", pid, "\"name\": " + JsonQuoted(tensor)));
  WriteRecord(Metadata("process_sort_index", pid, "\"sort_index\": " + std::to_string(pid)));
  return pid;
}

void Timeline::NegotiateStart(const std::string& tensor, OpType type) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  int pid = TensorPid(tensor);
  std::string name = std::string("NEGOTIATE_") + OpTypeName(type);
  WriteRecord(Event("B", name.c_str(), NowMicros(), pid));
}

void Timeline::NegotiateRankReady(const std::string& tensor, int rank) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  int pid = TensorPid(tensor);
  WriteRecord(Event("X", std::to_string(rank).c_str(), NowMicros(), pid, ", \"dur\": 0"));
}

void Timeline::NegotiateEnd(const std::string& tensor) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  int pid = TensorPid(tensor);
  WriteRecord(Event("E", nullptr, NowMicros(), pid));
}

void Timeline::Start(const std::string& tensor, OpType type) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  int pid = TensorPid(tensor);
  WriteRecord(Event("B", OpTypeName(type), NowMicros(), pid));
}

void Timeline::ActivityStart(const std::string& tensor, const char* activity) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  int pid = TensorPid(tensor);
  WriteRecord(Event("B", activity, NowMicros(), pid));
}

void Timeline::ActivityEnd(const std::string& tensor) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  int pid = TensorPid(tensor);
  WriteRecord(Event("E", nullptr, NowMicros(), pid));
}

void Timeline::End(const std::string& tensor) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  int pid = TensorPid(tensor);
  WriteRecord(Event("E", nullptr, NowMicros(), pid));
}

void Timeline::End(const std::string& tensor, DataType dtype, const std::vector<int64_t>& shape) {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  int pid = TensorPid(tensor);
  std::string args = ", \"args\": {\"dtype\": " + JsonQuoted(DataTypeName(dtype)) + ", \"shape\": " +
                     JsonQuoted(ShapeString(shape)) + "}";
  WriteRecord(Event("E", nullptr, NowMicros(), pid, args));
}

void Timeline::MarkCycleStart() {
  if (!recording()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0 || !mark_cycles_) return;
  WriteRecord("{\"ph\": \"i\", \"name\": \"CYCLE_START\", \"ts\": " + std::to_string(NowMicros()) +
              ", \"s\": \"g\"}");
}

}  // namespace horovod
