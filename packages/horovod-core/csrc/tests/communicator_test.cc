// The communicator interface's own behaviour (csrc/backends/communicator.h): the defaults that
// refuse an operation naming the backend and the operation, the base AllreduceBitsAnd built from
// Gatherv and BroadcastBytes, ForwardingCommunicator passing every operation to a real Gloo
// communicator, and the hierarchical communicator (csrc/backends/hierarchical/) over Gloo with the
// ranks of one process grouped into pretend hosts: its results and the timeline activities it
// reports while its switches are on and off.
#include <gtest/gtest.h>

#include <unistd.h>

#include <numeric>

#include "backends/hierarchical/hierarchical.h"
#include "test_support.h"

namespace horovod {
namespace {

using testing::RunRanks;

// A communicator that implements nothing: every operation is the interface's default.
class Bare : public Communicator {
 public:
  Bare(int rank, int size) : Communicator(rank, size) {}
  const char* name() const override { return "bare"; }
};

// Expects `call` to throw UnsupportedError with exactly `message`.
template <typename Call>
void ExpectUnsupported(Call call, const std::string& message) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected: " << message;
  } catch (const UnsupportedError& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(CommunicatorDefaults, EveryOperationIsUnsupportedNamingBackendAndOperation) {
  Bare bare(0, 2);
  std::vector<char> bytes(4);
  std::vector<uint64_t> words(3, ~uint64_t{0});
  float data[4] = {};
  ExpectUnsupported([&] { bare.Gatherv(bytes, 0); }, "backend bare does not support gatherv");
  ExpectUnsupported([&] { bare.BroadcastBytes(bytes, 0); },
                    "backend bare does not support broadcast of control messages");
  // The base AND needs Gatherv, which this communicator lacks.
  ExpectUnsupported([&] { bare.AllreduceBitsAnd(words); }, "backend bare does not support gatherv");
  ExpectUnsupported([&] { bare.Split({0}, BackendOptions()); }, "backend bare does not support split");
  ExpectUnsupported([&] { bare.Allreduce({data, 4, DataType::FLOAT32, ReduceOp::SUM}); },
                    "backend bare does not support allreduce");
  ExpectUnsupported([&] { bare.AllreducePieces({{{data, data, 4}}, DataType::FLOAT32, ReduceOp::SUM, 1.0}); },
                    "backend bare does not support allreduce of separate tensors");
  ExpectUnsupported([&] { bare.Allgather({data, data, {8, 8}}); }, "backend bare does not support allgather");
  ExpectUnsupported([&] { bare.Broadcast({data, 16, 0}); }, "backend bare does not support broadcast");
  ExpectUnsupported([&] { bare.Alltoall({data, {8, 8}, data, {8, 8}}); }, "backend bare does not support alltoall");
  ExpectUnsupported([&] { bare.Reducescatter({data, 4, {2, 2}, DataType::FLOAT32, ReduceOp::SUM}); },
                    "backend bare does not support reducescatter");
  ExpectUnsupported([&] { bare.Barrier(); }, "backend bare does not support barrier");
  ExpectUnsupported([&] { bare.SendRecv({data, 8, data + 2, 8, 1}); }, "backend bare does not support send/receive");
  // The capability queries say no, without throwing.
  EXPECT_FALSE(bare.SupportsPieces(16, 1));
  int a = -1, b = -1, c = -1, d = -1;
  EXPECT_FALSE(bare.Topology(&a, &b, &c, &d));
  EXPECT_FALSE(bare.threads_supported());
  // UnsupportedError is a logic_error: the engine reports it as a programming error, not a lost peer.
  EXPECT_THROW(bare.Barrier(), std::logic_error);
}

TEST(CommunicatorDefaults, ActivityIsTheUpperCasedNameAndTheOperation) {
  Bare bare(0, 1);
  EXPECT_EQ(bare.Activity("ALLREDUCE"), "BARE_ALLREDUCE");
  EXPECT_EQ(bare.Activity("BCAST"), "BARE_BCAST");
}

TEST(CommunicatorDefaults, OneRankAndsWithoutTheControlPlane) {
  Bare bare(0, 1);
  std::vector<uint64_t> words{0x0fu, 0xf0u};
  bare.AllreduceBitsAnd(words);  // nothing to combine: no Gatherv, no exception
  EXPECT_EQ(words, (std::vector<uint64_t>{0x0fu, 0xf0u}));
}

// Gloo implements everything but the fused allreduce of separate tensors (only shared memory has it).
TEST(CommunicatorDefaults, GlooRefusesAllreducePieces) {
  auto store = std::make_shared<MemoryStore>();
  std::unique_ptr<Communicator> gloo =
      BackendRegistry::Create("gloo", testing::LoopbackOptions(0, 1, store.get(), "pieces/"));
  float data[2] = {1, 2};
  EXPECT_FALSE(gloo->SupportsPieces(8, 1));
  ExpectUnsupported([&] { gloo->AllreducePieces({{{data, data, 2}}, DataType::FLOAT32, ReduceOp::SUM, 1.0}); },
                    "backend gloo does not support allreduce of separate tensors");
  EXPECT_EQ(gloo->Activity("ALLREDUCE"), "GLOO_ALLREDUCE");
}

// Only the control plane of a real communicator, so that AllreduceBitsAnd is the base class's.
class ControlPlaneOnly : public Communicator {
 public:
  explicit ControlPlaneOnly(Communicator& real) : Communicator(real.rank(), real.size()), real_(real) {}
  const char* name() const override { return "control"; }
  std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root) override {
    return real_.Gatherv(data, root);
  }
  void BroadcastBytes(std::vector<char>& data, int root) override { real_.BroadcastBytes(data, root); }

 private:
  Communicator& real_;
};

TEST(CommunicatorDefaults, AllreduceBitsAndThroughGatherAndBroadcast) {
  for (int n : {2, 3}) {
    testing::RunBackends(n, /*shared_memory=*/false, [&](int rank, Communicator& gloo) {
      ControlPlaneOnly comm(gloo);
      std::vector<uint64_t> words(70);
      for (size_t w = 0; w < words.size(); ++w) words[w] = ~(uint64_t{1} << ((w + rank) % 64));
      comm.AllreduceBitsAnd(words);
      for (size_t w = 0; w < words.size(); ++w) {
        uint64_t expected = ~uint64_t{0};
        for (int r = 0; r < n; ++r) expected &= ~(uint64_t{1} << ((w + r) % 64));
        ASSERT_EQ(words[w], expected) << "word " << w << " np " << n;
      }
    });
  }
}

// A ForwardingCommunicator that overrides nothing behaves as the communicator it wraps: every
// operation goes through (an operation it failed to forward would be the base's UnsupportedError).
TEST(ForwardingCommunicator, ForwardsEveryOperation) {
  const int n = 3;
  auto store = std::make_shared<MemoryStore>();
  RunRanks(n, [&](int rank) {
    BackendOptions options = testing::LoopbackOptions(rank, n, store.get(), "fwd/");
    ForwardingCommunicator comm(BackendRegistry::Create("gloo", options));
    EXPECT_EQ(comm.rank(), rank);
    EXPECT_EQ(comm.size(), n);
    EXPECT_STREQ(comm.name(), "gloo");
    EXPECT_EQ(comm.Activity("ALLGATHER"), "GLOO_ALLGATHER");
    int lr = -1, ls = -1, cr = -1, cs = -1;
    EXPECT_FALSE(comm.Topology(&lr, &ls, &cr, &cs));
    EXPECT_FALSE(comm.threads_supported());
    EXPECT_FALSE(comm.SupportsPieces(1 << 20, 2));

    // Control plane.
    std::vector<char> mine(rank + 1, static_cast<char>('a' + rank));
    auto gathered = comm.Gatherv(mine, 1);
    if (rank == 1) {
      ASSERT_EQ(gathered.size(), static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) EXPECT_EQ(gathered[r], std::vector<char>(r + 1, static_cast<char>('a' + r)));
    }
    std::vector<char> bytes;
    if (rank == 2) bytes.assign(1000, 'z');
    comm.BroadcastBytes(bytes, 2);
    EXPECT_EQ(bytes, std::vector<char>(1000, 'z'));
    std::vector<uint64_t> words{~(uint64_t{1} << rank)};
    comm.AllreduceBitsAnd(words);
    EXPECT_EQ(words[0], ~uint64_t{0b111});

    // Data collectives.
    std::vector<int64_t> values(5, rank + 1);
    comm.Allreduce({values.data(), 5, DataType::INT64, ReduceOp::SUM});
    EXPECT_EQ(values, std::vector<int64_t>(5, 6));
    std::vector<char> out(n * 2);
    const char block[2] = {static_cast<char>(rank), static_cast<char>(rank)};
    comm.Allgather({block, out.data(), std::vector<int64_t>(n, 2)});
    EXPECT_EQ(out, (std::vector<char>{0, 0, 1, 1, 2, 2}));
    int32_t root_value = rank == 0 ? 42 : -1;
    comm.Broadcast({&root_value, sizeof(root_value), 0});
    EXPECT_EQ(root_value, 42);
    std::vector<char> send(n, static_cast<char>(rank)), received(n);
    comm.Alltoall({send.data(), std::vector<int64_t>(n, 1), received.data(), std::vector<int64_t>(n, 1)});
    EXPECT_EQ(received, (std::vector<char>{0, 1, 2}));
    std::vector<int32_t> scatter(n * 2, rank);
    comm.Reducescatter({scatter.data(), n * 2, std::vector<int64_t>(n, 2), DataType::INT32, ReduceOp::SUM});
    EXPECT_EQ(scatter[rank * 2], 3);
    EXPECT_EQ(scatter[rank * 2 + 1], 3);
    if (rank < 2) {
      const int peer = 1 - rank;
      int64_t theirs = -1, ours = rank * 100;
      comm.SendRecv({&ours, sizeof(ours), &theirs, sizeof(theirs), peer});
      EXPECT_EQ(theirs, peer * 100);
    }
    std::unique_ptr<Communicator> sub = comm.Split({0, 2}, testing::LoopbackOptions(rank, n, store.get(), "fwd-sub/"));
    if (rank == 1) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      EXPECT_EQ(sub->size(), 2);
      double x = rank;
      sub->Allreduce({&x, 1, DataType::FLOAT64, ReduceOp::SUM});
      EXPECT_EQ(x, 2.0);
      sub->Barrier();
    }
    comm.Barrier();
  });
}

