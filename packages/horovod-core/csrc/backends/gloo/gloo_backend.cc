// The Gloo backend: TCP full meshes built through the rendezvous store. Allreduce, broadcast and
// the control plane go over a mesh whose sockets the calling thread drives itself (SyncMesh);
// allgather, alltoall, barrier and Adasum's exchanges use Gloo's own algorithms on the other.
// Between ranks of one host, SyncMesh's messages go through shared memory instead of TCP.
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>

#include "backends/communicator.h"
#include "backends/shm/futex_counter.h"
#include "engine/liveness.h"
#include "engine/reduction.h"

namespace horovod {
namespace {

// Slot prefix of SendRecv's point-to-point messages (Adasum).
constexpr uint8_t kPeerSlotPrefix = 0x69;

// The largest message the synchronous mesh sends in one piece (the ring's, broadcasts' and framed
// messages'). A rank may have two such messages unread by a peer (see SyncMesh): every socket's
// send buffer holds 320 KiB (kSendBufferBytes, doubled by Linux), and the peer's receive buffer
// (128 KiB at least) holds more, so neither writer blocks on the other. 512 KiB would not fit:
// writers could block on each other.
constexpr size_t kSyncChunkBytes = 128 << 10;
// The first message of every pair (SyncMesh::SizeSendBuffers): Gloo sizes the socket's send
// buffer to it, and no later message is larger than half of it.
constexpr size_t kSendBufferBytes = 160 << 10;
// Allreduces up to this many bytes take one step (every rank sends its data to every other);
// larger ones a reduce-scatter, then an allgather. Between two ranks one step goes up to
// kPairExchangeBytes: on the test bed's 2 hosts x 1 rank a 64 KiB allreduce took 31-34 us in one
// step against 39-41 us in two.
constexpr size_t kSyncExchangeBytes = 32 << 10;
constexpr size_t kPairExchangeBytes = 64 << 10;
// The message size of recursive halving and doubling, where both ranks of a pair send at once.
// Measured on the test bed at 2 hosts x 1 rank: 128 KiB pieces took half the time of 32 KiB ones
// for 256 KiB to 16 MiB (1 MiB: 266 us against 500 us; 4 MiB: 1.05 ms against 2.0 ms); 256 KiB
// pieces were 2 times slower again, with 320 KiB or 2 MiB send buffers. Before SizeSendBuffers,
// pieces over 32 KiB stalled for milliseconds.
constexpr size_t kExchangePieceBytes = 128 << 10;
// Between ranks of one host that read each other's memory: how much of a peer's data is read at
// a time to be reduced (kept in cache while it is), and the probe that shows a peer's memory is
// readable ("HVDCROSS" xor the rank).
constexpr int64_t kCrossPieceBytes = 256 << 10;
constexpr uint64_t kCrossProbe = 0x48564443524f5353ull;
constexpr int kSyncSlot = 0x6a;
// Messages of at least this many bytes go between the caller's memory and the socket without the
// staging copy: the sender writes from the caller's data, the receiver reads into the caller's
// output (or, to reduce it, into a buffer of its own), through a Gloo buffer of slot kDirectSlot
// that lives for that one message. A Gloo buffer's destructor unregisters its pair's receive
// buffer of the same slot, so none stays registered on kDirectSlot: the receiving side registers
// it just before it reads the message, and the sending side's lives only while it writes.
constexpr size_t kDirectBytes = 4 << 10;
constexpr int kDirectSlot = 0x6b;
// When polling, a message larger than kWholeMessageBytes that has begun to arrive is waited for
// whole, for up to kRestSpin more (SyncMesh::AwaitReadable). At 2 hosts x 1 rank of the test bed,
// 64 KiB allreduces (one message each way) took 39-43 us (median) and 63-71 us (90th percentile)
// with 16 KiB here, against 41-50 us and 72-89 us with 64 KiB (fresh sessions; two runs of 24
// alternating with the previous build).
constexpr size_t kWholeMessageBytes = 16 << 10;
constexpr std::chrono::microseconds kRestSpin{50};

// Adapts the engine's Store (blocking Get) to Gloo's store interface.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(horovod::Store& store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.Set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return store_.Get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) store_.Get(prefix_ + key);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  horovod::Store& store_;
  std::string prefix_;
};

// An IPv4 or IPv6 socket address as a key: family, port and address bytes ("" for others).
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

// This process's sockets by local address (AddressKey), from /proc/self/fd: Gloo does not expose
// the socket of a pair, whose local address it does expose.
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

// The shared-memory channel between two ranks of one host (SyncMesh::OpenChannels), which carries
// the mesh's messages between them instead of the pair's TCP socket. Per direction, a ring of
// kChannelRingBytes and two counters of byte positions in it (modulo 2^32): how far the writer has
// put messages in and how far the reader is done with them. A message is a record of a 64-byte
// head (its length) and its bytes, rounded up to 64; a record that would not fit before the ring's
// end is preceded by a head that says "go back to the start" (kChannelWrap). The reader keeps the
// last message it took in the ring (the caller reads it there) and releases it when it takes the
// next one. The ring holds at least 3 of the largest messages (kSyncChunkBytes): as much as the
// mesh has unread between two ranks (TCP's socket buffers held about as much). Waiting polls the
// counter (yielding the core) for kChannelSpin or the mesh's own poll time, whichever is longer,
// then sleeps on it as a futex. Only where a host has at most kChannelMaxLocalRanks ranks of the
// mesh, and only in the job's global mesh (not in those of process sets and of the hierarchical
// collectives' groups, GlooBackend::Split): each pair's segment takes 1 MiB of /dev/shm, which
// other users of it (data loaders, NCCL) may need, and a container's is often only 64 MiB.
constexpr uint32_t kChannelRingBytes = 512 << 10;
constexpr uint32_t kChannelRecordHead = 64;
constexpr uint64_t kChannelWrap = ~uint64_t{0};
static_assert(kChannelRecordHead + kSyncChunkBytes <= kChannelRingBytes / 3, "3 messages fit the ring");
constexpr int kChannelMaxLocalRanks = 4;
constexpr std::chrono::microseconds kChannelSpin{20};
constexpr uint64_t kChannelMagic = 0x48564443484e4c53ull;  // "HVDCHNLS"

// A futex word and the number of threads sleeping on it, alone in their cache lines.
struct alignas(128) ChannelCounter {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> waiters;
};

// The first page of a channel's segment; the rings follow it, the one the lower rank of the pair
// writes (direction 0), then the one the higher rank writes (direction 1).
struct ChannelHeader {
  uint64_t magic;
  uint64_t ring_bytes;
  ChannelCounter closed[2];    // by side: set when that rank's mesh is destroyed
  ChannelCounter written[2];   // by direction: where the writer's next record goes
  ChannelCounter released[2];  // by direction: up to where the reader is done
};
constexpr size_t kChannelHeaderBytes = 4096;
static_assert(sizeof(ChannelHeader) <= kChannelHeaderBytes, "the channel header fits its page");
constexpr size_t kChannelBytes = kChannelHeaderBytes + 2 * size_t{kChannelRingBytes};

// A second full mesh of TCP connections whose pairs Gloo runs in synchronous mode: the calling
// thread writes and reads the sockets itself, instead of handing each message to Gloo's event
// loop thread and waiting for it to wake the caller, and a message goes out at once into a buffer
// that the peer registered when the mesh was built, instead of after the notify/ready round trip
// that Gloo's unbound buffers take. A small collective then costs one network latency per step and
// no thread hand-off, and a large one keeps both directions of every link busy. It carries the
// control plane (the per-cycle AND, the gather of requests, the broadcast of responses), the
// allreduces and the broadcasts; one thread uses it at a time (the communicator's).
//
// Every message is at most kSyncChunkBytes; small ones are staged through the pair's own buffers,
// larger ones go straight from and to the caller's memory (kDirectBytes). In the
// allreduce a rank sends each step's messages before reading the step's arrivals, and cannot start
// a step before it has read every peer's message of the one before, which each peer sent only after
// reading all of the step before that: so at most two messages of a rank are unread by a peer at
// any time, and the two sockets' kernel buffers hold them without a writer blocking.
class SyncMesh {
 public:
  SyncMesh(int rank, int size, std::chrono::milliseconds timeout, horovod::Store& store, const std::string& prefix,
           std::shared_ptr<gloo::transport::Device> device, bool busy_poll, std::chrono::microseconds spin,
           bool cross_memory, bool local_channel)
      : rank_(rank),
        size_(size),
        one_step_bytes_(size == 2 ? kPairExchangeBytes : kSyncExchangeBytes),
        spin_(busy_poll ? std::chrono::microseconds(0) : spin),
        busy_poll_(busy_poll),
        timeout_(timeout),
        scratch_(one_step_bytes_) {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    StoreAdapter adapter(store, prefix);
    context->connectFullMesh(adapter, device);
    peers_.resize(size);
    std::map<std::string, int> sockets;
    if (spin_.count() > 0) sockets = SocketsByAddress();
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      auto& pair = context->getPair(r);
      // Synchronous before the buffer exists: a peer that is done building the mesh may already
      // be sending, and Gloo's event loop leaves a message for an unregistered buffer in the
      // socket, where this thread will read it; once registered, the loop would read it, and the
      // next, into the one staging buffer.
      pair->setSync(true, busy_poll);
      Peer& peer = peers_[r];
      peer.pair = pair.get();
      peer.out.resize(kDirectBytes);
      peer.in.resize(kDirectBytes);
      peer.send = pair->createSendBuffer(kSyncSlot, peer.out.data(), kDirectBytes);
      peer.recv = pair->createRecvBuffer(kSyncSlot, peer.in.data(), kDirectBytes);
      // The pair's socket, to poll; none found (or no polling): this peer's waits sleep at once.
      const auto* address = dynamic_cast<const gloo::transport::tcp::Address*>(&pair->address());
      auto socket = address ? sockets.find(AddressKey(address->getSockaddr())) : sockets.end();
      if (socket != sockets.end()) peer.fd = socket->second;
    }
    context_ = std::move(context);
    SizeSendBuffers();
    if (cross_memory || local_channel) FindHostPeers(store, prefix, cross_memory);
    if (local_channel) OpenChannels();
    if (cross_memory) EnableCrossMemory();
  }

