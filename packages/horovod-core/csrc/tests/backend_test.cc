// The communicator interface itself (csrc/backends/communicator.h), on Gloo over loopback and on the
// shared-memory transport wrapping it, with ranks as threads: the control-plane primitives the
// controller negotiates with, and the edge cases of the data collectives (empty contributions,
// uneven splits) that the engine-level tests reach less directly.
#include <gtest/gtest.h>

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>

#include "test_support.h"

namespace horovod {
namespace {

using testing::RunBackends;

class Backends : public ::testing::TestWithParam<std::tuple<bool, int>> {
 protected:
  bool shared_memory() const { return std::get<0>(GetParam()); }
  int size() const { return std::get<1>(GetParam()); }
};

TEST_P(Backends, ControlPlane) {
  const int n = size();
  RunBackends(n, shared_memory(), [&](int rank, Communicator& backend) {
    ASSERT_EQ(backend.rank(), rank);
    ASSERT_EQ(backend.size(), n);
    for (int root = 0; root < n; ++root) {
      // Gatherv of a different length from each rank (rank 0: nothing at all).
      std::vector<char> mine(rank * 1000 + root, static_cast<char>('a' + rank));
      auto gathered = backend.Gatherv(mine, root);
      if (rank == root) {
        ASSERT_EQ(gathered.size(), static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(gathered[r], std::vector<char>(r * 1000 + root, static_cast<char>('a' + r))) << "from " << r;
        }
      } else {
        // Nothing elsewhere: Gloo returns no list, shared memory a list of empty ones.
        for (const auto& bytes : gathered) EXPECT_TRUE(bytes.empty());
      }
      std::vector<char> bytes;
      if (rank == root) bytes.assign(70000 + root, static_cast<char>(root));
      backend.BroadcastBytes(bytes, root);
      EXPECT_EQ(bytes, std::vector<char>(70000 + root, static_cast<char>(root)));
    }
    // Bitwise AND: bit b of word w survives only where every rank set it.
    std::vector<uint64_t> words(70);
    for (size_t w = 0; w < words.size(); ++w) words[w] = ~(uint64_t{1} << ((w + rank) % 64));
    backend.AllreduceBitsAnd(words);
    for (size_t w = 0; w < words.size(); ++w) {
      uint64_t expected = ~uint64_t{0};
      for (int r = 0; r < n; ++r) expected &= ~(uint64_t{1} << ((w + r) % 64));
      ASSERT_EQ(words[w], expected) << "word " << w;
    }
    backend.Barrier();
  });
}

TEST_P(Backends, AllgathervWithEmptyContributions) {
  const int n = size();
  RunBackends(n, shared_memory(), [&](int rank, Communicator& backend) {
    std::vector<int64_t> bytes_per_rank(n);
    for (int r = 0; r < n; ++r) bytes_per_rank[r] = r % 2 == 0 ? 0 : r * 333;
    std::vector<char> in(bytes_per_rank[rank], static_cast<char>(rank + 1));
    std::vector<char> out(std::accumulate(bytes_per_rank.begin(), bytes_per_rank.end(), int64_t{0}) + 1, 'x');
    backend.Allgather({in.data(), out.data(), bytes_per_rank});
    size_t offset = 0;
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < bytes_per_rank[r]; ++i, ++offset) ASSERT_EQ(out[offset], static_cast<char>(r + 1));
    }
    EXPECT_EQ(out.back(), 'x') << "wrote past the output";
  });
}

TEST_P(Backends, ReducescatterLeavesEachRankItsPart) {
  const int n = size();
  RunBackends(n, shared_memory(), [&](int rank, Communicator& backend) {
    for (int64_t count : {int64_t{1}, int64_t{10}, int64_t{100003}}) {
      std::vector<int64_t> counts(n, count / n);
      for (int r = 0; r < count % n; ++r) ++counts[r];
      std::vector<int32_t> buffer(count);
      for (int64_t i = 0; i < count; ++i) buffer[i] = static_cast<int32_t>(i % 1000 + rank);
      backend.Reducescatter({buffer.data(), count, counts, DataType::INT32, ReduceOp::SUM});
      const int64_t first = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
      for (int64_t i = first; i < first + counts[rank]; ++i) {
        ASSERT_EQ(buffer[i], static_cast<int32_t>(n * (i % 1000) + n * (n - 1) / 2)) << "count " << count << " i " << i;
      }
    }
  });
}