// The hierarchical communicator over 4 ranks grouped into 2 pretend hosts of 2 (local
// communicators of Gloo, or shared memory: every rank is a thread of this process).
class Hierarchical : public ::testing::TestWithParam<bool> {};

TEST_P(Hierarchical, ResultsAndActivities) {
  const bool shared_memory = GetParam();
  const int n = 4;
  auto store = std::make_shared<MemoryStore>();
  RunRanks(n, [&](int rank) {
    BackendOptions options = testing::LoopbackOptions(rank, n, store.get(), "hier/");
    const HostLayout layout = GroupByHost({"a", "a", "b", "b"}, rank);
    ASSERT_EQ(layout.hosts.size(), 2u);
    std::vector<int64_t> pids(n, static_cast<int64_t>(::getpid()));
    auto state = std::make_shared<HierarchicalState>();
    HierarchicalBackend comm(BackendRegistry::Create("gloo", options), layout, pids, options, shared_memory,
                             /*single_copy=*/false, state);
    EXPECT_EQ(state->local_shared_memory, shared_memory);
    EXPECT_STREQ(comm.name(), "gloo");
    EXPECT_FALSE(comm.SupportsPieces(64 << 20, 1));

    // Switches off: the flat path, with the global communicator's activities.
    EXPECT_EQ(comm.Activity("ALLREDUCE"), "GLOO_ALLREDUCE");
    EXPECT_EQ(comm.Activity("ALLGATHER"), "GLOO_ALLGATHER");
    std::vector<float> values(1001);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 7 + rank);
    comm.Allreduce({values.data(), static_cast<int64_t>(values.size()), DataType::FLOAT32, ReduceOp::SUM});
    for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], 4.0f * (i % 7) + 6.0f) << i;
    EXPECT_EQ(state->allreduces.load(), 0);

    // Allreduce on: its own activity and path (the counters count it); the others unchanged.
    state->allreduce = true;
    EXPECT_EQ(comm.Activity("ALLREDUCE"), "HIERARCHICAL_ALLREDUCE");
    EXPECT_EQ(comm.Activity("ALLGATHER"), "GLOO_ALLGATHER");
    EXPECT_EQ(comm.Activity("BCAST"), "GLOO_BCAST");
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 7 + rank);
    comm.Allreduce({values.data(), static_cast<int64_t>(values.size()), DataType::FLOAT32, ReduceOp::SUM});
    for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], 4.0f * (i % 7) + 6.0f) << i;
    EXPECT_EQ(state->allreduces.load(), 1);

    // Allgather on: blocks of different sizes (rank 0 contributes nothing), in global rank order.
    state->allgather = true;
    EXPECT_EQ(comm.Activity("ALLGATHER"), "HIERARCHICAL_ALLGATHER");
    std::vector<int64_t> bytes_per_rank{0, 3, 5, 7};
    std::vector<char> block(bytes_per_rank[rank], static_cast<char>('a' + rank));
    std::vector<char> out(15);
    comm.Allgather({block.data(), out.data(), bytes_per_rank});
    EXPECT_EQ(std::string(out.begin(), out.end()), "bbbcccccddddddd");
    EXPECT_EQ(state->allgathers.load(), 1);

    // Everything else goes to the global communicator.
    int64_t root_value = rank == 3 ? 7 : 0;
    comm.Broadcast({&root_value, sizeof(root_value), 3});
    EXPECT_EQ(root_value, 7);
    std::vector<char> gathered_bytes{static_cast<char>(rank)};
    comm.BroadcastBytes(gathered_bytes, 0);
    EXPECT_EQ(gathered_bytes, std::vector<char>{0});

    state->allreduce = false;
    state->allgather = false;
    EXPECT_EQ(comm.Activity("ALLREDUCE"), "GLOO_ALLREDUCE");
    EXPECT_EQ(comm.Activity("ALLGATHER"), "GLOO_ALLGATHER");
    comm.Barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(LocalTransports, Hierarchical, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "shm" : "gloo");
                         });

}  // namespace
}  // namespace horovod