  SyncMesh(const SyncMesh&) = delete;
  SyncMesh& operator=(const SyncMesh&) = delete;

  // Tells every channel's peer that this rank is gone (a peer waiting on it then fails at once).
  ~SyncMesh() {
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) CloseChannel(r);
  }

  // Collective, while the mesh is built: one kSendBufferBytes message to every peer and from it.
  // Gloo sizes a socket's send buffer (SO_SNDBUF, which also ends the kernel's tuning of it) to
  // the largest message sent so far, but only ever upwards: after 32 KiB messages it is 64 KiB
  // (the kernel doubles what is asked), which a 64 KiB message, with the kernel's bookkeeping,
  // overflows. Its writer then waits for the peer's acknowledgements, which the peer, writing its
  // own message at the same moment, delays: on the test bed such allreduces stalled for
  // milliseconds. This first message sizes every send buffer once for all (to kSendBufferBytes,
  // or twice net.core.wmem_max where that is less), larger than any message the mesh sends later.
  void SizeSendBuffers() {
    std::vector<char> bytes(kSendBufferBytes);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) Send(r, bytes.data(), bytes.size());
    }
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) RecvDirect(peers_[r], bytes.data(), bytes.size());
    }
  }

  // How many peers this rank reaches through a shared-memory channel.
  int local_channels() const {
    int n = 0;
    for (const Peer& p : peers_) n += p.channel.header != nullptr;
    return n;
  }

  // Allreduces up to this many bytes take one step (and may be carried by the cache round).
  int64_t one_step_bytes() const { return static_cast<int64_t>(one_step_bytes_); }

  // In-place allreduce of `count` elements. Up to one_step_bytes() each rank sends its data to
  // every other and reduces all of it in rank order (one step, the same bits as the shared-memory
  // transport); beyond, at a power-of-two number of ranks, recursive halving and doubling, and at
  // other numbers the ring below. All leave the same bits on every rank. (Two steps at more than
  // two ranks, each rank sending a block to every other, took 2-4 times as long as the ring for
  // 64-512 KiB at 2 hosts x 2 ranks on the test bed: every rank's messages arrive at once from all
  // its peers.)
  void Allreduce(void* buffer, int64_t count, DataType dtype, ReduceOp op) {
    const int64_t item = DataTypeSize(dtype);
    char* data = static_cast<char*>(buffer);
    static_assert(kSyncExchangeBytes <= kPairExchangeBytes && kPairExchangeBytes <= kSyncChunkBytes,
                  "the one-step allreduce sends a single message");
    if (count * item <= one_step_bytes()) {
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) Send(r, data, count * item);
      }
      ReduceInRankOrder(data, count, dtype, op);
      return;
    }
    if ((size_ & (size_ - 1)) == 0) {
      HalvingDoublingAllreduce(data, count, dtype, op);
    } else {
      RingAllreduce(data, count, dtype, op);
    }
  }

  // The ring allreduce (reduce-scatter, then allgather, each in size - 1 steps to the next rank),
  // in rounds of size × kSyncChunkBytes. It sends as many bytes per rank as a two-step scheme
  // would, but only to the next rank: where ranks are numbered host by host, all but one of each
  // host's messages stay on the host, where two steps would send (size - local size) / size of
  // them across. Block b is reduced along the ring from rank b + 1 to rank b, so every rank ends with
  // the same bits, though not those of a reduction in rank order. A rank can be at most size - 1
  // steps ahead of the next one, and never all ranks ahead of their next ones at once, so the ring
  // cannot close into writers that all wait on full sockets.
  void RingAllreduce(char* data, int64_t count, DataType dtype, ReduceOp op) {
    const int64_t item = DataTypeSize(dtype);
    const int64_t span = static_cast<int64_t>(kSyncChunkBytes) / item * size_;
    const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
    auto wrap = [&](int block) { return ((block % size_) + size_) % size_; };
    for (int64_t start = 0; start < count; start += span) {
      const int64_t n = std::min(span, count - start);
      auto lo = [&](int block) { return start + n * block / size_; };
      auto len = [&](int block) { return lo(block + 1) - lo(block); };
      for (int step = 0; step < size_ - 1; ++step) {
        const int out = wrap(rank_ - step), in = wrap(rank_ - step - 1);
        if (len(out) > 0) Send(right, data + lo(out) * item, len(out) * item);
        if (len(in) > 0) {
          char* mine = data + lo(in) * item;
          Reduce(mine, Recv(left, len(in) * item), mine, len(in), dtype, op);
        }
      }
      for (int step = 0; step < size_ - 1; ++step) {
        const int out = wrap(rank_ + 1 - step), in = wrap(rank_ - step);
        if (len(out) > 0) Send(right, data + lo(out) * item, len(out) * item);
        if (len(in) > 0) RecvInto(left, data + lo(in) * item, len(in) * item);
      }
    }
  }

  // At a power-of-two number of ranks: reduce-scatter by recursive halving, then allgather by
  // recursive doubling (Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
  // Operations in MPICH", IJHPCA 2005), in log2(size) steps each where the ring takes size - 1. In
  // step k of the reduce-scatter a rank and its partner rank ^ 2^k split the part of the tensor
  // they share, each sending the other the half it gives up and reducing the half it keeps; the
  // allgather retraces the steps backwards. The nearest partner comes first, so where ranks are
  // numbered host by host the largest exchanges stay on a host: at 2 hosts x 2 ranks each host
  // sends the other as many bytes as the tensor holds, against 1.5 times as many in the ring, and
  // every rank still sends 1.5 times the tensor in all, as in the ring. A step's halves travel in
  // messages of kExchangePieceBytes, each rank sending one before reading its partner's, so at most
  // one message of a rank is unread by its partner of the step and one by its partner of the next.
  // Between two ranks of one host that may access each other's memory, the reduce-scatter reads
  // the kept half straight from the partner's data instead, and the allgather writes the finished
  // half into it (ExchangeCrossMemory): at 2 hosts x 2 ranks the largest exchanges then skip TCP.
  // Each element is reduced on one rank, the lower rank's operand first, and copied to the others:
  // every rank ends with the same bits: at two ranks those of the reduction in rank order, at four
  // those of (x0 op x1) op (x2 op x3), and so on.
  void HalvingDoublingAllreduce(char* data, int64_t count, DataType dtype, ReduceOp op) {
    static constexpr int kMaxSteps = 31;  // ranks are ints
    int steps = 0;
    while ((1 << steps) < size_) ++steps;
    auto exchange = [&](int peer, int64_t send_lo, int64_t send_hi, int64_t keep_lo, int64_t keep_hi, bool reduce) {
      if (peers_[peer].cross_memory) {
        ExchangeCrossMemory(peer, data, send_lo, send_hi, keep_lo, keep_hi, reduce, dtype, op);
      } else {
        Exchange(peer, data, send_lo, send_hi, keep_lo, keep_hi, reduce, dtype, op);
      }
    };
    // The part of the tensor this rank holds before step k is [lo[k], hi[k]); in step k it keeps
    // [lo[k + 1], hi[k + 1]) and its partner the other half, [given_lo[k], given_hi[k]).
    int64_t lo[kMaxSteps + 1] = {0}, hi[kMaxSteps + 1] = {count}, given_lo[kMaxSteps], given_hi[kMaxSteps];
    for (int k = 0; k < steps; ++k) {
      const int64_t mid = lo[k] + (hi[k] - lo[k]) / 2;
      const bool upper = (rank_ >> k) & 1;
      lo[k + 1] = upper ? mid : lo[k];
      hi[k + 1] = upper ? hi[k] : mid;
      given_lo[k] = upper ? lo[k] : mid;
      given_hi[k] = upper ? mid : hi[k];
      exchange(rank_ ^ (1 << k), given_lo[k], given_hi[k], lo[k + 1], hi[k + 1], true);
    }
    for (int k = steps - 1; k >= 0; --k) {
      exchange(rank_ ^ (1 << k), lo[k + 1], hi[k + 1], given_lo[k], given_hi[k], false);
    }
  }

  // Sends elements [send_lo, send_hi) of `data` to `peer` while reading its [keep_lo, keep_hi),
  // in messages of kExchangePieceBytes, each sent before the partner's is read; what arrives is
  // reduced into the local elements, the lower rank's operand first (`reduce`), or overwrites them.
  void Exchange(int peer, char* data, int64_t send_lo, int64_t send_hi, int64_t keep_lo, int64_t keep_hi, bool reduce,
                DataType dtype, ReduceOp op) {
    const int64_t item = DataTypeSize(dtype);
    const int64_t piece = std::max<int64_t>(1, static_cast<int64_t>(kExchangePieceBytes) / item);
    for (int64_t i = 0; send_lo + i < send_hi || keep_lo + i < keep_hi; i += piece) {
      if (send_lo + i < send_hi) {
        Send(peer, data + (send_lo + i) * item, std::min(piece, send_hi - send_lo - i) * item);
      }
      if (keep_lo + i < keep_hi) {
        const int64_t n = std::min(piece, keep_hi - keep_lo - i);
        char* mine = data + (keep_lo + i) * item;
        if (!reduce) {
          RecvInto(peer, mine, n * item);
        } else if (peer < rank_) {
          Reduce(mine, Recv(peer, n * item), mine, n, dtype, op);
        } else {
          Reduce(mine, mine, Recv(peer, n * item), n, dtype, op);
        }
      }
    }
  }

  // The same exchange with a rank of this host whose memory this rank reads and writes
  // (peers_[peer].cross_memory). In the reduce-scatter the two tell each other where their data
  // lies, then each reads the elements it keeps, [keep_lo, keep_hi), straight from the other's
  // data with process_vm_readv, a kCrossPieceBytes piece at a time, and reduces them (the lower
  // rank's operand first). In the allgather, which meets the same partner later in the same allreduce,
  // each writes its finished elements, [send_lo, send_hi), into the other's data at the same
  // offsets with process_vm_writev, then says so, and neither returns (and lets its caller touch
  // its data) before the other has said so. No rank reads or writes what another uses at the same
  // time: the elements a rank reads from its partner in the reduce-scatter are those the partner
  // gives up, which it no longer touches; the partner's elements a rank writes in the allgather are
  // the same ones, which the rank itself read earlier and the partner waits for.
  void ExchangeCrossMemory(int peer, char* data, int64_t send_lo, int64_t send_hi, int64_t keep_lo, int64_t keep_hi,
                           bool reduce, DataType dtype, ReduceOp op) {
    Peer& p = peers_[peer];
    const int64_t item = DataTypeSize(dtype);
    const uint64_t done = 1;
    if (!reduce) {
      if (send_hi > send_lo) {
        CopyPeerMemory(peer, data + send_lo * item, p.remote_data + send_lo * item, (send_hi - send_lo) * item, true);
      }
      Send(peer, &done, sizeof(done));
      Recv(peer, sizeof(done));
      return;
    }
    const uint64_t mine = reinterpret_cast<uintptr_t>(data);
    Send(peer, &mine, sizeof(mine));
    std::memcpy(&p.remote_data, Recv(peer, sizeof(p.remote_data)), sizeof(p.remote_data));
    const int64_t piece = std::max<int64_t>(1, kCrossPieceBytes / item);
    if (p.landing.size() < static_cast<size_t>(piece * item)) p.landing.resize(piece * item);
    for (int64_t i = keep_lo; i < keep_hi; i += piece) {
      const int64_t n = std::min(piece, keep_hi - i);
      char* local = data + i * item;
      CopyPeerMemory(peer, p.landing.data(), p.remote_data + i * item, n * item, false);
      if (peer < rank_) {
        Reduce(local, p.landing.data(), local, n, dtype, op);
      } else {
        Reduce(local, local, p.landing.data(), n, dtype, op);
      }
    }
  }

  // `bytes` between `local` and `address` in the process of rank `peer`: read from there into
  // `local`, or written there from it (`write`).
  void CopyPeerMemory(int peer, char* local, uint64_t address, int64_t bytes, bool write) {
    int64_t done = 0;
    while (done < bytes) {
      iovec here{local + done, static_cast<size_t>(bytes - done)};
      iovec there{reinterpret_cast<void*>(address + done), static_cast<size_t>(bytes - done)};
      const pid_t pid = peers_[peer].host_pid;
      const ssize_t n =
          write ? process_vm_writev(pid, &here, 1, &there, 1, 0) : process_vm_readv(pid, &here, 1, &there, 1, 0);
      if (n <= 0) {
        const std::string why = n < 0 ? std::strerror(errno) : "nothing moved";
        throw std::runtime_error(std::string("Gloo: ") + (write ? "writing" : "reading") +
                                 " the allreduce data of rank " + std::to_string(peer) + " (process " +
                                 std::to_string(pid) + " on host " + host_ + ") failed: " + why +
                                 "; the rank may have exited");
      }
      done += n;
    }
  }

  // Collective, while the mesh is built: every rank publishes its hostname, process id, PID
  // namespace and the address of a probe word in the store, and notes the process of every rank of
  // its host (the same hostname and PID namespace) in peers_[r].host_pid. Where `cross_memory`,
  // the process first allows every other process of its user to read its memory (under Yama's
  // ptrace_scope=1 only a process's ancestors may otherwise).
  void FindHostPeers(horovod::Store& store, const std::string& prefix, bool cross_memory) {
    if (cross_memory) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    host_ = host;
    probe_ = kCrossProbe ^ static_cast<uint64_t>(rank_);
    const std::string pid_namespace = PidNamespace();
    std::ostringstream mine;
    mine << host << '\n' << ::getpid() << '\n' << reinterpret_cast<uintptr_t>(&probe_) << '\n' << pid_namespace;
    const std::string text = mine.str();
    store.Set(prefix + "cross/" + std::to_string(rank_), std::vector<char>(text.begin(), text.end()));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
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
      peers_[r].host_pid = static_cast<pid_t>(pid);
      peers_[r].probe_address = address;
    }
  }

  // Collective, while the mesh is built: finds the ranks of this host whose memory this rank can
  // read with process_vm_readv, and so write with process_vm_writev, which the kernel allows on the
  // same terms (same user, no seccomp or Yama restriction), by reading every such peer's probe
  // word; a pair uses cross-memory attach only when both of its ranks read the other's probe (each
  // tells every peer what it found).
  void EnableCrossMemory() {
    std::vector<uint64_t> readable(size_, 0);
    for (int r = 0; r < size_; ++r) {
      const Peer& p = peers_[r];
      if (r == rank_ || p.host_pid <= 0) continue;
      uint64_t word = 0;
      iovec local{&word, sizeof(word)}, remote{reinterpret_cast<void*>(p.probe_address), sizeof(word)};
      readable[r] = process_vm_readv(p.host_pid, &local, 1, &remote, 1, 0) == sizeof(word) &&
                    word == (kCrossProbe ^ static_cast<uint64_t>(r));
    }
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) Send(r, &readable[r], sizeof(readable[r]));
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      uint64_t found = 0;
      std::memcpy(&found, Recv(r, sizeof(found)), sizeof(found));
      peers_[r].cross_memory = found != 0 && readable[r] != 0;
    }
  }

  // Collective, while the mesh is built (after FindHostPeers): a shared-memory channel for every
  // pair of ranks of one host, where the host has no more than kChannelMaxLocalRanks ranks of the
  // mesh. The lower rank of a pair creates the segment and sends its name over TCP; the higher one
  // maps it and answers whether it could; the lower one then removes the name from /dev/shm (both
  // keep their mappings). A pair whose segment failed keeps TCP: /dev/shm full or missing is no
  // error. Both ranks switch to the channel after this exchange, before their next message.
  void OpenChannels() {
    int local = 1;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && peers_[r].host_pid > 0) ++local;
    }
    // Every rank of the host counts the same ranks, so they all decide alike.
    if (local < 2 || local > kChannelMaxLocalRanks) return;
    std::vector<std::string> names(size_);
    std::vector<void*> maps(size_, MAP_FAILED);
    std::random_device random;
    for (int r = rank_ + 1; r < size_; ++r) {
      if (peers_[r].host_pid <= 0) continue;
      std::ostringstream name;
      name << "/horovod.gloo." << ::getpid() << "." << rank_ << "." << r << "." << std::hex << random() << random();
      void* base = MapChannel(name.str(), true);
      if (base != MAP_FAILED) {
        maps[r] = base;
        names[r] = name.str();
      }
      SendFramed(r, std::vector<char>(names[r].begin(), names[r].end()));
    }
    for (int r = 0; r < rank_; ++r) {
      if (peers_[r].host_pid <= 0) continue;
      const std::vector<char> name = RecvFramed(r);
      if (!name.empty()) maps[r] = MapChannel(std::string(name.begin(), name.end()), false);
      const uint64_t ok = maps[r] != MAP_FAILED;
      Send(r, &ok, sizeof(ok));
    }
    for (int r = rank_ + 1; r < size_; ++r) {
      if (peers_[r].host_pid <= 0) continue;
      uint64_t ok = 0;
      std::memcpy(&ok, Recv(r, sizeof(ok)), sizeof(ok));
      if (names[r].empty()) continue;
      shm_unlink(names[r].c_str());
      if (ok == 0) {
        munmap(maps[r], kChannelBytes);
        maps[r] = MAP_FAILED;
      }
    }
    for (int r = 0; r < size_; ++r) {
      if (maps[r] == MAP_FAILED) continue;
      Channel& c = peers_[r].channel;
      c.header = static_cast<ChannelHeader*>(maps[r]);
      c.base = static_cast<char*>(maps[r]);
      c.side = rank_ < r ? 0 : 1;
    }
  }

  // This process's PID namespace ("device:inode" of /proc/self/ns/pid; empty where unknown).
  static std::string PidNamespace() {
    struct stat info {};
    if (::stat("/proc/self/ns/pid", &info) != 0) return "";
    return std::to_string(info.st_dev) + ":" + std::to_string(info.st_ino);
  }

  // Creates (`create`) or opens the segment `name` and maps it; MAP_FAILED where it cannot.
  static void* MapChannel(const std::string& name, bool create) {
    const int fd = create ? shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) return MAP_FAILED;
    void* base = MAP_FAILED;
    // Reserve the pages now: on a full /dev/shm a later first touch would be SIGBUS.
    if (!create || (ftruncate(fd, static_cast<off_t>(kChannelBytes)) == 0 &&
                    posix_fallocate(fd, 0, static_cast<off_t>(kChannelBytes)) == 0)) {
      base = mmap(nullptr, kChannelBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (base == MAP_FAILED) {
      if (create) shm_unlink(name.c_str());
      return MAP_FAILED;
    }
    auto* header = static_cast<ChannelHeader*>(base);
    if (create) {
      std::memset(base, 0, kChannelHeaderBytes);
      header->ring_bytes = kChannelRingBytes;
      header->magic = kChannelMagic;
    } else if (header->magic != kChannelMagic || header->ring_bytes != kChannelRingBytes) {
      munmap(base, kChannelBytes);
      return MAP_FAILED;
    }
    return base;
  }

  void CloseChannel(int peer) {
    Channel& c = peers_[peer].channel;
    if (c.header == nullptr) return;
    c.header->closed[c.side].value.store(1, std::memory_order_seq_cst);
    for (int d = 0; d < 2; ++d) {
      WakeAll(c.header->written[d].value);
      WakeAll(c.header->released[d].value);
    }
    munmap(c.base, kChannelBytes);
    c.header = nullptr;
  }

  // The cache round, every rank's words ANDed, with an allreduce's data where a rank has one
  // (Communicator::AllreduceBitsAndEager; tag 0: none): each rank sends every other one framed
  // message, [tag, data bytes, words..., data], where the data rides along when it fits the first
  // staged message, and otherwise follows in a message of its own, straight from the tensor. The
  // data is reduced in rank order as it arrives (from rank 0 up), into `output` directly at two
  // ranks and into scratch_ at more, until some rank's tag differs from this one's; the rest is
  // read and dropped. The messages go through buffers kept from round to round (this runs every
  // cycle): round_out_, and each peer's `round`, which holds its inline data until its next round.
  bool AllreduceBitsAndEager(std::vector<uint64_t>& words, const EagerAllreduceOptions& eager) {
    const int64_t bytes = eager.tag != 0 ? eager.count * DataTypeSize(eager.dtype) : 0;
    if (bytes > one_step_bytes()) throw std::logic_error("eager allreduce of more than the one-step size");
    constexpr size_t kHeadWords = 2;
    const size_t head_bytes = (kHeadWords + words.size()) * sizeof(uint64_t);
    auto inline_data = [&](uint64_t n) { return head_bytes + n <= kDirectBytes - kFrameHeader; };
    const bool inline_mine = inline_data(static_cast<uint64_t>(bytes));
    round_out_.resize(head_bytes + (inline_mine ? bytes : 0));
    const uint64_t head[kHeadWords] = {eager.tag, static_cast<uint64_t>(bytes)};
    std::memcpy(round_out_.data(), head, sizeof(head));
    std::memcpy(round_out_.data() + sizeof(head), words.data(), words.size() * sizeof(uint64_t));
    if (inline_mine && bytes > 0) std::memcpy(round_out_.data() + head_bytes, eager.input, static_cast<size_t>(bytes));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      SendFramed(r, round_out_);
      if (!inline_mine && bytes > 0) Send(r, eager.input, static_cast<size_t>(bytes));
    }
    bool agreed = eager.tag != 0;
    const void* acc = nullptr;  // x_0 op ... op x_r once rank r's data is in
    char* into = size_ == 2 ? static_cast<char*>(eager.output) : scratch_.data();
    for (int r = 0; r < size_; ++r) {
      const void* theirs = eager.input;
      if (r != rank_) {
        std::vector<char>& got = peers_[r].round;
        RecvFramed(r, got);
        uint64_t their_head[kHeadWords] = {};
        if (got.size() >= head_bytes) std::memcpy(their_head, got.data(), sizeof(their_head));
        const uint64_t n = their_head[1];
        if (got.size() < head_bytes || n > static_cast<uint64_t>(one_step_bytes()) ||
            got.size() != head_bytes + (inline_data(n) ? n : 0)) {
          throw std::runtime_error("control plane: rank " + std::to_string(r) + " sent a cache round of " +
                                   std::to_string(got.size()) + " bytes; expected " + std::to_string(head_bytes) +
                                   " and the data it announced (" + std::to_string(n) + " bytes)");
        }
        for (size_t i = 0; i < words.size(); ++i) {
          uint64_t w;
          std::memcpy(&w, got.data() + sizeof(their_head) + i * sizeof(uint64_t), sizeof(w));
          words[i] &= w;
        }
        if (n == 0) {
          theirs = nullptr;
        } else if (inline_data(n)) {
          theirs = got.data() + head_bytes;
        } else {
          theirs = Recv(r, static_cast<size_t>(n));  // valid until the next message from rank r
        }
        if (their_head[0] != eager.tag || n != static_cast<uint64_t>(bytes)) agreed = false;
      }
      if (!agreed) continue;
      if (r == 0) {
        acc = theirs;
        continue;
      }
      Reduce(into, acc, theirs, eager.count, eager.dtype, eager.op);
      acc = into;
    }
    if (agreed && into != eager.output) std::memcpy(eager.output, into, static_cast<size_t>(bytes));
    return agreed;
  }

  // Each rank's bytes, at `root` (elsewhere: nothing).
  std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root) {
    std::vector<std::vector<char>> result;
    if (rank_ != root) {
      SendFramed(root, data);
      return result;
    }
    result.resize(size_);
    for (int r = 0; r < size_; ++r) result[r] = r == root ? data : RecvFramed(r);
    return result;
  }

  // `data` of `root` on every rank, its length included in the first message.
  void BroadcastBytes(std::vector<char>& data, int root) {
    if (rank_ != root) {
      data = RecvFramed(root);
      return;
    }
    for (int r = 0; r < size_; ++r) {
      if (r != root) SendFramed(r, data);
    }
  }

  void Broadcast(void* buffer, int64_t bytes, int root) {
    char* data = static_cast<char*>(buffer);
    for (int64_t off = 0; off < bytes; off += kSyncChunkBytes) {
      const size_t len = static_cast<size_t>(std::min<int64_t>(kSyncChunkBytes, bytes - off));
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          if (r != root) Send(r, data + off, len);
        }
      } else {
        RecvInto(root, data + off, len);
      }
    }
  }

 private:
  // This rank's end of a shared-memory channel (OpenChannels); header null: none, TCP.
  struct Channel {
    ChannelHeader* header = nullptr;
    char* base = nullptr;
    int side = 0;        // 0: this rank is the lower of the pair (it writes direction 0)
    uint32_t sent = 0;   // position of this rank's next record in the ring it writes
    uint32_t taken = 0;  // position after the last record it took from the other ring
    bool holding = false;  // whether that record is still in use (see ChannelRecv)
  };

  struct Peer {
    std::vector<char> out, in;  // staging, for messages under kDirectBytes
    std::vector<char> landing;  // direct messages this rank reduces, grown to the largest
    std::unique_ptr<gloo::transport::Buffer> send, recv;
    gloo::transport::Pair* pair = nullptr;
    int fd = -1;  // the pair's socket, only to poll it
    bool cross_memory = false;  // whether this rank reads and writes its memory (EnableCrossMemory)
    uint64_t remote_data = 0;  // where the peer's data lies, in the allreduce under way (cross memory)
    std::vector<char> round;   // the peer's last cache-round message (AllreduceBitsAndEager)
    pid_t host_pid = 0;          // the peer's process, where it runs on this host (FindHostPeers)
    uint64_t probe_address = 0;  // and the address of its probe word
    Channel channel;
  };

  char* ChannelRing(const Channel& c, int direction) const {
    return c.base + kChannelHeaderBytes + static_cast<size_t>(direction) * kChannelRingBytes;
  }

  // Puts a message into the channel to `peer`, once its ring has room.
  void ChannelSend(int peer, const void* data, size_t bytes) {
    Channel& c = peers_[peer].channel;
    if (bytes > kSyncChunkBytes) {
      throw std::logic_error("Gloo: a message of " + std::to_string(bytes) + " bytes for a shared-memory channel");
    }
    const int d = c.side;
    char* ring = ChannelRing(c, d);
    const uint32_t record = kChannelRecordHead + (static_cast<uint32_t>(bytes) + 63u) / 64u * 64u;
    const uint32_t offset = c.sent % kChannelRingBytes, tail = kChannelRingBytes - offset;
    const bool wrap = record > tail;
    // Room for the record (and, where it wraps, for the rest of the ring before it): at most
    // kChannelRingBytes - need bytes of what this rank wrote may still be unreleased.
    const uint32_t need = wrap ? tail + record : record;
    AwaitChannel(peer, c.header->released[d], c.sent + need - kChannelRingBytes);
    if (wrap) {
      std::memcpy(ring + offset, &kChannelWrap, sizeof(kChannelWrap));
      c.sent += tail;
    }
    const uint64_t length = bytes;
    char* head = ring + c.sent % kChannelRingBytes;
    std::memcpy(head, &length, sizeof(length));
    if (bytes > 0) std::memcpy(head + kChannelRecordHead, data, bytes);
    c.sent += record;
    Publish(c.header->written[d].value, c.header->written[d].waiters, c.sent);
  }

  // The next message from `peer`'s channel, in its ring, valid until the next one is taken (its
  // record is released then); `bytes`: its expected length, 0 where the sender chose it.
  const char* ChannelRecv(int peer, size_t bytes) {
    Channel& c = peers_[peer].channel;
    ChannelRelease(c);
    const int d = 1 - c.side;
    const char* ring = ChannelRing(c, d);
    AwaitChannel(peer, c.header->written[d], c.taken + 1);
    uint64_t length = 0;
    std::memcpy(&length, ring + c.taken % kChannelRingBytes, sizeof(length));
    if (length == kChannelWrap) {
      c.taken += kChannelRingBytes - c.taken % kChannelRingBytes;
      std::memcpy(&length, ring, sizeof(length));
    }
    const char* data = ring + c.taken % kChannelRingBytes + kChannelRecordHead;
    if (length > kSyncChunkBytes || (bytes != 0 && length != bytes)) {
      throw std::runtime_error("Gloo: rank " + std::to_string(peer) + " sent a message of " + std::to_string(length) +
                               " bytes where this rank expected " + std::to_string(bytes));
    }
    c.taken += kChannelRecordHead + (static_cast<uint32_t>(length) + 63u) / 64u * 64u;
    c.holding = true;
    return data;
  }

  // Releases the message last taken from the channel, if it is still held.
  void ChannelRelease(Channel& c) {
    if (!c.holding) return;
    c.holding = false;
    Publish(c.header->released[1 - c.side].value, c.header->released[1 - c.side].waiters, c.taken);
  }

  // Waits until `counter` of `peer`'s channel reaches `target` (AwaitCounter): polling it for
  // kChannelSpin (or the mesh's own poll time, if longer; when busy-polling, throughout), then
  // sleeping on it. Throws, naming the peer, when the peer's mesh is destroyed, its process exits
  // or the mesh's timeout passes first.
  void AwaitChannel(int peer, ChannelCounter& counter, uint32_t target) {
    const auto spin = std::max(spin_, std::chrono::duration_cast<std::chrono::microseconds>(kChannelSpin));
    AwaitCounter(counter.value, counter.waiters, target, spin, busy_poll_,
                 [&](std::chrono::steady_clock::time_point start) { CheckChannelPeer(peer, start); });
  }

  // Throws where the channel's peer is gone or the wait that began at `start` has lasted longer
  // than the mesh's timeout.
  void CheckChannelPeer(int peer, std::chrono::steady_clock::time_point start) {
    const Channel& c = peers_[peer].channel;
    const pid_t pid = peers_[peer].host_pid;
    const std::string who =
        "rank " + std::to_string(peer) + " (process " + std::to_string(pid) + " on host " + host_ + ")";
    if (c.header->closed[1 - c.side].value.load(std::memory_order_acquire) != 0) {
      throw std::runtime_error("Gloo: " + who + " closed its connection to this rank");
    }
    if (ProcessGone(pid)) throw std::runtime_error("Gloo: " + who + " exited");
    if (timeout_.count() > 0 && std::chrono::steady_clock::now() - start > timeout_) {
      throw std::runtime_error("Gloo: no message from " + who + " within " + std::to_string(timeout_.count()) + " ms");
    }
  }

  // A byte string of any length: its length, then as much of it as fits, in the first message,
  // the rest in whole messages.
  static constexpr size_t kFrameHeader = sizeof(int64_t);

  void SendFramed(int peer, const std::vector<char>& data) {
    const int64_t total = static_cast<int64_t>(data.size());
    const size_t first = std::min(data.size(), kDirectBytes - kFrameHeader);
    char* out = peers_[peer].out.data();
    std::memcpy(out, &total, kFrameHeader);
    if (first > 0) std::memcpy(out + kFrameHeader, data.data(), first);
    Post(peer, kFrameHeader + first);
    for (size_t off = first; off < data.size(); off += kSyncChunkBytes) {
      Send(peer, data.data() + off, std::min(kSyncChunkBytes, data.size() - off));
    }
  }

  std::vector<char> RecvFramed(int peer) {
    std::vector<char> bytes;
    RecvFramed(peer, bytes);
    return bytes;
  }

  // The same into `bytes`, resized to the message (keeping its capacity).
  void RecvFramed(int peer, std::vector<char>& bytes) {
    const char* in = Recv(peer, 0);
    int64_t total = 0;
    std::memcpy(&total, in, kFrameHeader);
    bytes.resize(static_cast<size_t>(total));
    size_t got = std::min(bytes.size(), kDirectBytes - kFrameHeader);
    if (got > 0) std::memcpy(bytes.data(), in + kFrameHeader, got);
    for (; got < bytes.size(); got += kSyncChunkBytes) {
      RecvInto(peer, bytes.data() + got, std::min(kSyncChunkBytes, bytes.size() - got));
    }
  }

  // `mine` (n elements) becomes x_0 op x_1 op ... op x_(size-1), evaluated left to right, where
  // x_rank_ is `mine` and every other x_r is the next message from rank r.
  void ReduceInRankOrder(char* mine, int64_t n, DataType dtype, ReduceOp op) {
    const size_t bytes = static_cast<size_t>(n * DataTypeSize(dtype));
    const void* first = rank_ == 0 ? mine : Recv(0, bytes);
    const void* second = rank_ == 1 ? mine : Recv(1, bytes);
    char* acc = rank_ <= 1 ? mine : scratch_.data();
    Reduce(acc, first, second, n, dtype, op);
    for (int r = 2; r < size_; ++r) Reduce(acc, acc, r == rank_ ? mine : Recv(r, bytes), n, dtype, op);
    if (acc != mine) std::memcpy(mine, acc, n * DataTypeSize(dtype));
  }

  void Send(int peer, const void* data, size_t bytes) {
    if (peers_[peer].channel.header != nullptr) return ChannelSend(peer, data, bytes);
    if (bytes >= kDirectBytes) {
      auto direct = peers_[peer].pair->createSendBuffer(kDirectSlot, const_cast<void*>(data), bytes);
      direct->send(0, bytes);
      direct->waitSend();
      return;
    }
    std::memcpy(peers_[peer].out.data(), data, bytes);
    Post(peer, bytes);
  }

  // Sends the first `bytes` of the peer's staging buffer.
  void Post(int peer, size_t bytes) {
    Peer& p = peers_[peer];
    if (p.channel.header != nullptr) return ChannelSend(peer, p.out.data(), bytes);
    p.send->send(0, bytes);
    p.send->waitSend();
  }

  // The peer's next message, of `bytes` (0: a staged message of a length the sender chose), valid
  // until the next Recv from that peer.
  const char* Recv(int peer, size_t bytes) {
    Peer& p = peers_[peer];
    if (p.channel.header != nullptr) return ChannelRecv(peer, bytes);
    if (bytes >= kDirectBytes) {
      if (p.landing.size() < bytes) p.landing.resize(bytes);
      RecvDirect(p, p.landing.data(), bytes);
      return p.landing.data();
    }
    AwaitReadable(p, bytes);
    p.recv->waitRecv();
    return p.in.data();
  }

  // The peer's next message, of `bytes`, into `into`.
  void RecvInto(int peer, void* into, size_t bytes) {
    Channel& c = peers_[peer].channel;
    if (c.header != nullptr) {
      std::memcpy(into, ChannelRecv(peer, bytes), bytes);
      ChannelRelease(c);
      return;
    }
    if (bytes < kDirectBytes) {
      std::memcpy(into, Recv(peer, bytes), bytes);
      return;
    }
    RecvDirect(peers_[peer], into, bytes);
  }

  // A message of `bytes` >= kDirectBytes, read by Gloo straight into `into`.
  void RecvDirect(Peer& p, void* into, size_t bytes) {
    AwaitReadable(p, bytes);
    auto direct = p.pair->createRecvBuffer(kDirectSlot, into, bytes);
    direct->waitRecv();
  }

  // Polls the peer's socket for up to spin_ when nothing has arrived yet (Gloo's read then sleeps),
  // giving the core to any other runnable thread between polls: where the hosts' ranks share cores
  // (2 hosts x 2 ranks on 2 cores), the thread that is about to send often waits for this one's.
  // A message of more than kWholeMessageBytes (`bytes`; 0: unknown) that has begun to arrive is
  // polled for, for up to kRestSpin more, until all of its payload is in the socket (SO_RCVLOWAT,
  // which poll honours): Gloo's read would otherwise take the first segments and sleep until the
  // next (each sleep costs a wake-up; a 256 KiB allreduce between two hosts took 3 times as long
  // as when polling throughout).
  void AwaitReadable(Peer& p, size_t bytes) {
    if (p.fd < 0) return;
    pollfd ready{p.fd, POLLIN, 0};
    if (!PollFor(ready, spin_)) return;
    if (bytes <= kWholeMessageBytes) return;
    const int whole = static_cast<int>(bytes), one = 1;
    ::setsockopt(p.fd, SOL_SOCKET, SO_RCVLOWAT, &whole, sizeof(whole));
    PollFor(ready, std::min(spin_, kRestSpin));
    ::setsockopt(p.fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));
  }

  // Polls `ready` until it is readable or `spin` has passed, yielding the core between polls.
  static bool PollFor(pollfd& ready, std::chrono::microseconds spin) {
    if (::poll(&ready, 1, 0) > 0) return true;
    const auto deadline = std::chrono::steady_clock::now() + spin;
    while (std::chrono::steady_clock::now() < deadline) {
      sched_yield();
      if (::poll(&ready, 1, 0) > 0) return true;
    }
    return false;
  }

  int rank_, size_;
  size_t one_step_bytes_;
  std::chrono::microseconds spin_;
  bool busy_poll_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;  // declared before peers_: their buffers go first
  std::vector<Peer> peers_;
  std::vector<char> scratch_;
  std::vector<char> round_out_;  // this rank's cache-round message (AllreduceBitsAndEager)
  uint64_t probe_ = 0;  // read by the peers of this host (EnableCrossMemory)
  std::string host_;    // this host's name, where peers_[r].host_pid are its processes
};