TEST_P(Backends, AlltoallvAndSendRecv) {
  const int n = size();
  RunBackends(n, shared_memory(), [&](int rank, Communicator& backend) {
    // Rank r sends r + to bytes (zero from rank 0 to itself) of value r*16+to.
    std::vector<int64_t> send(n), recv(n);
    for (int to = 0; to < n; ++to) send[to] = rank + to;
    for (int from = 0; from < n; ++from) recv[from] = from + rank;
    std::vector<char> in, out(std::accumulate(recv.begin(), recv.end(), int64_t{0}));
    for (int to = 0; to < n; ++to) in.insert(in.end(), send[to], static_cast<char>(rank * 16 + to));
    backend.Alltoall({in.data(), send, out.data(), recv});
    size_t offset = 0;
    for (int from = 0; from < n; ++from) {
      for (int64_t i = 0; i < recv[from]; ++i, ++offset) ASSERT_EQ(out[offset], static_cast<char>(from * 16 + rank));
    }
    // Pairwise exchange along a ring, sizes that differ per direction.
    const int peer = rank ^ 1;
    if (peer < n) {
      std::vector<char> mine(1000 + rank, static_cast<char>(rank)), theirs(1000 + peer);
      backend.SendRecv({mine.data(), static_cast<int64_t>(mine.size()), theirs.data(),
                        static_cast<int64_t>(theirs.size()), peer});
      EXPECT_EQ(theirs, std::vector<char>(1000 + peer, static_cast<char>(peer)));
    }
    backend.Barrier();
  });
}

// A sub-communicator of some ranks: members get one, the others nullptr, and it works.
TEST_P(Backends, SplitMakesASubCommunicator) {
  const int n = size();
  auto store = std::make_shared<MemoryStore>();
  RunBackends(n, shared_memory(), [&](int rank, Communicator& backend) {
    std::vector<int> members;
    for (int r = 1; r < n; ++r) members.push_back(r);  // everyone but rank 0
    BackendOptions options = testing::LoopbackOptions(rank, n, store.get(), "split/");
    std::unique_ptr<Communicator> sub = backend.Split(members, options);
    if (rank == 0) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->rank(), rank - 1);
    EXPECT_EQ(sub->size(), n - 1);
    std::vector<double> value{static_cast<double>(rank)};
    sub->Allreduce({value.data(), 1, DataType::FLOAT64, ReduceOp::SUM});
    EXPECT_EQ(value[0], n * (n - 1) / 2.0);
  });
}

// The shared-memory transport's single-copy allreduce (AllreducePieces), at two, three and four
// ranks, where each rank reduces its share of the elements from every rank's memory and writes the
// result into every rank's outputs. Pieces of many sizes laid end to end (shares and 256 KiB runs
// that cross piece boundaries, more pieces than one process_vm_readv takes), in place and out of
// place, float32 with a postscale and int64, over several operations in a row: every rank's outputs
// hold the reduction in rank order, bit for bit, and the inputs of the out-of-place pieces are
// untouched.
TEST(SharedMemoryPieces, ReducedInRankOrderIntoEveryRank) {
  for (int n : {2, 3, 4}) {
    RunBackends(n, /*shared_memory=*/true, [&](int rank, Communicator& backend) {
      auto value = [](int r, int64_t piece, int64_t i) {
        return 1.0f / static_cast<float>(3 + (i * 7 + r * 13 + piece * 5) % 101);
      };
      std::vector<int64_t> counts{300001, 1, 65536, 65537, 17};
      for (int i = 0; i < 1500; ++i) counts.push_back(1 + i % 7);  // more than IOV_MAX pieces
      counts.push_back(1 << 20);
      for (int round = 0; round < 3; ++round) {
        std::vector<std::vector<float>> inputs(counts.size()), outputs(counts.size());
        std::vector<Piece> pieces;
        int64_t total = 0;
        for (size_t p = 0; p < counts.size(); ++p) {
          inputs[p].resize(counts[p]);
          for (int64_t i = 0; i < counts[p]; ++i) inputs[p][i] = value(rank, p + round, i);
          const bool in_place = p % 2 == 0;
          if (!in_place) outputs[p].assign(counts[p], -1.0f);
          float* out = in_place ? inputs[p].data() : outputs[p].data();
          pieces.push_back({inputs[p].data(), out, counts[p]});
          total += counts[p];
        }
        ASSERT_TRUE(backend.SupportsPieces(total * 4, pieces.size()));
        backend.AllreducePieces({pieces, DataType::FLOAT32, ReduceOp::SUM, 0.5});
        for (size_t p = 0; p < counts.size(); ++p) {
          const bool in_place = p % 2 == 0;
          const std::vector<float>& result = in_place ? inputs[p] : outputs[p];
          for (int64_t i = 0; i < counts[p]; ++i) {
            float expected = value(0, p + round, i);
            for (int r = 1; r < n; ++r) expected += value(r, p + round, i);
            expected = static_cast<float>(expected * 0.5);
            ASSERT_EQ(std::memcmp(&result[i], &expected, sizeof(float)), 0)
                << "np " << n << " rank " << rank << " round " << round << " piece " << p << " element " << i
                << ": " << result[i] << " != " << expected;
            if (!in_place) ASSERT_EQ(inputs[p][i], value(rank, p + round, i)) << "input of piece " << p << " changed";
          }
        }
      }
      // int64, one piece of 3 MiB and one of 5 elements.
      std::vector<int64_t> big(3 << 17), small(5);
      for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int64_t>(i) * (rank + 1);
      for (size_t i = 0; i < small.size(); ++i) small[i] = rank - static_cast<int64_t>(i);
      backend.AllreducePieces({{{big.data(), big.data(), static_cast<int64_t>(big.size())},
                                {small.data(), small.data(), static_cast<int64_t>(small.size())}},
                               DataType::INT64, ReduceOp::SUM, 1.0});
      const int64_t ranks_sum = n * (n + 1) / 2;
      for (size_t i = 0; i < big.size(); ++i) ASSERT_EQ(big[i], static_cast<int64_t>(i) * ranks_sum) << i;
      for (size_t i = 0; i < small.size(); ++i) {
        ASSERT_EQ(small[i], n * (n - 1) / 2 - n * static_cast<int64_t>(i)) << i;
      }
    });
  }
}

