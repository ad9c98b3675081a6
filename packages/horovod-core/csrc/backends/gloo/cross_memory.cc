#include "backends/gloo/cross_memory.h"

#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "backends/gloo/tuning.h"
#include "common/reduction.h"

namespace horovod::gloo_backend {
namespace {

// This process's PID namespace ("device:inode" of /proc/self/ns/pid; empty where unknown).
std::string PidNamespace() {
  struct stat info {};
  if (::stat("/proc/self/ns/pid", &info) != 0) return "";
  return std::to_string(info.st_dev) + ":" + std::to_string(info.st_ino);
}

// `bytes` between `local` and `address` in the process of rank `peer`: read from there into
// `local`, or written there from it (`write`).
void CopyPeerMemory(int peer, const CrossMemoryPeer& partner, char* local, uint64_t address, int64_t bytes,
                    bool write) {
  int64_t done = 0;
  while (done < bytes) {
    iovec here{local + done, static_cast<size_t>(bytes - done)};
    iovec there{reinterpret_cast<void*>(address + done), static_cast<size_t>(bytes - done)};
    const pid_t pid = partner.pid;
    const ssize_t n =
        write ? process_vm_writev(pid, &here, 1, &there, 1, 0) : process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "nothing moved";
      throw std::runtime_error(std::string("Gloo: ") + (write ? "writing" : "reading") +
                               " the allreduce data of rank " + std::to_string(peer) + " (process " +
                               std::to_string(pid) + " on host " + partner.host + ") failed: " + why +
                               "; the rank may have exited");
    }
    done += n;
  }
}

}  // namespace

void HostPeers::Find(Store& store, const std::string& prefix, int rank, int size, bool cross_memory) {
  if (cross_memory) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  host_ = host;
  peers_.assign(size, CrossMemoryPeer{});
  probe_addresses_.assign(size, 0);
  probe_ = kCrossProbe ^ static_cast<uint64_t>(rank);
  const std::string pid_namespace = PidNamespace();
  std::ostringstream mine;
  mine << host << '\n' << ::getpid() << '\n' << reinterpret_cast<uintptr_t>(&probe_) << '\n' << pid_namespace;
  const std::string text = mine.str();
  store.Set(prefix + "cross/" + std::to_string(rank), std::vector<char>(text.begin(), text.end()));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const std::vector<char> value = store.Get(prefix + "cross/" + std::to_string(r));
    std::istringstream theirs(std::string(value.begin(), value.end()));
    std::string their_host;
    int64_t pid = 0;
    uint64_t address = 0;
    std::string their_namespace;
    std::getline(theirs, their_host);
    theirs >> pid >> address >> their_namespace;
    // Process ids mean the same in both only within one PID namespace (containers sharing a
    // hostname may not share it).
    if (!theirs || their_host != host || pid <= 0 || pid_namespace.empty() || their_namespace != pid_namespace) {
      continue;
    }
    peers_[r].pid = static_cast<pid_t>(pid);
    peers_[r].host = host_;
    probe_addresses_[r] = address;
  }
}

void HostPeers::EnableCrossMemory(Peers& peers) {
  const int rank = peers.rank(), size = peers.size();
  std::vector<uint64_t> readable(size, 0);
  for (int r = 0; r < size; ++r) {
    if (r == rank || pid(r) <= 0) continue;
    uint64_t word = 0;
    iovec local{&word, sizeof(word)}, remote{reinterpret_cast<void*>(probe_addresses_[r]), sizeof(word)};
    readable[r] = process_vm_readv(pid(r), &local, 1, &remote, 1, 0) == sizeof(word) &&
                  word == (kCrossProbe ^ static_cast<uint64_t>(r));
  }
  for (int r = 0; r < size; ++r) {
    if (r != rank) peers.Send(r, &readable[r], sizeof(readable[r]));
  }
  enabled_.assign(size, false);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    uint64_t found = 0;
    std::memcpy(&found, peers.Recv(r, sizeof(found)), sizeof(found));
    enabled_[r] = found != 0 && readable[r] != 0;
  }
}

void CrossMemoryShareData(Peers& peers, int peer, CrossMemoryPeer& partner, const char* data) {
  const uint64_t mine = reinterpret_cast<uintptr_t>(data);
  peers.Send(peer, &mine, sizeof(mine));
  std::memcpy(&partner.remote_data, peers.Recv(peer, sizeof(partner.remote_data)), sizeof(partner.remote_data));
}

void CrossMemoryExchange(Peers& peers, int peer, CrossMemoryPeer& partner, char* data, int64_t send_lo,
                         int64_t send_hi, int64_t keep_lo, int64_t keep_hi, bool reduce, DataType dtype, ReduceOp op) {
  const int64_t item = DataTypeSize(dtype);
  const uint64_t done = 1;
  if (!reduce) {
    if (send_hi > send_lo) {
      CopyPeerMemory(peer, partner, data + send_lo * item, partner.remote_data + send_lo * item,
                     (send_hi - send_lo) * item, true);
    }
    peers.Send(peer, &done, sizeof(done));
    peers.Recv(peer, sizeof(done));
    return;
  }
  CrossMemoryShareData(peers, peer, partner, data);
  const int64_t piece = std::max<int64_t>(1, kCrossPieceBytes / item);
  if (partner.landing.size() < static_cast<size_t>(piece * item)) partner.landing.resize(piece * item);
  for (int64_t i = keep_lo; i < keep_hi; i += piece) {
    const int64_t n = std::min(piece, keep_hi - i);
    char* local = data + i * item;
    CopyPeerMemory(peer, partner, partner.landing.data(), partner.remote_data + i * item, n * item, false);
    if (peer < peers.rank()) {
      Reduce(local, partner.landing.data(), local, n, dtype, op);
    } else {
      Reduce(local, local, partner.landing.data(), n, dtype, op);
    }
  }
}

}  // namespace horovod::gloo_backend