class GlooBackend : public Communicator {
 public:
  explicit GlooBackend(const BackendOptions& options) : GlooBackend(options, nullptr) {}

  // `device` is shared by the communicators of one engine (the process sets); null: create one.
  GlooBackend(const BackendOptions& options, std::shared_ptr<gloo::transport::Device> device)
      : Communicator(options.rank, options.size), timeout_(options.timeout), device_(std::move(device)) {
    if (!device_) {
      gloo::transport::tcp::attr attr;
      if (!options.iface.empty()) {
        attr.iface = options.iface;
      } else {
        attr.hostname = options.hostname;
      }
      device_ = gloo::transport::tcp::CreateDevice(attr);
    }
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context->setTimeout(timeout_);
    if (size_ > 1) {
      StoreAdapter store(*options.store, options.key_prefix);
      context->connectFullMesh(store, device_);
      sync_ = std::make_unique<SyncMesh>(rank_, size_, timeout_, *options.store, options.key_prefix + "sync/", device_,
                                         options.busy_poll, options.spin, options.cross_memory,
                                         options.local_channel);
    } else {
      horovod::MemoryStore memory;
      StoreAdapter store(memory, options.key_prefix);
      context->connectFullMesh(store, device_);
    }
    context_ = std::move(context);
  }

  const char* name() const override { return "gloo"; }
  int local_channels() const override { return size_ > 1 ? sync_->local_channels() : 0; }