// Gloo's synchronous mesh (backends/gloo/sync_mesh.h), sleeping, polling for 50 us first, polling, and
// sleeping with the ranks (threads of this process, so all on one host) reading each other's data
// by cross-memory attach; then with the messages between them through shared-memory channels
// (with cross-memory attach, without it, and polling; at eight ranks, more than a host may have
// channels, TCP as before): messages of several 128 KiB pieces, messages on both sides of the
// staged/direct limit (4 KiB: 1023 and 1024 floats, a framed message whose last piece is staged),
// and allreduces on both sides of its one-step limit (32 KiB; 64 KiB between two ranks), over
// several rounds, at three ranks through the ring and at four and eight through recursive halving
// and doubling: every rank ends with the same bits, which are those of the reduction in rank
// order, left to right, except in those two.
class GlooSyncMesh : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  // Rank `rank` of `n`'s Gloo backend, waiting the way `waiting` names.
  static std::unique_ptr<Communicator> MakeMesh(const std::string& waiting, int rank, int n, Store* store,
                                                const std::string& prefix) {
    BackendOptions options = testing::LoopbackOptions(rank, n, store, prefix);
    options.gloo.busy_poll = waiting == "busy" || waiting == "channel_busy";
    options.gloo.cross_memory = waiting == "cross" || waiting == "channel";
    options.gloo.local_channel = waiting.rfind("channel", 0) == 0;
    if (waiting == "spin") options.gloo.spin = std::chrono::microseconds(50);
    return BackendRegistry::Create("gloo", options);
  }
};

