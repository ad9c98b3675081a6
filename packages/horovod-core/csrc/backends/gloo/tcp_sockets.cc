#include "backends/gloo/tcp_sockets.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sched.h>

#include <cstdlib>

namespace horovod::gloo_backend {

std::string AddressKey(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    return std::string("4") + std::string(reinterpret_cast<const char*>(&in.sin_port), sizeof(in.sin_port)) +
           std::string(reinterpret_cast<const char*>(&in.sin_addr), sizeof(in.sin_addr));
  }
  if (address.ss_family == AF_INET6) {
    const auto& in = reinterpret_cast<const sockaddr_in6&>(address);
    return std::string("6") + std::string(reinterpret_cast<const char*>(&in.sin6_port), sizeof(in.sin6_port)) +
           std::string(reinterpret_cast<const char*>(&in.sin6_addr), sizeof(in.sin6_addr));
  }
  return "";
}

std::map<std::string, int> SocketsByAddress() {
  std::map<std::string, int> sockets;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return sockets;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) continue;
    std::string key = AddressKey(address);
    if (!key.empty()) sockets.emplace(std::move(key), fd);
  }
  ::closedir(dir);
  return sockets;
}

bool PollFor(pollfd& ready, std::chrono::microseconds spin) {
  if (::poll(&ready, 1, 0) > 0) return true;
  const auto deadline = std::chrono::steady_clock::now() + spin;
  while (std::chrono::steady_clock::now() < deadline) {
    sched_yield();
    if (::poll(&ready, 1, 0) > 0) return true;
  }
  return false;
}

}  // namespace horovod::gloo_backend
