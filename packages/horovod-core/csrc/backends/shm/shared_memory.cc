#include "backends/shm/shared_memory.h"

#include <sys/prctl.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "backends/shm/futex_counter.h"
#include "backends/shm/segment.h"
#include "common/liveness.h"
#include "common/logging.h"
#include "common/reduction.h"

namespace horovod {

namespace {

// Bytes of one rank's slot in each half of the segment: the largest piece of an operation that
// moves in one step. Larger operations are pipelined in steps of this size.
constexpr int64_t kSlotBytes = 1 << 20;
// Allreduce pieces up to this size are reduced whole by every rank (one step); larger ones are
// split so that each rank reduces 1/n of the piece (two steps, n times less reduction work).
constexpr int64_t kWholeReduceBytes = 64 << 10;
// Pieces of the single-copy allreduce read from a peer at a time (kept in cache while reduced).
constexpr int64_t kCopyChunkBytes = 256 << 10;
// Pieces read from a peer with one process_vm_readv (the kernel's limit on its vectors, IOV_MAX).
constexpr size_t kMaxIov = 1024;
// How long a waiting rank polls a peer's counter (yielding the core between polls) before sleeping
// on the futex.
constexpr auto kSpin = std::chrono::microseconds(20);
constexpr uint64_t kMagic = 0x484f524f564f4453ull;  // "HOROVODS"

// One rank's counters, alone in their cache lines (two, against adjacent-line prefetching).
struct alignas(128) RankCounters {
  std::atomic<uint32_t> step;     // steps this rank has signalled (wraps around)
  std::atomic<uint32_t> waiters;  // ranks sleeping on `step`
  std::atomic<uint32_t> closed;   // set when this rank's backend is destroyed,
  std::atomic<uint32_t> final_step;  // after storing the last step it really signalled
};

struct Header {
  uint64_t magic;
  int64_t size;
  int64_t slot_bytes;
};

size_t HeaderBytes(int size) {
  return (sizeof(Header) + 127) / 128 * 128 + sizeof(RankCounters) * static_cast<size_t>(size);
}

size_t SegmentBytes(int size) {
  return (HeaderBytes(size) + 4095) / 4096 * 4096 + 2 * static_cast<size_t>(size) * kSlotBytes;
}

class SharedMemoryBackend : public ForwardingCommunicator {
 public:
  SharedMemoryBackend(std::unique_ptr<Communicator> inner, SharedSegment segment, std::vector<int64_t> pids,
                      std::chrono::milliseconds timeout)
      : ForwardingCommunicator(std::move(inner)),
        segment_(std::move(segment)),
        base_(segment_.base()),
        pids_(std::move(pids)),
        timeout_(timeout) {
    counters_ = reinterpret_cast<RankCounters*>(base_ + (sizeof(Header) + 127) / 128 * 128);
    data_ = base_ + (HeaderBytes(size_) + 4095) / 4096 * 4096;
    // Spinning only helps when every rank has a core of its own.
    spin_ = static_cast<unsigned>(size_) <= std::max(1u, std::thread::hardware_concurrency());
  }

  ~SharedMemoryBackend() override {
    RankCounters& mine = counters_[rank_];
    mine.final_step.store(step_, std::memory_order_seq_cst);
    mine.closed.store(1, std::memory_order_seq_cst);
    // Wake peers sleeping on this rank: they see `closed` and fail instead of waiting forever.
    mine.step.fetch_add(1, std::memory_order_seq_cst);
    WakeAll(mine.step);
  }

  std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root) override {
    std::vector<std::vector<char>> out(size_);
    ExchangeBytes(data, [&](int) { return rank_ == root; }, [&](int r) -> std::vector<char>& { return out[r]; });
    return out;
  }

  void BroadcastBytes(std::vector<char>& data, int root) override {
    static const std::vector<char> kNothing;
    std::vector<char> received;
    ExchangeBytes(rank_ == root ? data : kNothing, [&](int r) { return r == root && rank_ != root; },
                  [&](int) -> std::vector<char>& { return received; });
    if (rank_ != root) data.swap(received);
  }

  void AllreduceBitsAnd(std::vector<uint64_t>& words) override {
    const int64_t per_step = kSlotBytes / static_cast<int64_t>(sizeof(uint64_t));
    const int64_t total = static_cast<int64_t>(words.size());
    for (int64_t offset = 0; offset < total; offset += per_step) {
      const int64_t n = std::min(per_step, total - offset);
      std::memcpy(Slot(rank_), words.data() + offset, static_cast<size_t>(n) * sizeof(uint64_t));
      Step();
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        const uint64_t* theirs = reinterpret_cast<const uint64_t*>(PreviousSlot(r));
        for (int64_t i = 0; i < n; ++i) words[offset + i] &= theirs[i];
      }
    }
  }