TEST_P(GlooSyncMesh, LargeMessagesAndRankOrder) {
  const std::string waiting = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  auto store = std::make_shared<MemoryStore>();
  auto value = [](int rank, int64_t i) { return 1.0f / static_cast<float>(3 + (i * 7 + rank * 13) % 101); };
  const std::vector<int64_t> counts{1, 1023, 1024, 8192, 8193, 16384, 16385, 32768 * 3 + 5, 300001};
  std::vector<std::vector<std::vector<float>>> results(n);
  testing::RunRanks(n, [&](int rank) {
    std::unique_ptr<Communicator> backend = MakeMesh(waiting, rank, n, store.get(), "sync/");
    for (int64_t count : counts) {
      std::vector<float> data(count);
      for (int64_t i = 0; i < count; ++i) data[i] = value(rank, i);
      backend->Allreduce({data.data(), count, DataType::FLOAT32, ReduceOp::SUM});
      const bool ring = n > 2 && count > 8192;  // beyond the one-step limit: ring or halving-doubling
      for (int64_t i = 0; i < count; ++i) {
        float expected = value(0, i);
        for (int r = 1; r < n; ++r) expected += value(r, i);
        if (ring) {
          ASSERT_NEAR(data[i], expected, 1e-6f * expected) << count << " elements, element " << i;
        } else {
          ASSERT_EQ(std::memcmp(&data[i], &expected, sizeof(float)), 0)
              << count << " elements, element " << i << ": " << data[i] << " != " << expected;
        }
      }
      results[rank].push_back(std::move(data));
    }
    const int root = n - 1;
    std::vector<char> mine(300000 + rank, static_cast<char>('a' + rank));
    auto gathered = backend->Gatherv(mine, root);
    if (rank == root) {
      for (int r = 0; r < n; ++r) ASSERT_EQ(gathered[r], std::vector<char>(300000 + r, static_cast<char>('a' + r)));
    }
    // A frame's first message holds 4088 bytes; then one of 128 KiB and a staged one of 100 + rank.
    std::vector<char> odd(4088 + 131072 + 100 + rank, static_cast<char>('A' + rank));
    auto gathered_odd = backend->Gatherv(odd, root);
    if (rank == root) {
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(gathered_odd[r], std::vector<char>(4088 + 131072 + 100 + r, static_cast<char>('A' + r)));
      }
    }
    std::vector<char> bytes;
    if (rank == root) bytes.assign(400000, 'z');
    backend->BroadcastBytes(bytes, root);
    ASSERT_EQ(bytes, std::vector<char>(400000, 'z'));
    std::vector<uint64_t> words(40000, ~uint64_t{0});
    words[rank * 17000 % 40000] = 0;
    backend->AllreduceBitsAnd(words);
    for (size_t w = 0; w < words.size(); ++w) {
      bool cleared = false;
      for (int r = 0; r < n; ++r) cleared |= static_cast<size_t>(r * 17000 % 40000) == w;
      ASSERT_EQ(words[w], cleared ? 0 : ~uint64_t{0}) << "word " << w;
    }
    backend->Barrier();
  });
  for (int rank = 1; rank < n; ++rank) {
    for (size_t c = 0; c < counts.size(); ++c) {
      ASSERT_EQ(results[rank][c].size(), results[0][c].size());
      EXPECT_EQ(std::memcmp(results[rank][c].data(), results[0][c].data(), results[0][c].size() * sizeof(float)), 0)
          << "rank " << rank << " and rank 0 differ after an allreduce of " << counts[c] << " elements";
    }
  }
}

// The cache round carrying an allreduce's data (Communicator::AllreduceBitsAndEager): when every
// rank sends the same tag, every rank returns true with the bits of the reduction in rank order in
// its output, inline (a few bytes) or in a message of its own (up to the one-step limit), in place
// or not; when one rank's tag or size differs, or one sends nothing, every rank returns false with
// its output untouched. The words are ANDed either way, and the mesh stays in step (a plain
// allreduce follows each round).
TEST_P(GlooSyncMesh, EagerCacheRound) {
  const std::string waiting = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  auto store = std::make_shared<MemoryStore>();
  auto value = [](int rank, int64_t i) { return 1.0f / static_cast<float>(3 + (i * 5 + rank * 11) % 97); };
  const int64_t limit = n == 2 ? 65536 : 32768;
  testing::RunRanks(n, [&](int rank) {
    std::unique_ptr<Communicator> backend = MakeMesh(waiting, rank, n, store.get(), "eager/");
    ASSERT_EQ(backend->EagerAllreduceBytes(), limit);
    struct Round {
      int64_t count;
      bool in_place;
      int odd_rank;  // -1: every rank alike; else this rank sends another tag, size or nothing
      int oddity;    // 0: another tag, 1: one element fewer, 2: no data
    };
    const int64_t most = limit / 4;
    const std::vector<Round> rounds{{3, false, -1, 0},      {most, true, -1, 0},   {most, false, n - 1, 0},
                                    {1000, true, 0, 2},      {most, true, n / 2, 1}, {1023, false, -1, 0},
                                    {1024, true, n - 1, 2}};
    for (size_t k = 0; k < rounds.size(); ++k) {
      const Round& round = rounds[k];
      const bool odd = rank == round.odd_rank;
      std::vector<float> input(round.count), output(round.count, -7.0f);
      for (int64_t i = 0; i < round.count; ++i) input[i] = value(rank, i + static_cast<int64_t>(k));
      const std::vector<float> original = input;
      EagerAllreduceOptions eager;
      eager.tag = odd && round.oddity == 0 ? 9 : odd && round.oddity == 2 ? 0 : 5;
      eager.input = input.data();
      eager.output = round.in_place ? input.data() : output.data();
      eager.count = odd && round.oddity == 1 ? round.count - 1 : round.count;
      eager.dtype = DataType::FLOAT32;
      eager.op = ReduceOp::SUM;
      std::vector<uint64_t> words(3, ~uint64_t{0});
      words[1] &= ~(uint64_t{1} << rank);
      const bool settled = backend->AllreduceBitsAndEager(words, eager);
      ASSERT_EQ(words[0], ~uint64_t{0});
      ASSERT_EQ(words[1], ~((uint64_t{1} << n) - 1)) << "round " << k;
      ASSERT_EQ(settled, round.odd_rank < 0) << "round " << k;
      const std::vector<float>& result = round.in_place ? input : output;
      for (int64_t i = 0; i < round.count; ++i) {
        if (!settled) {
          ASSERT_EQ(result[i], round.in_place ? original[i] : -7.0f) << "round " << k << ", element " << i;
          continue;
        }
        float expected = value(0, i + static_cast<int64_t>(k));
        for (int r = 1; r < n; ++r) expected += value(r, i + static_cast<int64_t>(k));
        ASSERT_EQ(std::memcmp(&result[i], &expected, sizeof(float)), 0)
            << "round " << k << ", element " << i << ": " << result[i] << " != " << expected;
      }
      if (!round.in_place) ASSERT_EQ(input, original) << "round " << k << " wrote its input";
      std::vector<double> check{static_cast<double>(rank)};
      backend->Allreduce({check.data(), 1, DataType::FLOAT64, ReduceOp::SUM});
      ASSERT_EQ(check[0], n * (n - 1) / 2.0) << "after round " << k;
    }
  });
}

