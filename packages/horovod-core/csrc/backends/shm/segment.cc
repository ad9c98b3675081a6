#include "backends/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <utility>

namespace horovod {

SharedSegment::~SharedSegment() { Reset(); }

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void SharedSegment::Reset() {
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

SharedSegment SharedSegment::Create(const std::string& name, size_t bytes, std::string* error) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    *error = "shm_open(" + name + "): " + std::strerror(errno);
    return {};
  }
  void* base = MAP_FAILED;
  const int rc = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? posix_fallocate(fd, 0, static_cast<off_t>(bytes)) : errno;
  if (rc != 0) {
    *error = "reserving " + std::to_string(bytes) + " bytes in /dev/shm: " + std::strerror(rc);
  } else {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) *error = std::string("mmap: ") + std::strerror(errno);
  }
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return {};
  }
  return SharedSegment(static_cast<char*>(base), bytes);
}

SharedSegment SharedSegment::Open(const std::string& name, size_t bytes, std::string* error) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    *error = "shm_open(" + name + "): " + std::strerror(errno);
    return {};
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) *error = std::string("mmap: ") + std::strerror(errno);
  close(fd);
  if (base == MAP_FAILED) return {};
  return SharedSegment(static_cast<char*>(base), bytes);
}

void SharedSegment::Unlink(const std::string& name) { shm_unlink(name.c_str()); }

std::string SharedSegment::UniqueName(const std::string& prefix) {
  std::random_device random;
  std::ostringstream name;
  name << prefix << ::getpid() << "." << std::hex << random() << random();
  return name.str();
}

}  // namespace horovod