  // Collective: whether every rank can read every other rank's memory (process_vm_readv); on
  // success the large allreduces use it from now on.
  bool EnableSingleCopy(bool wanted) {
    // Under Yama's ptrace_scope=1 only a process's ancestors may read it unless it says otherwise.
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    // Written by the peers with the value it holds already (the large allreduces write their
    // results into the peers' outputs).
    probe_ = kMagic;
    const uintptr_t address = reinterpret_cast<uintptr_t>(&probe_);
    std::memcpy(Slot(rank_), &address, sizeof(address));
    Step();
    std::vector<uint64_t> ok{wanted ? 1u : 0u};
    for (int r = 0; r < size_ && ok[0]; ++r) {
      if (r == rank_) continue;
      uintptr_t theirs = 0;
      std::memcpy(&theirs, PreviousSlot(r), sizeof(theirs));
      uint64_t value = 0;
      iovec local{&value, sizeof(value)}, remote{reinterpret_cast<void*>(theirs), sizeof(value)};
      if (process_vm_readv(static_cast<pid_t>(pids_[r]), &local, 1, &remote, 1, 0) != sizeof(value) ||
          value != kMagic || process_vm_writev(static_cast<pid_t>(pids_[r]), &local, 1, &remote, 1, 0) != sizeof(value)) {
        ok[0] = 0;
      }
    }
    AllreduceBitsAnd(ok);
    single_copy_ = ok[0] != 0;
    if (single_copy_) {
      fold_.resize(kCopyChunkBytes);
      incoming_.resize(kCopyChunkBytes);
    }
    return single_copy_;
  }

  void Allreduce(const AllreduceOptions& options) override {
    void* buffer = options.buffer;
    const int64_t count = options.count;
    const DataType dtype = options.dtype;
    const ReduceOp op = options.op;
    const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
    if (SupportsPieces(count * element, 1)) return AllreducePieces({{{buffer, buffer, count}}, dtype, op, 1.0});
    const int64_t per_step = kSlotBytes / element;
    char* out = static_cast<char*>(buffer);
    for (int64_t offset = 0; offset < count; offset += per_step) {
      const int64_t n = std::min(per_step, count - offset);
      char* piece = out + offset * element;
      std::memcpy(Slot(rank_), piece, static_cast<size_t>(n * element));
      Step();
      if (n * element <= kWholeReduceBytes) {
        // Every rank reduces the whole piece, in rank order, so the results agree bit for bit.
        Reduce(piece, PreviousSlot(0), PreviousSlot(1), n, dtype, op);
        for (int r = 2; r < size_; ++r) Reduce(piece, piece, PreviousSlot(r), n, dtype, op);
        continue;
      }
      // Rank r reduces elements [Bound(r), Bound(r + 1)) of the piece into its own slot, where
      // no other rank reads them during this step; a second step publishes the results.
      const int64_t lo = Bound(rank_, n, element), hi = Bound(rank_ + 1, n, element);
      char* own = PreviousSlot(rank_) + lo * element;
      if (hi > lo) {
        // Ranks 0 and 1 fold in their own slot; a later rank's slot is still an operand then, so
        // it folds in its output buffer (rewritten when the results are published) and copies.
        char* fold = rank_ < 2 ? own : piece + lo * element;
        Reduce(fold, PreviousSlot(0) + lo * element, PreviousSlot(1) + lo * element, hi - lo, dtype, op);
        for (int r = 2; r < size_; ++r) Reduce(fold, fold, PreviousSlot(r) + lo * element, hi - lo, dtype, op);
        if (fold != own) std::memcpy(own, fold, static_cast<size_t>((hi - lo) * element));
      }
      Synchronize();
      for (int r = 0; r < size_; ++r) {
        const int64_t a = Bound(r, n, element), b = Bound(r + 1, n, element);
        if (b > a) std::memcpy(piece + a * element, PreviousSlot(r) + a * element, static_cast<size_t>((b - a) * element));
      }
    }
  }