  std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root) override {
    if (size_ == 1) return {data};
    return sync_->Gatherv(data, root);
  }

  // The cache round without data.
  void AllreduceBitsAnd(std::vector<uint64_t>& words) override {
    if (size_ > 1) sync_->AllreduceBitsAndEager(words, {});
  }

  int64_t EagerAllreduceBytes() const override { return size_ > 1 ? sync_->one_step_bytes() : 0; }

  bool AllreduceBitsAndEager(std::vector<uint64_t>& words, const EagerAllreduceOptions& eager) override {
    return size_ > 1 && sync_->AllreduceBitsAndEager(words, eager);
  }

  void BroadcastBytes(std::vector<char>& data, int root) override {
    if (size_ > 1) sync_->BroadcastBytes(data, root);
  }

  void Allreduce(const AllreduceOptions& options) override {
    AllreduceRaw(options.buffer, options.count, options.dtype, options.op);
  }

  void Allgather(const AllgatherOptions& options) override {
    const std::vector<int64_t>& bytes_per_rank = options.bytes_per_rank;
    const void* input = options.input;
    void* output = options.output;
    if (size_ == 1) {
      if (bytes_per_rank[0] > 0) std::memcpy(output, input, bytes_per_rank[0]);
      return;
    }
    std::vector<size_t> counts(bytes_per_rank.begin(), bytes_per_rank.end());
    size_t total = 0;
    for (size_t c : counts) total += c;
    if (total == 0) return;
    gloo::AllgathervOptions opts(context_);
    opts.setTimeout(timeout_);
    // Gloo wants a non-null input even for an empty contribution.
    char dummy = 0;
    opts.setInput(counts[rank_] ? static_cast<char*>(const_cast<void*>(input)) : &dummy, counts[rank_]);
    opts.setOutput(static_cast<char*>(output), counts);
    gloo::allgatherv(opts);
  }

  void Broadcast(const BroadcastOptions& options) override {
    BroadcastRaw(options.buffer, options.bytes, options.root);
  }

  void Alltoall(const AlltoallOptions& options) override {
    const void* input = options.input;
    void* output = options.output;
    const std::vector<int64_t>& send_bytes = options.send_bytes;
    const std::vector<int64_t>& recv_bytes = options.recv_bytes;
    int64_t total_send = 0, total_recv = 0;
    for (int64_t b : send_bytes) total_send += b;
    for (int64_t b : recv_bytes) total_recv += b;
    if (size_ == 1) {
      if (total_send > 0) std::memcpy(output, input, send_bytes[0]);
      return;
    }
    // Gloo wants real buffers even where nothing moves.
    char dummy_in = 0, dummy_out = 0;
    gloo::AlltoallvOptions opts(context_);
    opts.setTimeout(timeout_);
    opts.setInput(total_send ? static_cast<char*>(const_cast<void*>(input)) : &dummy_in, send_bytes);
    opts.setOutput(total_recv ? static_cast<char*>(output) : &dummy_out, recv_bytes);
    gloo::alltoallv(opts);
  }

  // Gloo has no reduce-scatter of its own: a full allreduce, which leaves every rank's part (and
  // the rest) reduced.
  void Reducescatter(const ReducescatterOptions& options) override {
    AllreduceRaw(options.buffer, options.count, options.dtype, options.op);
  }

  std::unique_ptr<Communicator> Split(const std::vector<int>& ranks, const BackendOptions& options) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    BackendOptions child = options;
    child.rank = static_cast<int>(it - ranks.begin());
    child.size = static_cast<int>(ranks.size());
    child.local_channel = false;  // the global mesh's channels only (kChannelMaxLocalRanks)
    return std::make_unique<GlooBackend>(child, device_);
  }

  void SendRecv(const SendRecvOptions& options) override {
    const int peer = options.peer;
    const int64_t send_bytes = options.send_bytes, recv_bytes = options.recv_bytes;
    auto slot = gloo::Slot::build(kPeerSlotPrefix, 0);
    std::unique_ptr<gloo::transport::UnboundBuffer> out, in;
    if (recv_bytes > 0) {
      in = context_->createUnboundBuffer(options.recv, static_cast<size_t>(recv_bytes));
      in->recv(peer, slot);
    }
    if (send_bytes > 0) {
      out = context_->createUnboundBuffer(const_cast<void*>(options.send), static_cast<size_t>(send_bytes));
      out->send(peer, slot);
    }
    if (out && !out->waitSend(timeout_)) throw std::runtime_error("timed out sending to rank " + std::to_string(peer));
    if (in && !in->waitRecv(timeout_)) throw std::runtime_error("timed out receiving from rank " + std::to_string(peer));
  }

  void Barrier() override {
    if (size_ == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  }

 private:
  void AllreduceRaw(void* buffer, int64_t count, DataType dtype, ReduceOp op) {
    if (size_ > 1 && count > 0) sync_->Allreduce(buffer, count, dtype, op);
  }

  void BroadcastRaw(void* buffer, int64_t num_bytes, int root) {
    if (size_ > 1 && num_bytes > 0) sync_->Broadcast(buffer, num_bytes, root);
  }

  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<SyncMesh> sync_;  // null when size_ == 1
};

const bool kRegistered = BackendRegistry::Register(
    "gloo", [](const BackendOptions& options) { return std::make_unique<GlooBackend>(options); });

}  // namespace
}  // namespace horovod
