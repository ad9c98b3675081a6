// Deadlock detection (controller.h): controllers of N ranks (threads, Gloo over loopback) cycle
// every few milliseconds; when every rank waits on tensors the others never submit, every rank
// gets ERROR responses naming what each rank waits on; late and busy ranks never trigger it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <tuple>

#include "common/config.h"
#include "engine/controller.h"
#include "test_support.h"

namespace horovod {
namespace {

using testing::MakeRequest;
using testing::RunBackends;

constexpr auto kCyclePause = std::chrono::milliseconds(10);

struct Script {
  int cycles = 0;
  // The requests `rank` submits before `cycle`, and whether it waits during it.
  std::function<std::vector<Request>(int rank, int cycle)> submit;
  std::function<bool(int rank, int cycle)> waiting;
};

// lists[rank][cycle]: what each rank's controller decided in each cycle; ends[rank][cycle]: when
// that cycle's negotiation returned, seconds after the rank's first cycle began.
struct Runs {
  std::vector<std::vector<ResponseList>> lists;
  std::vector<std::vector<double>> ends;
};

Runs RunScript(int size, const Config& config, const Script& script, bool with_hosts = false) {
  Runs runs;
  runs.lists.resize(size);
  runs.ends.resize(size);
  RunBackends(size, false, [&](int rank, Communicator& backend) {
    std::vector<int> ranks(size);
    for (int r = 0; r < size; ++r) ranks[r] = r;
    Controller controller(backend, ranks, config, nullptr, 3);
    if (with_hosts) controller.SetHosts({"host-a", "host-b", "host-c"});
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < script.cycles; ++c) {
      runs.lists[rank].push_back(
          controller.ComputeResponseList(script.submit(rank, c), false, "", script.waiting(rank, c)));
      runs.ends[rank].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      std::this_thread::sleep_for(kCyclePause);
    }
  });
  return runs;
}

Request Allreduce(const std::string& name) { return MakeRequest(OpType::ALLREDUCE, name, DataType::FLOAT32, {4}); }
Request Allgather(const std::string& name) { return MakeRequest(OpType::ALLGATHER, name, DataType::FLOAT32, {4}); }

struct Outcome {
  std::vector<std::string> completed;  // names of non-ERROR responses, in order
  std::vector<std::string> failed;     // names of ERROR responses, sorted
  std::string message;                 // the first ERROR's message
  int first_error_cycle = -1;
};

Outcome Summarise(const std::vector<ResponseList>& cycles) {
  Outcome o;
  for (size_t c = 0; c < cycles.size(); ++c) {
    for (const Response& r : cycles[c].responses) {
      for (const auto& name : r.names) (r.type == OpType::ERROR ? o.failed : o.completed).push_back(name);
      if (r.type == OpType::ERROR && o.first_error_cycle < 0) {
        o.first_error_cycle = static_cast<int>(c);
        o.message = r.error_message;
      }
    }
  }
  // Pending tensors fail in the order they reached the coordinator, which varies.
  std::sort(o.failed.begin(), o.failed.end());
  return o;
}

Config WithTimeout(double seconds, bool cache) {
  Config config;
  config.deadlock_timeout_seconds = seconds;
  config.fusion_threshold_bytes = 0;
  if (!cache) config.cache_capacity = 0;
  return config;
}

// (ranks, response cache on)
class Deadlock : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// Rank 0 allreduces "allreduce.m" while the others allgather "allgather.n", and every rank waits.
TEST_P(Deadlock, DifferentOperationsFailOnEveryRankNamingEach) {
  const auto [size, cache] = GetParam();
  Script script;
  script.cycles = 80;  // at least 0.8 s; the timeout is 0.3 s
  script.submit = [](int rank, int c) {
    if (c != 0) return std::vector<Request>{};
    return std::vector<Request>{rank == 0 ? Allreduce("allreduce.m") : Allgather("allgather.n")};
  };
  script.waiting = [](int, int) { return true; };
  Runs runs = RunScript(size, WithTimeout(0.3, cache), script);
  const Outcome first = Summarise(runs.lists[0]);
  ASSERT_GE(first.first_error_cycle, 0) << "no deadlock error";
  for (int rank = 0; rank < size; ++rank) {
    const Outcome o = Summarise(runs.lists[rank]);
    // Not before the timeout.
    EXPECT_GE(runs.ends[rank][first.first_error_cycle], 0.3) << "rank " << rank;
    EXPECT_TRUE(o.completed.empty()) << "rank " << rank;
    EXPECT_EQ(o.failed, (std::vector<std::string>{"allgather.n", "allreduce.m"})) << "rank " << rank;
    EXPECT_EQ(o.first_error_cycle, first.first_error_cycle) << "rank " << rank;
    EXPECT_EQ(o.message, first.message);
  }
  const std::string& m = first.message;
  EXPECT_NE(m.find("Deadlock: every rank of process set 3"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 0 waits on allreduce.m (ALLREDUCE, not submitted by rank"), std::string::npos) << m;
  for (int rank = 1; rank < size; ++rank) {
    EXPECT_NE(m.find("rank " + std::to_string(rank) + " waits on allgather.n (ALLGATHER, not submitted by rank 0)"),
              std::string::npos)
        << m;
  }
}

// One user name, different collectives: rank 0 allreduces "m" ("allreduce.m") while the others
// allgather "m" ("allgather.m"), and every rank waits. A mismatch, reported in the next cycles
// without waiting for the (30 s) deadlock timeout, or when the timeout is off; another tensor
// pending meanwhile still completes.
TEST_P(Deadlock, OneNameAsDifferentCollectivesIsAMismatchAtOnce) {
  const auto [size, cache] = GetParam();
  for (double timeout : {30.0, 0.0}) {
    Script script;
    script.cycles = 30;
    script.submit = [](int rank, int c) {
      if (c == 0) return std::vector<Request>{rank == 0 ? Allreduce("allreduce.m") : Allgather("allgather.m")};
      if (c == 1) return std::vector<Request>{Allreduce("x")};
      return std::vector<Request>{};
    };
    script.waiting = [](int, int c) { return c >= 1; };
    Runs runs = RunScript(size, WithTimeout(timeout, cache), script, /*with_hosts=*/true);
    const Outcome first = Summarise(runs.lists[0]);
    for (int rank = 0; rank < size; ++rank) {
      const Outcome o = Summarise(runs.lists[rank]);
      EXPECT_EQ(o.completed, (std::vector<std::string>{"x"})) << "rank " << rank;
      EXPECT_EQ(o.failed, (std::vector<std::string>{"allgather.m", "allreduce.m"})) << "rank " << rank;
      ASSERT_GE(o.first_error_cycle, 1) << "rank " << rank;
      EXPECT_LT(o.first_error_cycle, 10) << "rank " << rank;
      EXPECT_EQ(o.message, first.message);
    }
    const std::string& m = first.message;
    EXPECT_NE(m.find("Mismatched operations: the ranks of process set 3 submitted the name 'm' as different "
                     "collectives: rank 0 (host host-a) submitted ALLREDUCE allreduce.m; rank 1 (host host-b) "
                     "submitted ALLGATHER allgather.m"),
              std::string::npos)
        << m;
  }
}

// Both ranks submit "allreduce.m" and "allgather.m" asynchronously, in opposite orders, and wait
// only once both are submitted: legitimate, both complete.
TEST_P(Deadlock, OneNameForTwoCollectivesOnEveryRankCompletes) {
  const auto [size, cache] = GetParam();
  Script script;
  script.cycles = 30;
  script.submit = [](int rank, int c) {
    if (c == 0) return std::vector<Request>{rank == 0 ? Allreduce("allreduce.m") : Allgather("allgather.m")};
    if (c == 5) return std::vector<Request>{rank == 0 ? Allgather("allgather.m") : Allreduce("allreduce.m")};
    return std::vector<Request>{};
  };
  script.waiting = [](int, int c) { return c >= 5; };
  Runs runs = RunScript(size, WithTimeout(30.0, cache), script);
  for (int rank = 0; rank < size; ++rank) {
    const Outcome o = Summarise(runs.lists[rank]);
    EXPECT_TRUE(o.failed.empty()) << "rank " << rank << ": " << o.message;
    EXPECT_EQ(o.completed.size(), 2u) << "rank " << rank;
  }
}

// One rank skips a tensor: rank 0 waits on "a", the others on "b"; cached tensors are held on each
// rank (never sent to the coordinator) until the deadlock sends them. Afterwards the set works.
TEST_P(Deadlock, SkippedTensorFailsThenTheSetGoesOn) {
  const auto [size, cache] = GetParam();
  Script script;
  script.cycles = 120;
  script.submit = [](int rank, int c) {
    if (c == 0) return std::vector<Request>{Allreduce("a"), Allreduce("b")};  // warm: cached from now on
    if (c == 1) return std::vector<Request>{Allreduce(rank == 0 ? "a" : "b")};
    if (c == 100) return std::vector<Request>{Allreduce("c")};
    return std::vector<Request>{};
  };
  script.waiting = [](int, int c) { return c >= 1 && c < 100; };
  Runs runs = RunScript(size, WithTimeout(0.3, cache), script, /*with_hosts=*/true);
  for (int rank = 0; rank < size; ++rank) {
    const Outcome o = Summarise(runs.lists[rank]);
    EXPECT_EQ(o.completed, (std::vector<std::string>{"a", "b", "c"})) << "rank " << rank;
    EXPECT_EQ(o.failed, (std::vector<std::string>{"a", "b"})) << "rank " << rank << ": " << o.message;
    ASSERT_GE(o.first_error_cycle, 1) << "rank " << rank;
    EXPECT_LT(o.first_error_cycle, 100) << "rank " << rank;
    EXPECT_GE(runs.ends[rank][o.first_error_cycle] - runs.ends[rank][0], 0.3) << "rank " << rank;
    EXPECT_NE(o.message.find("rank 0 (host host-a) waits on a (ALLREDUCE"), std::string::npos) << o.message;
    EXPECT_NE(o.message.find("rank " + std::to_string(size - 1) + " (host host-" + std::string(1, 'a' + size - 1) +
                             ") waits on b (ALLREDUCE, not submitted by rank 0)"),
              std::string::npos)
        << o.message;
  }
}

// Rank 0 waits on "t" and every other rank waits on "u"; the tensors each lacks come 0.1 s later
// (another thread of the process submitting them), within the 1 s timeout: both complete.
TEST_P(Deadlock, LateSubmissionWithinTheTimeoutCompletes) {
  const auto [size, cache] = GetParam();
  Script script;
  script.cycles = 160;
  script.submit = [](int rank, int c) {
    if (c == 0) return std::vector<Request>{Allreduce(rank == 0 ? "t" : "u")};
    if (c == 10) return std::vector<Request>{Allreduce(rank == 0 ? "u" : "t")};
    return std::vector<Request>{};
  };
  script.waiting = [](int, int) { return true; };
  Runs runs = RunScript(size, WithTimeout(1.0, cache), script);
  for (int rank = 0; rank < size; ++rank) {
    const Outcome o = Summarise(runs.lists[rank]);
    EXPECT_TRUE(o.failed.empty()) << "rank " << rank << ": " << o.message;
    EXPECT_EQ(o.completed.size(), 2u) << "rank " << rank;
  }
}

// A rank that computes (does not wait) for longer than the timeout never triggers it, whether it
// later submits what the others wait on or something else meanwhile.
TEST_P(Deadlock, BusyRankNeverTriggersIt) {
  const auto [size, cache] = GetParam();
  Script script;
  script.cycles = 100;
  const int busy = size - 1;
  script.submit = [busy](int rank, int c) {
    if (c == 0) return std::vector<Request>{Allreduce("warm")};
    if (c == 1 && rank != busy) return std::vector<Request>{Allreduce("t"), Allreduce("v")};
    if (c == 2 && rank == busy) return std::vector<Request>{Allreduce("other")};  // async, not waited on
    if (c == 80 && rank == busy) return std::vector<Request>{Allreduce("t"), Allreduce("v")};
    return std::vector<Request>{};
  };
  script.waiting = [busy](int rank, int c) { return rank != busy && c >= 1; };
  Runs runs = RunScript(size, WithTimeout(0.2, cache), script);
  for (int rank = 0; rank < size; ++rank) {
    const Outcome o = Summarise(runs.lists[rank]);
    EXPECT_TRUE(o.failed.empty()) << "rank " << rank << ": " << o.message;
    EXPECT_EQ(o.completed, (std::vector<std::string>{"warm", "t", "v"})) << "rank " << rank;
  }
}

TEST_P(Deadlock, ZeroTimeoutDisablesIt) {
  const auto [size, cache] = GetParam();
  Script script;
  script.cycles = 40;
  script.submit = [](int rank, int c) {
    return c == 0 ? std::vector<Request>{Allreduce(rank == 0 ? "x" : "y")} : std::vector<Request>{};
  };
  script.waiting = [](int, int) { return true; };
  Config config = WithTimeout(0.0, cache);
  Runs runs = RunScript(size, config, script);
  for (int rank = 0; rank < size; ++rank) {
    const Outcome o = Summarise(runs.lists[rank]);
    EXPECT_TRUE(o.failed.empty() && o.completed.empty()) << "rank " << rank << ": " << o.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Deadlock, ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
                           return "np" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_cache" : "_nocache");
                         });

}  // namespace
}  // namespace horovod