  void Allgather(const AllgatherOptions& options) override {
    const std::vector<int64_t>& bytes_per_rank = options.bytes_per_rank;
    int64_t longest = 0;
    std::vector<int64_t> offsets(size_ + 1, 0);
    for (int r = 0; r < size_; ++r) {
      longest = std::max(longest, bytes_per_rank[r]);
      offsets[r + 1] = offsets[r] + bytes_per_rank[r];
    }
    const char* in = static_cast<const char*>(options.input);
    char* out = static_cast<char*>(options.output);
    for (int64_t done = 0; done < longest; done += kSlotBytes) {
      const int64_t mine = std::clamp<int64_t>(bytes_per_rank[rank_] - done, 0, kSlotBytes);
      if (mine > 0) std::memcpy(Slot(rank_), in + done, static_cast<size_t>(mine));
      Step();
      for (int r = 0; r < size_; ++r) {
        const int64_t theirs = std::clamp<int64_t>(bytes_per_rank[r] - done, 0, kSlotBytes);
        if (theirs > 0) std::memcpy(out + offsets[r] + done, PreviousSlot(r), static_cast<size_t>(theirs));
      }
    }
  }

  void Broadcast(const BroadcastOptions& options) override {
    const int64_t num_bytes = options.bytes;
    const int root = options.root;
    char* data = static_cast<char*>(options.buffer);
    for (int64_t done = 0; done < num_bytes; done += kSlotBytes) {
      const int64_t n = std::min(kSlotBytes, num_bytes - done);
      if (rank_ == root) std::memcpy(Slot(rank_), data + done, static_cast<size_t>(n));
      Step();
      if (rank_ != root) std::memcpy(data + done, PreviousSlot(root), static_cast<size_t>(n));
    }
  }

  void Barrier() override { Step(); }

  // bfloat16 accumulated in float32 (collectives/float32_accumulation.h): the float32 allreduce
  // above (every element reduced in rank order on one rank, the same bits on every rank), then
  // every rank rounds once. The reduce-scatter the caller would run instead goes to the inner
  // backend (TCP over loopback): this keeps the whole allreduce in shared memory.
  bool AllreduceBfloat16InFloat32(uint16_t* buffer, int64_t count, ReduceOp op, float prescale,
                                  float postscale) override {
    float* wide = wide_.Widen(buffer, count, prescale);
    Allreduce({wide, count, DataType::FLOAT32, op});
    NarrowToBfloat16(wide, count, postscale, buffer);
    return true;
  }

 private:

  // Share of rank r in an operation over n elements of `element` bytes: [Bound(r), Bound(r + 1)),
  // boundaries aligned to 64 bytes.
  int64_t Bound(int r, int64_t n, int64_t element) const {
    const int64_t align = std::max<int64_t>(1, 64 / element);
    return std::min(n, (n * r / size_ + align - 1) / align * align);
  }

