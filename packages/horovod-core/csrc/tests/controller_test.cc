// Negotiation: controllers of N ranks (threads, Gloo over loopback) agree on what runs, in which
// order, and turn disagreement between ranks into an error response delivered to every rank.
#include <gtest/gtest.h>

#include <mutex>

#include "common/config.h"
#include "engine/controller.h"
#include "test_support.h"

namespace horovod {
namespace {

using testing::MakeRequest;
using testing::RunBackends;

// cycles[c][rank]: the requests rank submits before cycle c. Returns lists[rank][c], what each
// rank's controller decided in each cycle.
std::vector<std::vector<ResponseList>> Negotiate(int size, const std::vector<std::vector<std::vector<Request>>>& cycles,
                                                 const Config& config = Config(),
                                                 std::vector<NegotiationStats>* stats = nullptr) {
  std::vector<std::vector<ResponseList>> lists(size);
  if (stats) stats->assign(size, NegotiationStats());
  RunBackends(size, false, [&](int rank, Communicator& backend) {
    std::vector<int> ranks(size);
    for (int r = 0; r < size; ++r) ranks[r] = r;
    Controller controller(backend, ranks, config, nullptr);
    for (const auto& cycle : cycles) lists[rank].push_back(controller.ComputeResponseList(cycle[rank], false, ""));
    if (stats) (*stats)[rank] = controller.stats();
  });
  return lists;
}

// The same requests on every rank but `odd`, which gets `changed`.
std::vector<std::vector<Request>> AllBut(int size, int odd, const Request& same, const Request& changed) {
  std::vector<std::vector<Request>> cycle(size, {same});
  cycle[odd] = {changed};
  return cycle;
}

std::vector<std::string> NamesOf(const ResponseList& list) {
  std::vector<std::string> names;
  for (const auto& r : list.responses) {
    for (const auto& n : r.names) names.push_back(n);
  }
  return names;
}

// Every rank gets one ERROR response for `name` whose message contains every part of `expected`.
void ExpectErrorEverywhere(const std::vector<std::vector<ResponseList>>& lists, const std::string& name,
                           const std::vector<std::string>& expected) {
  for (size_t rank = 0; rank < lists.size(); ++rank) {
    const ResponseList& list = lists[rank].back();
    ASSERT_EQ(list.responses.size(), 1u) << "rank " << rank;
    const Response& r = list.responses[0];
    EXPECT_EQ(r.type, OpType::ERROR) << "rank " << rank;
    EXPECT_EQ(r.names, std::vector<std::string>{name});
    for (const auto& part : expected) {
      EXPECT_NE(r.error_message.find(part), std::string::npos) << "rank " << rank << ": " << r.error_message;
    }
  }
}

Request Allreduce(const std::string& name, std::vector<int64_t> shape = {4}, DataType dtype = DataType::FLOAT32) {
  return MakeRequest(OpType::ALLREDUCE, name, dtype, std::move(shape));
}

class Agreement : public ::testing::TestWithParam<int> {};

TEST_P(Agreement, MismatchedDtype) {
  const int size = GetParam();
  auto lists = Negotiate(size, {AllBut(size, size - 1, Allreduce("t"), Allreduce("t", {4}, DataType::INT32))});
  ExpectErrorEverywhere(lists, "t", {"Mismatched data types", "float32", "int32", "tensor t", "ALLREDUCE"});
}

TEST_P(Agreement, MismatchedShape) {
  const int size = GetParam();
  auto lists = Negotiate(size, {AllBut(size, 1, Allreduce("t", {2, 3}), Allreduce("t", {3, 2}))});
  ExpectErrorEverywhere(lists, "t", {"Mismatched ALLREDUCE tensor shapes", "[2, 3]", "[3, 2]", "tensor t"});
}

TEST_P(Agreement, MismatchedOperation) {
  const int size = GetParam();
  Request gather = MakeRequest(OpType::ALLGATHER, "t", DataType::FLOAT32, {4});
  auto lists = Negotiate(size, {AllBut(size, size - 1, Allreduce("t"), gather)});
  ExpectErrorEverywhere(lists, "t", {"Mismatched operations", "ALLREDUCE", "ALLGATHER"});
}

TEST_P(Agreement, MismatchedReduceOpAndScaling) {
  const int size = GetParam();
  Request max = Allreduce("t");
  max.reduce_op = ReduceOp::MAX;
  ExpectErrorEverywhere(Negotiate(size, {AllBut(size, 1, Allreduce("t"), max)}), "t",
                        {"Mismatched reduction operations", "tensor t"});
  Request scaled = Allreduce("t");
  scaled.postscale_factor = 0.5;
  ExpectErrorEverywhere(Negotiate(size, {AllBut(size, 1, Allreduce("t"), scaled)}), "t",
                        {"Mismatched prescale and/or postscale factors", "0.5"});
}

TEST_P(Agreement, MismatchedRoot) {
  const int size = GetParam();
  Request root0 = MakeRequest(OpType::BROADCAST, "b", DataType::INT64, {3});
  root0.root_rank = 0;
  Request root1 = root0;
  root1.root_rank = 1;
  ExpectErrorEverywhere(Negotiate(size, {AllBut(size, size - 1, root0, root1)}), "b",
                        {"Mismatched BROADCAST root ranks", "root rank 0", "root rank 1"});
}

TEST_P(Agreement, AllgatherChecksTrailingDimensionsAndScalars) {
  const int size = GetParam();
  Request a = MakeRequest(OpType::ALLGATHER, "g", DataType::FLOAT32, {2, 5});
  Request b = MakeRequest(OpType::ALLGATHER, "g", DataType::FLOAT32, {7, 5});  // dim 0 may differ
  Request c = MakeRequest(OpType::ALLGATHER, "g", DataType::FLOAT32, {2, 6});
  Request scalar = MakeRequest(OpType::ALLGATHER, "g", DataType::FLOAT32, {});
  auto ok = Negotiate(size, {AllBut(size, 1, a, b)});
  for (int rank = 0; rank < size; ++rank) {
    ASSERT_EQ(ok[rank][0].responses.size(), 1u);
    const Response& r = ok[rank][0].responses[0];
    EXPECT_EQ(r.type, OpType::ALLGATHER);
    std::vector<int64_t> dims(size, 2);
    dims[1] = 7;
    EXPECT_EQ(r.tensor_sizes, dims) << "rank " << rank;
  }
  ExpectErrorEverywhere(Negotiate(size, {AllBut(size, 1, a, c)}), "g", {"dimension 1 equal to 5", "equal to 6"});
  ExpectErrorEverywhere(Negotiate(size, {AllBut(size, size - 1, a, scalar)}), "g",
                        {"rank " + std::to_string(size - 1) + " sent a scalar"});
}

TEST_P(Agreement, MismatchedDevice) {
  const int size = GetParam();
  Request gpu = Allreduce("t");
  gpu.device = 0;
  ExpectErrorEverywhere(Negotiate(size, {AllBut(size, 1, Allreduce("t"), gpu)}), "t",
                        {"CPU/GPU device selection", "device CPU", "device GPU"});
}

TEST_P(Agreement, AlltoallSizesComeFromEverySender) {
  const int size = GetParam();
  std::vector<std::vector<Request>> cycle(size);
  for (int rank = 0; rank < size; ++rank) {
    Request r = MakeRequest(OpType::ALLTOALL, "x", DataType::INT32, {10 * (rank + 1)});
    r.splits.assign(size, 0);
    for (int to = 0; to < size; ++to) r.splits[to] = rank + to;  // rows rank sends to `to`
    cycle[rank] = {r};
  }
  auto lists = Negotiate(size, {cycle});
  for (int rank = 0; rank < size; ++rank) {
    const Response& r = lists[rank][0].responses.at(0);
    EXPECT_EQ(r.type, OpType::ALLTOALL);
    ASSERT_EQ(r.tensor_sizes.size(), static_cast<size_t>(size * size));
    for (int from = 0; from < size; ++from) {
      for (int to = 0; to < size; ++to) EXPECT_EQ(r.tensor_sizes[from * size + to], from + to);
    }
  }
}

// Every rank executes the same responses in the same order, whatever order each submitted in: the
// coordinator's arrival order (rank 0's list first, then the others' in rank order).
TEST_P(Agreement, ResponsesAreOrderedTheSameOnEveryRank) {
  const int size = GetParam();
  Config no_fusion;
  no_fusion.fusion_threshold_bytes = 0;
  std::vector<std::vector<Request>> cycle(size);
  const std::vector<std::string> names = {"a", "b", "c", "d"};
  for (int rank = 0; rank < size; ++rank) {
    for (size_t i = 0; i < names.size(); ++i) cycle[rank].push_back(Allreduce(names[(i + rank) % names.size()]));
  }
  auto lists = Negotiate(size, {cycle}, no_fusion);
  for (int rank = 0; rank < size; ++rank) EXPECT_EQ(NamesOf(lists[rank][0]), names) << "rank " << rank;
}

// A tensor is ready only once every rank has submitted it; until then it waits, and others that
// are ready go ahead.
TEST_P(Agreement, ATensorWaitsForTheLastRank) {
  const int size = GetParam();
  Config no_fusion;
  no_fusion.fusion_threshold_bytes = 0;
  std::vector<std::vector<Request>> first(size, {Allreduce("late"), Allreduce("now")});
  first[size - 1] = {Allreduce("now")};
  std::vector<std::vector<Request>> second(size);
  second[size - 1] = {Allreduce("late")};
  auto lists = Negotiate(size, {first, second}, no_fusion);
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_EQ(NamesOf(lists[rank][0]), std::vector<std::string>{"now"}) << "rank " << rank;
    EXPECT_EQ(NamesOf(lists[rank][1]), std::vector<std::string>{"late"}) << "rank " << rank;
  }
}

// Ready allreduces are fused by the planner after negotiation: one response for all of them.
TEST_P(Agreement, ReadyAllreducesAreFused) {
  const int size = GetParam();
  std::vector<std::vector<Request>> cycle(size, {Allreduce("a", {3}), Allreduce("b", {5})});
  auto lists = Negotiate(size, {cycle});
  for (int rank = 0; rank < size; ++rank) {
    ASSERT_EQ(lists[rank][0].responses.size(), 1u);
    EXPECT_EQ(lists[rank][0].responses[0].names, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(lists[rank][0].responses[0].tensor_sizes, (std::vector<int64_t>{3, 5}));
  }
}

// The second time the same tensors come, the response cache settles them without the
// coordinator; a rank that changes a cached tensor's parameters invalidates it on every rank and
// the coordinator reports the mismatch.
TEST_P(Agreement, ResponseCacheFastPathAndInvalidation) {
  const int size = GetParam();
  Config no_fusion;
  no_fusion.fusion_threshold_bytes = 0;
  std::vector<std::vector<Request>> steady(size, {Allreduce("a"), Allreduce("b")});
  auto changed = AllBut(size, size - 1, Allreduce("a"), Allreduce("a", {8}));
  std::vector<NegotiationStats> stats;
  auto lists = Negotiate(size, {steady, steady, steady, changed}, no_fusion, &stats);
  for (int rank = 0; rank < size; ++rank) {
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(NamesOf(lists[rank][c]), (std::vector<std::string>{"a", "b"})) << "rank " << rank << " cycle " << c;
    }
    EXPECT_EQ(stats[rank].cycles, 4);
    EXPECT_EQ(stats[rank].cache_hits, 4);          // a and b in cycles 1 and 2
    EXPECT_EQ(stats[rank].coordinator_rounds, 2);  // cycles 0 and 3
  }
  ExpectErrorEverywhere(lists, "a", {"Mismatched ALLREDUCE tensor shapes", "[4]", "[8]"});
}

TEST_P(Agreement, ShutdownOfOneRankReachesEveryRank) {
  const int size = GetParam();
  std::vector<ResponseList> last(size);
  RunBackends(size, false, [&](int rank, Communicator& backend) {
    std::vector<int> ranks(size);
    for (int r = 0; r < size; ++r) ranks[r] = r;
    Config config;
    Controller controller(backend, ranks, config, nullptr);
    controller.ComputeResponseList({Allreduce("warm")}, false, "");  // cached: the next cycle may take the fast path
    last[rank] = controller.ComputeResponseList({}, rank == size - 1, rank == size - 1 ? "rank stopped" : "");
  });
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_TRUE(last[rank].shutdown) << "rank " << rank;
    EXPECT_EQ(last[rank].shutdown_reason, "rank stopped");
  }
}

