// The Gloo backend's algorithms (backends/gloo/allreduce_*.h) over two transports of their Peers
// interface, with ranks as threads: an in-process loopback (unbounded queues) and bare shared-memory
// channels (backends/gloo/shm_channel.h, whose rings hold three of the largest messages, so a
// writer waits on a slow reader as on a full socket). Each runs at 2, 3 and 4 ranks, on 0, 1 and 7
// elements, 4 KiB and 1 MiB + 3 elements, and is compared with the sum computed here; the data are
// small integers, so every order of summation gives the same bits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backends/gloo/allreduce_halving_doubling.h"
#include "backends/gloo/allreduce_one_step.h"
#include "backends/gloo/allreduce_ring.h"
#include "backends/gloo/peers.h"
#include "backends/gloo/shm_channel.h"
#include "test_support.h"

namespace horovod {
namespace {

using gloo_backend::Peers;

// Messages between threads: one queue per ordered pair of ranks.
class LoopbackHub {
 public:
  explicit LoopbackHub(int size) : size_(size), queues_(static_cast<size_t>(size * size)) {}

  void Push(int from, int to, const void* data, size_t bytes) {
    Queue& q = queues_[from * size_ + to];
    const char* begin = static_cast<const char*>(data);
    {
      std::lock_guard<std::mutex> lock(q.mutex);
      q.messages.emplace_back(begin, begin + bytes);
    }
    q.ready.notify_one();
  }

  std::vector<char> Pop(int from, int to) {
    Queue& q = queues_[from * size_ + to];
    std::unique_lock<std::mutex> lock(q.mutex);
    if (!q.ready.wait_for(lock, testing::kRankTimeout, [&] { return !q.messages.empty(); })) {
      throw std::runtime_error("no message from rank " + std::to_string(from) + " to rank " + std::to_string(to));
    }
    std::vector<char> message = std::move(q.messages.front());
    q.messages.pop_front();
    return message;
  }

 private:
  struct Queue {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::vector<char>> messages;
  };
  int size_;
  std::vector<Queue> queues_;
};

class LoopbackPeers : public Peers {
 public:
  LoopbackPeers(LoopbackHub& hub, int rank, int size) : hub_(hub), rank_(rank), size_(size), held_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Send(int peer, const void* data, size_t bytes) override { hub_.Push(rank_, peer, data, bytes); }
  const char* Recv(int peer, size_t bytes) override {
    held_[peer] = hub_.Pop(peer, rank_);
    if (held_[peer].size() != bytes) {
      throw std::runtime_error("rank " + std::to_string(peer) + " sent " + std::to_string(held_[peer].size()) +
                               " bytes where " + std::to_string(bytes) + " were expected");
    }
    return held_[peer].data();
  }
  void RecvInto(int peer, void* into, size_t bytes) override { std::memcpy(into, Recv(peer, bytes), bytes); }

 private:
  LoopbackHub& hub_;
  int rank_, size_;
  std::vector<std::vector<char>> held_;  // each peer's last message, valid until its next
};

class ChannelPeers : public Peers {
 public:
  ChannelPeers(int rank, int size) : rank_(rank), size_(size), channels_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Send(int peer, const void* data, size_t bytes) override { channels_[peer]->Send(data, bytes); }
  const char* Recv(int peer, size_t bytes) override { return channels_[peer]->Recv(bytes); }
  void RecvInto(int peer, void* into, size_t bytes) override {
    std::memcpy(into, channels_[peer]->Recv(bytes), bytes);
    channels_[peer]->Release();
  }
  std::vector<std::unique_ptr<gloo_backend::ShmChannel>>& channels() { return channels_; }