  // Two steps: publish where every piece's input and output are; then each rank folds its share
  // of the elements (of the pieces laid end to end) from every rank's inputs, in rank order (so
  // every rank's result is the same bit for bit), into its own outputs, and writes each run of the
  // result, while it is still in cache, into every peer's outputs. Every rank's pieces have the
  // same sizes (they were negotiated), so a range of elements splits into the same runs of bytes
  // on every rank. The last step keeps every rank's memory untouched by the others after it.
  // In-place pieces are safe: share r of a rank's memory is read and written only by rank r (and
  // read before it is written), while the rank itself reads and writes only its own share.
  void AllreducePieces(const AllreducePiecesOptions& options) override {
    const std::vector<Piece>& pieces = options.pieces;
    const DataType dtype = options.dtype;
    const ReduceOp op = options.op;
    const double postscale = options.scale;
    const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
    const size_t np = pieces.size();
    starts_.assign(np + 1, 0);
    for (size_t i = 0; i < np; ++i) starts_[i + 1] = starts_[i] + pieces[i].count;
    const int64_t count = starts_[np];
    uintptr_t* published = reinterpret_cast<uintptr_t*>(Slot(rank_));
    for (size_t i = 0; i < np; ++i) {
      published[2 * i] = reinterpret_cast<uintptr_t>(pieces[i].input);
      published[2 * i + 1] = reinterpret_cast<uintptr_t>(pieces[i].output);
    }
    Step();
    addresses_.resize(size_);
    for (int r = 0; r < size_; ++r) {
      const uintptr_t* theirs = reinterpret_cast<const uintptr_t*>(PreviousSlot(r));
      addresses_[r].assign(theirs, theirs + 2 * np);
    }
    const int64_t lo = Bound(rank_, count, element), hi = Bound(rank_ + 1, count, element);
    const int64_t chunk = kCopyChunkBytes / element;
    for (int64_t a = lo; a < hi;) {
      // A run of at most `chunk` elements and kMaxIov pieces.
      const size_t first = PieceAt(a);
      int64_t b = std::min(hi, a + chunk);
      b = std::min(b, starts_[std::min(np, first + kMaxIov)]);
      // The running result: rank 0's operand, then folded with each later rank's in turn; the
      // last fold writes the outputs. The peers' operands and the running result are contiguous
      // (fold_, incoming_: element e of the run at offset e - a); this rank's own operand and
      // the outputs are reduced piece by piece where they lie, so a run over many pieces (a
      // fused group of small tensors) is neither gathered nor scattered through a buffer.
      if (rank_ != 0) ReadPeer(0, a, b, element, fold_.data());
      for (int r = 1; r < size_; ++r) {
        if (r != rank_) ReadPeer(r, a, b, element, incoming_.data());
        const bool last = r == size_ - 1;
        for (size_t i = first; i < np && starts_[i] < b; ++i) {
          const int64_t from = std::max(a, starts_[i]), to = std::min(b, starts_[i + 1]);
          if (to <= from) continue;
          const int64_t in_piece = (from - starts_[i]) * element, in_run = (from - a) * element;
          const char* own_in = static_cast<const char*>(pieces[i].input) + in_piece;
          char* fold = fold_.data() + in_run;
          const char* acc = (r == 1 && rank_ == 0) ? own_in : fold;
          const char* operand = r == rank_ ? own_in : incoming_.data() + in_run;
          char* dst = last ? static_cast<char*>(pieces[i].output) + in_piece : fold;
          Reduce(dst, acc, operand, to - from, dtype, op);
          if (last && postscale != 1.0) Scale(dst, to - from, dtype, postscale);
        }
      }
      // The run's result, still in cache, into every peer's outputs.
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) WritePeer(r, a, b, element);
      }
      a = b;
    }
    Step();
  }

  bool SupportsPieces(int64_t bytes, size_t num_pieces) const override {
    // Small groups are cheaper through the segment (no system calls); the addresses must fit a slot.
    return single_copy_ && bytes > kWholeReduceBytes && num_pieces * 2 * sizeof(uintptr_t) <= kSlotBytes;
  }

  // The piece holding element `e` of the pieces laid end to end.
  size_t PieceAt(int64_t e) const {
    return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), e) - starts_.begin()) - 1;
  }

  // The runs of bytes that elements [a, b) occupy in the pieces at `addresses` (input and output
  // address of each piece, alternately; `output` picks which), appended to `runs`.
  void Runs(const uintptr_t* addresses, int64_t a, int64_t b, int64_t element, bool output,
            std::vector<iovec>& runs) const {
    for (size_t i = PieceAt(a); a < b; ++i) {
      const int64_t end = std::min(b, starts_[i + 1]);
      if (end > a) {
        runs.push_back({reinterpret_cast<void*>(addresses[2 * i + (output ? 1 : 0)] + (a - starts_[i]) * element),
                        static_cast<size_t>((end - a) * element)});
      }
      a = end;
    }
  }

  // Copies elements [a, b) of rank r's inputs into `into`. At most kMaxIov pieces.
  void ReadPeer(int r, int64_t a, int64_t b, int64_t element, char* into) {
    remote_.clear();
    Runs(addresses_[r].data(), a, b, element, /*output=*/false, remote_);
    local_.clear();
    local_.push_back({into, static_cast<size_t>((b - a) * element)});
    Transfer(r, (b - a) * element, /*write=*/false);
  }

  // Copies elements [a, b) of this rank's outputs into the same elements of rank r's outputs.
  void WritePeer(int r, int64_t a, int64_t b, int64_t element) {
    remote_.clear();
    Runs(addresses_[r].data(), a, b, element, /*output=*/true, remote_);
    local_.clear();
    Runs(addresses_[rank_].data(), a, b, element, /*output=*/true, local_);
    Transfer(r, (b - a) * element, /*write=*/true);
  }

  // Moves `bytes` between local_ and rank r's remote_ (process_vm_readv or process_vm_writev).
  void Transfer(int r, int64_t bytes, bool write) {
    size_t left = static_cast<size_t>(bytes);
    iovec* l = local_.data();
    iovec* rm = remote_.data();
    size_t nl = local_.size(), nr = remote_.size();
    while (left > 0) {
      const pid_t pid = static_cast<pid_t>(pids_[r]);
      const ssize_t n = write ? process_vm_writev(pid, l, nl, rm, nr, 0) : process_vm_readv(pid, l, nl, rm, nr, 0);
      if (n <= 0) {
        throw std::runtime_error(std::string("shared memory: ") + (write ? "writing" : "reading") +
                                 " the memory of rank " + std::to_string(r) + " (pid " + std::to_string(pids_[r]) +
                                 ") failed: " + std::strerror(n < 0 ? errno : EIO));
      }
      // A partial transfer (the kernel stops at a page it cannot pin): continue after it.
      left -= static_cast<size_t>(n);
      Advance(l, nl, static_cast<size_t>(n));
      Advance(rm, nr, static_cast<size_t>(n));
    }
  }

  static void Advance(iovec*& v, size_t& count, size_t bytes) {
    while (count > 0 && bytes >= v->iov_len) {
      bytes -= v->iov_len;
      ++v;
      --count;
    }
    if (count > 0) {
      v->iov_base = static_cast<char*>(v->iov_base) + bytes;
      v->iov_len -= bytes;
    }
  }

  char* HalfSlot(int half, int r) const {
    return data_ + (static_cast<size_t>(half) * size_ + static_cast<size_t>(r)) * kSlotBytes;
  }
  // The slot of rank r in the half the current step writes, and in the half the step just
  // completed wrote.
  char* Slot(int r) const { return HalfSlot(half_, r); }
  char* PreviousSlot(int r) const { return HalfSlot(half_ ^ 1, r); }

  // One step: publish what this rank wrote into its current slot, wait until every rank has
  // done the same, and switch halves (the data just published is then in PreviousSlot).
  // A rank writes a half again only two steps later, after every rank has signalled the step in
  // between, which each signals only after reading what it needed from this one.
  void Step() {
    Synchronize();
    half_ ^= 1;
  }

  // Signals a step and waits for every rank's, without switching halves: inside an allreduce
  // piece, between folding into the previous half and reading the results from it. Safe because
  // such a step writes nothing into the current half.
  void Synchronize() {
    Signal();
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) WaitFor(r, step_);
    }
  }

  void Signal() {
    RankCounters& mine = counters_[rank_];
    Publish(mine.step, mine.waiters, ++step_);
  }

  void WaitFor(int r, uint32_t target) {
    RankCounters& theirs = counters_[r];
    const auto spin = spin_ ? kSpin : std::chrono::microseconds(0);
    AwaitCounter(theirs.step, theirs.waiters, target, spin, false, [&](std::chrono::steady_clock::time_point start) {
      if (ProcessGone(pids_[r])) {
        throw std::runtime_error("shared memory: rank " + std::to_string(r) + " (pid " + std::to_string(pids_[r]) +
                                 ") exited while this rank waited for it");
      }
      if (timeout_.count() > 0 && std::chrono::steady_clock::now() - start > timeout_) {
        throw std::runtime_error("shared memory: rank " + std::to_string(r) + " did not reach step " +
                                 std::to_string(target) + " within " + std::to_string(timeout_.count()) + " ms");
      }
    });
    Check(r, target);
  }

  // Called once rank r's counter has reached `target`: a peer whose backend is gone (its engine
  // stopped, on an error or at shutdown) advanced its counter only to wake this rank, unless it
  // really signalled `target` before closing.
  void Check(int r, uint32_t target) {
    const RankCounters& theirs = counters_[r];
    if (theirs.closed.load(std::memory_order_acquire) != 0 &&
        !Reached(theirs.final_step.load(std::memory_order_acquire), target)) {
      throw std::runtime_error("shared memory: rank " + std::to_string(r) + " (pid " + std::to_string(pids_[r]) +
                               ") stopped its Horovod engine");
    }
  }

  // Moves byte strings of any length through the slots: each step carries [total length | next
  // piece] from every rank; `wanted(r)` says whether this rank keeps rank r's bytes, appended to
  // `into(r)`. Steps continue until the longest string has been carried (every rank reads every
  // length, so all agree on the number of steps).
  template <typename Wanted, typename Into>
  void ExchangeBytes(const std::vector<char>& data, Wanted wanted, Into into) {
    constexpr int64_t kHeader = sizeof(uint64_t);
    const int64_t piece = kSlotBytes - kHeader;
    const int64_t mine = static_cast<int64_t>(data.size());
    int64_t longest = 0;
    for (int64_t done = 0; done == 0 || done < longest; done += piece) {
      char* slot = Slot(rank_);
      const uint64_t length = static_cast<uint64_t>(mine);
      std::memcpy(slot, &length, kHeader);
      const int64_t n = std::clamp<int64_t>(mine - done, 0, piece);
      if (n > 0) std::memcpy(slot + kHeader, data.data() + done, static_cast<size_t>(n));
      Step();
      for (int r = 0; r < size_; ++r) {
        const char* theirs = PreviousSlot(r);
        uint64_t total = 0;
        std::memcpy(&total, theirs, kHeader);
        longest = std::max(longest, static_cast<int64_t>(total));
        if (r == rank_ && done == 0 && wanted(r)) into(r) = data;
        if (r == rank_ || !wanted(r)) continue;
        const int64_t k = std::clamp<int64_t>(static_cast<int64_t>(total) - done, 0, piece);
        std::vector<char>& dest = into(r);
        dest.insert(dest.end(), theirs + kHeader, theirs + kHeader + k);
      }
      if (longest <= piece) break;
    }
  }

  SharedSegment segment_;  // unmapped after the destructor's body has told the peers
  char* base_;
  std::vector<int64_t> pids_;
  std::chrono::milliseconds timeout_;
  RankCounters* counters_ = nullptr;
  char* data_ = nullptr;
  uint32_t step_ = 0;
  int half_ = 0;
  bool spin_ = true;
  uint64_t probe_ = 0;  // EnableSingleCopy's probe, read and written by the peers
  bool single_copy_ = false;
  // Single-copy allreduce: the running result and a peer's operand (kCopyChunkBytes each); where
  // each piece starts (in elements of the pieces laid end to end); every rank's piece addresses;
  // the vectors of one process_vm_readv.
  std::vector<char> fold_, incoming_;
  Float32Staging wide_;  // AllreduceBfloat16InFloat32's float32 values
  std::vector<int64_t> starts_;
  std::vector<std::vector<uintptr_t>> addresses_;
  std::vector<iovec> local_, remote_;
};

}  // namespace

