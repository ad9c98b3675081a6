// POSIX shared-memory segments (/dev/shm), the one place the core creates, maps and removes them:
// the shared-memory transport's segment (shared_memory.cc) and Gloo's channels between two ranks of
// a host (backends/gloo/shm_channel.cc) both take theirs from here.
#pragma once

#include <cstddef>
#include <string>

namespace horovod {

// A segment mapped into this process (read and write, shared), unmapped by the destructor. Its
// name stays in /dev/shm until Unlink: the creator removes it once every user has mapped it.
class SharedSegment {
 public:
  SharedSegment() = default;
  ~SharedSegment();
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Creates the segment `name` (which must not exist; mode 0600) of `bytes`, with its pages
  // reserved at once (on a full /dev/shm a later first touch would be SIGBUS), and maps it. On
  // failure returns an empty segment, removes the name again, and says why in *error.
  static SharedSegment Create(const std::string& name, size_t bytes, std::string* error);
  // Maps the existing segment `name`, of `bytes`; on failure an empty segment and *error.
  static SharedSegment Open(const std::string& name, size_t bytes, std::string* error);
  // Removes `name` from /dev/shm (mappings stay valid).
  static void Unlink(const std::string& name);
  // `prefix`, this process's id and 64 random bits in hex: a name no other segment has.
  static std::string UniqueName(const std::string& prefix);

  explicit operator bool() const { return base_ != nullptr; }
  char* base() const { return base_; }
  // Unmaps it now.
  void Reset();

 private:
  SharedSegment(char* base, size_t bytes) : base_(base), bytes_(bytes) {}

  char* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace horovod