 private:
  int rank_, size_;
  std::vector<std::unique_ptr<gloo_backend::ShmChannel>> channels_;
};

// Every rank's Peers over `transport` ("loopback" or "channel").
std::vector<std::unique_ptr<Peers>> MakePeers(const std::string& transport, int size,
                                              std::unique_ptr<LoopbackHub>& hub) {
  std::vector<std::unique_ptr<Peers>> peers;
  if (transport == "loopback") {
    hub = std::make_unique<LoopbackHub>(size);
    for (int r = 0; r < size; ++r) peers.push_back(std::make_unique<LoopbackPeers>(*hub, r, size));
    return peers;
  }
  std::vector<ChannelPeers*> ends;
  for (int r = 0; r < size; ++r) {
    auto p = std::make_unique<ChannelPeers>(r, size);
    ends.push_back(p.get());
    peers.push_back(std::move(p));
  }
  for (int a = 0; a < size; ++a) {
    for (int b = a + 1; b < size; ++b) {
      std::string name;
      SharedSegment created = gloo_backend::ShmChannel::CreateSegment(&name);
      if (!created) throw std::runtime_error("no shared-memory segment for a channel");
      SharedSegment opened = gloo_backend::ShmChannel::OpenSegment(name);
      SharedSegment::Unlink(name);
      if (!opened) throw std::runtime_error("could not map the channel's segment " + name);
      auto waiting = [&](int peer) {
        return gloo_backend::ChannelWaiting{std::chrono::microseconds(0), false, testing::kRankTimeout, peer,
                                            ::getpid(), "localhost"};
      };
      ends[a]->channels()[b] = std::make_unique<gloo_backend::ShmChannel>(std::move(created), 0, waiting(b));
      ends[b]->channels()[a] = std::make_unique<gloo_backend::ShmChannel>(std::move(opened), 1, waiting(a));
    }
  }
  return peers;
}

const std::vector<int64_t> kCounts{0, 1, 7, 1024, (1 << 18) + 3};  // floats: 4 KiB, 1 MiB + 3

float Value(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 101); }

float Sum(int size, int64_t i) {
  float sum = 0;
  for (int r = 0; r < size; ++r) sum += Value(r, i);
  return sum;
}

class GlooAlgorithms : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  // Runs `allreduce` on every rank's data, for every count, and checks every element on every rank.
  void CheckAllreduce(const std::function<void(Peers&, char*, int64_t)>& allreduce) {
    const int size = std::get<1>(GetParam());
    std::unique_ptr<LoopbackHub> hub;
    auto peers = MakePeers(std::get<0>(GetParam()), size, hub);
    for (int64_t count : kCounts) {
      SCOPED_TRACE("count " + std::to_string(count));
      std::vector<std::vector<float>> data(size, std::vector<float>(count));
      testing::RunRanks(size, [&](int rank) {
        for (int64_t i = 0; i < count; ++i) data[rank][i] = Value(rank, i);
        allreduce(*peers[rank], reinterpret_cast<char*>(data[rank].data()), count);
      });
      for (int rank = 0; rank < size; ++rank) {
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(data[rank][i], Sum(size, i)) << "rank " << rank << " at " << i;
      }
    }
  }
};

TEST_P(GlooAlgorithms, OneStep) {
  std::vector<std::vector<char>> scratch(4);
  CheckAllreduce([&](Peers& peers, char* data, int64_t count) {
    gloo_backend::OneStepAllreduce(peers, data, count, DataType::FLOAT32, ReduceOp::SUM, scratch[peers.rank()]);
  });
}

TEST_P(GlooAlgorithms, Ring) {
  CheckAllreduce([](Peers& peers, char* data, int64_t count) {
    gloo_backend::RingAllreduce(peers, data, count, DataType::FLOAT32, ReduceOp::SUM);
  });
}

TEST_P(GlooAlgorithms, HalvingDoubling) {
  const int size = std::get<1>(GetParam());
  if ((size & (size - 1)) != 0) {
    std::unique_ptr<LoopbackHub> hub;
    auto peers = MakePeers(std::get<0>(GetParam()), size, hub);
    float x = 1;
    EXPECT_THROW(gloo_backend::HalvingDoublingAllreduce(*peers[0], reinterpret_cast<char*>(&x), 1, DataType::FLOAT32,
                                                        ReduceOp::SUM),
                 std::logic_error);
    return;
  }
  CheckAllreduce([](Peers& peers, char* data, int64_t count) {
    gloo_backend::HalvingDoublingAllreduce(peers, data, count, DataType::FLOAT32, ReduceOp::SUM);
  });
}

// The ring's reduce-scatter phase, with the engine's split (the first count % size ranks one
// element more; ranks beyond the count none): each rank's block holds the sum.
TEST_P(GlooAlgorithms, RingReduceScatter) {
  const int size = std::get<1>(GetParam());
  std::unique_ptr<LoopbackHub> hub;
  auto peers = MakePeers(std::get<0>(GetParam()), size, hub);
  for (int64_t count : kCounts) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<int64_t> counts(size), offsets(size + 1, 0);
    for (int r = 0; r < size; ++r) {
      counts[r] = count / size + (r < count % size ? 1 : 0);
      offsets[r + 1] = offsets[r] + counts[r];
    }
    std::vector<std::vector<float>> data(size, std::vector<float>(count));
    testing::RunRanks(size, [&](int rank) {
      for (int64_t i = 0; i < count; ++i) data[rank][i] = Value(rank, i);
      gloo_backend::RingReduceScatter(*peers[rank], reinterpret_cast<char*>(data[rank].data()), counts,
                                      DataType::FLOAT32, ReduceOp::SUM);
    });
    for (int rank = 0; rank < size; ++rank) {
      for (int64_t i = offsets[rank]; i < offsets[rank + 1]; ++i) {
        ASSERT_EQ(data[rank][i], Sum(size, i)) << "rank " << rank << " at " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, GlooAlgorithms,
                         ::testing::Combine(::testing::Values("loopback", "channel"), ::testing::Values(2, 3, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_np" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace horovod