std::unique_ptr<Communicator> MakeSharedMemoryBackend(std::unique_ptr<Communicator>& inner,
                                                      const std::vector<int64_t>& pids, const BackendOptions& options,
                                                      bool* single_copy, std::string* why) {
  Communicator& comm = *inner;
  const int size = comm.size();
  const size_t bytes = SegmentBytes(size);
  std::string error;
  std::vector<char> name_bytes;
  SharedSegment segment;
  if (comm.rank() == 0) {
    const std::string text = SharedSegment::UniqueName("/horovod.");
    segment = SharedSegment::Create(text, bytes, &error);
    if (segment) {
      Header* header = reinterpret_cast<Header*>(segment.base());
      std::memset(segment.base(), 0, HeaderBytes(size));
      header->size = size;
      header->slot_bytes = kSlotBytes;
      header->magic = kMagic;
      name_bytes.assign(text.begin(), text.end());
    }
  }
  comm.BroadcastBytes(name_bytes, 0);
  const std::string name(name_bytes.begin(), name_bytes.end());
  if (comm.rank() != 0 && !name.empty()) {
    segment = SharedSegment::Open(name, bytes, &error);
    if (segment) {
      const Header* header = reinterpret_cast<const Header*>(segment.base());
      if (header->magic != kMagic || header->size != size || header->slot_bytes != kSlotBytes) {
        error = "the segment " + name + " does not match this job";
      }
    }
  } else if (name.empty() && error.empty()) {
    error = "rank 0 could not create the segment";
  }
  // Every rank must attach, or none uses the segment.
  std::vector<uint64_t> ok{error.empty() ? 1u : 0u};
  comm.AllreduceBitsAnd(ok);
  if (comm.rank() == 0 && !name.empty()) SharedSegment::Unlink(name);  // every rank has it mapped, or gave up
  if (ok[0] == 0) {
    *why = error.empty() ? "another rank could not attach the shared memory segment" : error;
    return nullptr;
  }
  auto backend = std::make_unique<SharedMemoryBackend>(std::move(inner), std::move(segment), pids, options.timeout);
  const bool wanted = *single_copy;
  *single_copy = backend->EnableSingleCopy(wanted);
  if (wanted && !*single_copy) {
    HVD_LOG(DEBUG) << "shared memory: ranks cannot read each other's memory (process_vm_readv); large allreduces "
                   << "go through the segment";
  }
  return backend;
}

}  // namespace horovod