// A deadlock across process sets, as a set other than the global one sees it: the global set's
// verdict (job_deadlocked) fails what this set's ranks were stuck on, but not an operation that
// first arrives in the verdict's own round, which a rank freed by the global set's failure in the
// same cycle submitted; it completes once the other rank submits it too.
TEST_P(Agreement, DeadlockAcrossSetsSparesWhatArrivesWithTheVerdict) {
  const int size = GetParam();
  std::vector<std::vector<ResponseList>> lists(size);
  RunBackends(size, false, [&](int rank, Communicator& backend) {
    std::vector<int> ranks(size);
    for (int r = 0; r < size; ++r) ranks[r] = r;
    Config config;
    Controller controller(backend, ranks, config, nullptr, /*set_id=*/1);
    auto cycle = [&](std::vector<Request> requests, bool job_deadlocked) {
      lists[rank].push_back(controller.ComputeResponseList(std::move(requests), false, "", /*waiting=*/true,
                                                           /*stuck=*/false, job_deadlocked));
    };
    // Rank 0 waits on "stuck", which the others never submit.
    cycle(rank == 0 ? std::vector<Request>{Allreduce("stuck")} : std::vector<Request>{}, false);
    // The verdict's cycle: the other ranks, freed elsewhere, submit "after" in it.
    cycle(rank == 0 ? std::vector<Request>{} : std::vector<Request>{Allreduce("after")}, true);
    // Rank 0, its "stuck" failed, submits "after" too.
    cycle(rank == 0 ? std::vector<Request>{Allreduce("after")} : std::vector<Request>{}, false);
  });
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_TRUE(lists[rank][0].responses.empty()) << "rank " << rank;
    ASSERT_EQ(lists[rank][1].responses.size(), 1u) << "rank " << rank;
    const Response& verdict = lists[rank][1].responses[0];
    EXPECT_EQ(verdict.type, OpType::ERROR);
    EXPECT_EQ(verdict.names, std::vector<std::string>{"stuck"});
    EXPECT_NE(verdict.error_message.find("Deadlock across process sets"), std::string::npos) << verdict.error_message;
    EXPECT_NE(verdict.error_message.find("in process set 1: rank 0 waits on stuck"), std::string::npos)
        << verdict.error_message;
    ASSERT_EQ(lists[rank][2].responses.size(), 1u) << "rank " << rank;
    EXPECT_EQ(lists[rank][2].responses[0].type, OpType::ALLREDUCE) << lists[rank][2].responses[0].error_message;
    EXPECT_EQ(lists[rank][2].responses[0].names, std::vector<std::string>{"after"});
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Agreement, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "np" + std::to_string(info.param); });

}  // namespace
}  // namespace horovod