// The mappings of the synchronous mesh's shared-memory channels in this process.
int ChannelMappings() {
  std::ifstream maps("/proc/self/maps");
  int found = 0;
  for (std::string line; std::getline(maps, line);) found += line.find("/dev/shm/horovod.gloo.") != std::string::npos;
  return found;
}

// The shared-memory channels between ranks of one host (all ranks here, threads of one process):
// one segment per pair, mapped by both of its ranks, no name left in /dev/shm; when one rank's mesh
// is destroyed, the others' waits for it end at once in an error naming it; nothing stays mapped.
TEST(GlooSyncMeshChannel, LifecycleAndClosedPeer) {
  const int n = 3;
  auto store = std::make_shared<MemoryStore>();
  ASSERT_EQ(ChannelMappings(), 0);
  std::atomic<int> built{0}, allreduced{0};
  std::vector<std::string> errors(n);
  testing::RunRanks(n, [&](int rank) {
    BackendOptions options = testing::LoopbackOptions(rank, n, store.get(), "channel/");
    options.gloo.local_channel = true;
    std::unique_ptr<Communicator> backend = BackendRegistry::Create("gloo", options);
    std::vector<float> data(5000, static_cast<float>(rank + 1));
    backend->Allreduce({data.data(), static_cast<int64_t>(data.size()), DataType::FLOAT32, ReduceOp::SUM});
    ASSERT_EQ(data[4999], 6.0f);
    ++built;
    while (built.load() < n) std::this_thread::yield();
    if (rank == 0) EXPECT_EQ(ChannelMappings(), n * (n - 1));
    ++allreduced;
    while (allreduced.load() < n) std::this_thread::yield();
    if (rank == n - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      backend.reset();
      return;
    }
    try {
      backend->Allreduce({data.data(), static_cast<int64_t>(data.size()), DataType::FLOAT32, ReduceOp::SUM});
    } catch (const std::runtime_error& error) {
      errors[rank] = error.what();
    }
  });
  for (int rank = 0; rank < n - 1; ++rank) {
    EXPECT_NE(errors[rank].find("rank 2 "), std::string::npos) << errors[rank];
    EXPECT_NE(errors[rank].find("closed its connection"), std::string::npos) << errors[rank];
  }
  EXPECT_EQ(ChannelMappings(), 0);
  DIR* shm = opendir("/dev/shm");
  ASSERT_NE(shm, nullptr);
  for (dirent* entry; (entry = readdir(shm)) != nullptr;) {
    EXPECT_NE(std::string(entry->d_name).rfind("horovod.gloo.", 0), 0u) << entry->d_name << " left in /dev/shm";
  }
  closedir(shm);
}

INSTANTIATE_TEST_SUITE_P(Polling, GlooSyncMesh,
                         ::testing::Combine(::testing::Values("sleep", "spin", "busy", "cross", "channel",
                                                                     "channel_copy", "channel_busy"),
                                            ::testing::Values(2, 3, 4, 8)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
                           return std::get<0>(info.param) + "_np" + std::to_string(std::get<1>(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(Transports, Backends, ::testing::Combine(::testing::Bool(), ::testing::Values(2, 3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<bool, int>>& info) {
                           return std::string(std::get<0>(info.param) ? "shm" : "gloo") + "_np" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace horovod
