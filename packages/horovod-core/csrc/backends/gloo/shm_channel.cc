#include "backends/gloo/shm_channel.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "backends/gloo/tuning.h"
#include "backends/shm/futex_counter.h"
#include "common/liveness.h"

namespace horovod::gloo_backend {
namespace {

constexpr uint32_t kChannelRingBytes = 512 << 10;
constexpr uint32_t kChannelRecordHead = 64;
constexpr uint64_t kChannelWrap = ~uint64_t{0};
static_assert(kChannelRecordHead + kSyncChunkBytes <= kChannelRingBytes / 3, "3 messages fit the ring");
constexpr std::chrono::microseconds kChannelSpin{20};
constexpr uint64_t kChannelMagic = 0x48564443484e4c53ull;  // "HVDCHNLS"
constexpr size_t kChannelHeaderBytes = 4096;
constexpr size_t kChannelBytes = kChannelHeaderBytes + 2 * size_t{kChannelRingBytes};

}  // namespace

// A futex word and the number of threads sleeping on it, alone in their cache lines.
struct alignas(128) ShmChannel::Counter {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> waiters;
};

// The first page of a channel's segment; the rings follow it, the one the lower rank of the pair
// writes (direction 0), then the one the higher rank writes (direction 1).
struct ShmChannel::Header {
  uint64_t magic;
  uint64_t ring_bytes;
  Counter closed[2];    // by side: set when that rank's end is destroyed
  Counter written[2];   // by direction: where the writer's next record goes
  Counter released[2];  // by direction: up to where the reader is done
};

SharedSegment ShmChannel::CreateSegment(std::string* name) {
  static_assert(sizeof(Header) <= kChannelHeaderBytes, "the channel header fits its page");
  *name = SharedSegment::UniqueName("/horovod.gloo.");
  std::string error;
  SharedSegment segment = SharedSegment::Create(*name, kChannelBytes, &error);
  if (!segment) {
    name->clear();
    return segment;
  }
  std::memset(segment.base(), 0, kChannelHeaderBytes);
  auto* header = reinterpret_cast<Header*>(segment.base());
  header->ring_bytes = kChannelRingBytes;
  header->magic = kChannelMagic;
  return segment;
}

SharedSegment ShmChannel::OpenSegment(const std::string& name) {
  std::string error;
  SharedSegment segment = SharedSegment::Open(name, kChannelBytes, &error);
  if (!segment) return segment;
  const auto* header = reinterpret_cast<const Header*>(segment.base());
  if (header->magic != kChannelMagic || header->ring_bytes != kChannelRingBytes) return {};
  return segment;
}

ShmChannel::ShmChannel(SharedSegment segment, int side, ChannelWaiting waiting)
    : segment_(std::move(segment)),
      header_(reinterpret_cast<Header*>(segment_.base())),
      side_(side),
      waiting_(std::move(waiting)) {}

ShmChannel::~ShmChannel() {
  header_->closed[side_].value.store(1, std::memory_order_seq_cst);
  for (int d = 0; d < 2; ++d) {
    WakeAll(header_->written[d].value);
    WakeAll(header_->released[d].value);
  }
}

char* ShmChannel::Ring(int direction) const {
  return segment_.base() + kChannelHeaderBytes + static_cast<size_t>(direction) * kChannelRingBytes;
}

void ShmChannel::Send(const void* data, size_t bytes) {
  if (bytes > kSyncChunkBytes) {
    throw std::logic_error("Gloo: a message of " + std::to_string(bytes) + " bytes for a shared-memory channel");
  }
  const int d = side_;
  char* ring = Ring(d);
  const uint32_t record = kChannelRecordHead + (static_cast<uint32_t>(bytes) + 63u) / 64u * 64u;
  const uint32_t offset = sent_ % kChannelRingBytes, tail = kChannelRingBytes - offset;
  const bool wrap = record > tail;
  // Room for the record (and, where it wraps, for the rest of the ring before it): at most
  // kChannelRingBytes - need bytes of what this rank wrote may still be unreleased.
  const uint32_t need = wrap ? tail + record : record;
  Await(header_->released[d], sent_ + need - kChannelRingBytes);
  if (wrap) {
    std::memcpy(ring + offset, &kChannelWrap, sizeof(kChannelWrap));
    sent_ += tail;
  }
  const uint64_t length = bytes;
  char* head = ring + sent_ % kChannelRingBytes;
  std::memcpy(head, &length, sizeof(length));
  if (bytes > 0) std::memcpy(head + kChannelRecordHead, data, bytes);
  sent_ += record;
  Publish(header_->written[d].value, header_->written[d].waiters, sent_);
}

const char* ShmChannel::Recv(size_t bytes) {
  Release();
  const int d = 1 - side_;
  const char* ring = Ring(d);
  Await(header_->written[d], taken_ + 1);
  uint64_t length = 0;
  std::memcpy(&length, ring + taken_ % kChannelRingBytes, sizeof(length));
  if (length == kChannelWrap) {
    taken_ += kChannelRingBytes - taken_ % kChannelRingBytes;
    std::memcpy(&length, ring, sizeof(length));
  }
  const char* data = ring + taken_ % kChannelRingBytes + kChannelRecordHead;
  if (length > kSyncChunkBytes || (bytes != 0 && length != bytes)) {
    throw std::runtime_error("Gloo: rank " + std::to_string(waiting_.peer) + " sent a message of " +
                             std::to_string(length) + " bytes where this rank expected " + std::to_string(bytes));
  }
  taken_ += kChannelRecordHead + (static_cast<uint32_t>(length) + 63u) / 64u * 64u;
  holding_ = true;
  return data;
}

void ShmChannel::Release() {
  if (!holding_) return;
  holding_ = false;
  Publish(header_->released[1 - side_].value, header_->released[1 - side_].waiters, taken_);
}

// Waits until `counter` reaches `target` (AwaitCounter): polling it for kChannelSpin (or the
// mesh's own poll time, if longer; when busy-polling, throughout), then sleeping on it.
void ShmChannel::Await(Counter& counter, uint32_t target) {
  const auto spin = std::max(waiting_.spin, std::chrono::duration_cast<std::chrono::microseconds>(kChannelSpin));
  AwaitCounter(counter.value, counter.waiters, target, spin, waiting_.busy_poll,
               [&](std::chrono::steady_clock::time_point start) { CheckPeer(start); });
}

// Throws, naming the peer, where it is gone or the wait that began at `start` has lasted longer
// than the timeout.
void ShmChannel::CheckPeer(std::chrono::steady_clock::time_point start) {
  const pid_t pid = waiting_.peer_pid;
  const std::string who = "rank " + std::to_string(waiting_.peer) + " (process " + std::to_string(pid) +
                          " on host " + waiting_.host + ")";
  if (header_->closed[1 - side_].value.load(std::memory_order_acquire) != 0) {
    throw std::runtime_error("Gloo: " + who + " closed its connection to this rank");
  }
  if (ProcessGone(pid)) throw std::runtime_error("Gloo: " + who + " exited");
  if (waiting_.timeout.count() > 0 && std::chrono::steady_clock::now() - start > waiting_.timeout) {
    throw std::runtime_error("Gloo: no message from " + who + " within " + std::to_string(waiting_.timeout.count()) +
                             " ms");
  }
}

}  // namespace horovod::gloo_backend
