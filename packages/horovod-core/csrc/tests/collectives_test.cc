// The collectives end to end: N engines as threads of one process (each with its background
// thread, controller and fusion buffer), over Gloo on loopback or over the shared-memory
// transport, compared with references computed here. Parametrised by transport and rank count;
// each body loops over dtypes and element counts (odd ones, and ones large enough to take the
// backends' large-message paths).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "common/reduction.h"
#include "test_support.h"

namespace horovod {
namespace {

using testing::EngineGroup;
using testing::MakeEntry;
using testing::MakeRequest;
using testing::SubmitAndWait;

// Typed element access through doubles: the tests use values every dtype holds exactly.
double Load(DataType dtype, const void* buffer, int64_t i) {
  switch (dtype) {
    case DataType::UINT8: return static_cast<const uint8_t*>(buffer)[i];
    case DataType::INT8: return static_cast<const int8_t*>(buffer)[i];
    case DataType::INT32: return static_cast<const int32_t*>(buffer)[i];
    case DataType::INT64: return static_cast<double>(static_cast<const int64_t*>(buffer)[i]);
    case DataType::FLOAT16: return HalfToFloat(static_cast<const uint16_t*>(buffer)[i]);
    case DataType::BFLOAT16: return BFloat16ToFloat(static_cast<const uint16_t*>(buffer)[i]);
    case DataType::FLOAT32: return static_cast<const float*>(buffer)[i];
    case DataType::FLOAT64: return static_cast<const double*>(buffer)[i];
    default: throw std::invalid_argument("dtype not used by these tests");
  }
}

void Store(DataType dtype, void* buffer, int64_t i, double v) {
  switch (dtype) {
    case DataType::UINT8: static_cast<uint8_t*>(buffer)[i] = static_cast<uint8_t>(v); break;
    case DataType::INT8: static_cast<int8_t*>(buffer)[i] = static_cast<int8_t>(v); break;
    case DataType::INT32: static_cast<int32_t*>(buffer)[i] = static_cast<int32_t>(v); break;
    case DataType::INT64: static_cast<int64_t*>(buffer)[i] = static_cast<int64_t>(v); break;
    case DataType::FLOAT16: static_cast<uint16_t*>(buffer)[i] = FloatToHalf(static_cast<float>(v)); break;
    case DataType::BFLOAT16: static_cast<uint16_t*>(buffer)[i] = FloatToBFloat16(static_cast<float>(v)); break;
    case DataType::FLOAT32: static_cast<float*>(buffer)[i] = static_cast<float>(v); break;
    case DataType::FLOAT64: static_cast<double*>(buffer)[i] = v; break;
    default: throw std::invalid_argument("dtype not used by these tests");
  }
}

bool IsFloat(DataType dtype) {
  return dtype == DataType::FLOAT16 || dtype == DataType::BFLOAT16 || dtype == DataType::FLOAT32 ||
         dtype == DataType::FLOAT64;
}

// Small integers, exact in every dtype and in their sums over 4 ranks (unsigned: non-negative).
double Value(DataType dtype, ReduceOp op, int64_t i, int rank) {
  if (op == ReduceOp::PRODUCT) return static_cast<double>((i + rank) % 2 + 1);
  const int64_t v = (i * 7 + rank * 13) % 9;
  return dtype == DataType::UINT8 ? static_cast<double>(v % 5) : static_cast<double>(v - 4);
}

double Expected(DataType dtype, ReduceOp op, int64_t i, int size, double prescale = 1.0, double postscale = 1.0) {
  double acc = Value(dtype, op, i, 0) * prescale;
  for (int r = 1; r < size; ++r) {
    const double v = Value(dtype, op, i, r) * prescale;
    switch (op) {
      case ReduceOp::SUM: case ReduceOp::AVERAGE: acc += v; break;
      case ReduceOp::MIN: acc = std::min(acc, v); break;
      case ReduceOp::MAX: acc = std::max(acc, v); break;
      case ReduceOp::PRODUCT: acc *= v; break;
      default: throw std::invalid_argument("op not used by these tests");
    }
  }
  double scale = postscale * (op == ReduceOp::AVERAGE ? 1.0 / size : 1.0);
  acc *= scale;
  return IsFloat(dtype) ? acc : std::trunc(acc);  // integers are scaled in float64 and truncated
}

void ExpectClose(DataType dtype, double expected, double actual, const std::string& where) {
  const double tolerance = dtype == DataType::FLOAT16 || dtype == DataType::BFLOAT16 ? 1e-2 * (1 + std::fabs(expected))
                           : IsFloat(dtype)                                           ? 1e-6 * (1 + std::fabs(expected))
                                                                                      : 0.0;
  ASSERT_LE(std::fabs(expected - actual), tolerance) << where << ": expected " << expected << ", got " << actual;
}

void ExpectOk(HandleState& state, const std::string& what) {
  Status status = state.status();
  if (!status.ok()) throw std::runtime_error(what + " failed: " + status.reason());
}

struct Transport {
  const char* name;
  bool shared_memory;
};

class Collectives : public ::testing::TestWithParam<std::tuple<Transport, int>> {
 protected:
  void SetUp() override {
    const auto [transport, size] = GetParam();
    group_ = std::make_unique<EngineGroup>(
        size, std::map<std::string, std::string>{{"HOROVOD_SHARED_MEMORY", transport.shared_memory ? "1" : "0"}});
    for (int rank = 0; rank < size; ++rank) {
      ASSERT_EQ(group_->engine(rank).shared_memory(), transport.shared_memory) << "rank " << rank;
      ASSERT_STREQ(group_->engine(rank).backend_name(), "gloo");
    }
  }
  void TearDown() override { group_.reset(); }
  int size() const { return std::get<1>(GetParam()); }

  std::unique_ptr<EngineGroup> group_;
};

// Counts: one element, an odd count, one that spreads unevenly, and (float32) one of ~4 MiB that
// takes Gloo's ring and the shared-memory transport's single-copy path.
const std::vector<int64_t> kCounts = {1, 7, 1001};
constexpr int64_t kLargeCount = (1 << 20) + 3;

TEST_P(Collectives, Allreduce) {
  const std::vector<std::pair<DataType, std::vector<ReduceOp>>> cases = {
      {DataType::FLOAT32, {ReduceOp::SUM, ReduceOp::AVERAGE, ReduceOp::MIN, ReduceOp::MAX, ReduceOp::PRODUCT}},
      {DataType::FLOAT64, {ReduceOp::SUM, ReduceOp::AVERAGE}},
      {DataType::FLOAT16, {ReduceOp::SUM, ReduceOp::MAX}},
      {DataType::BFLOAT16, {ReduceOp::SUM}},
      {DataType::INT32, {ReduceOp::SUM, ReduceOp::AVERAGE, ReduceOp::MIN, ReduceOp::PRODUCT}},
      {DataType::INT64, {ReduceOp::SUM, ReduceOp::MAX}},
      {DataType::UINT8, {ReduceOp::SUM}},
      {DataType::INT8, {ReduceOp::MIN}},
  };
  group_->Run([&](int rank, Engine& engine) {
    for (const auto& [dtype, ops] : cases) {
      std::vector<int64_t> counts = kCounts;
      if (dtype == DataType::FLOAT32) counts.push_back(kLargeCount);
      for (ReduceOp op : ops) {
        for (int64_t count : counts) {
          const std::string name = std::string("allreduce.") + DataTypeName(dtype) + "." + ReduceOpName(op) + "." +
                                   std::to_string(count);
          std::vector<char> in(count * DataTypeSize(dtype)), out(in.size());
          for (int64_t i = 0; i < count; ++i) Store(dtype, in.data(), i, Value(dtype, op, i, rank));
          Request request = MakeRequest(OpType::ALLREDUCE, name, dtype, {count});
          request.reduce_op = op;
          auto state = SubmitAndWait(engine, {request}, {MakeEntry(name, in.data(), out.data(), dtype, {count})});
          ExpectOk(*state, name);
          for (int64_t i = 0; i < count; ++i) {
            ExpectClose(dtype, Expected(dtype, op, i, size()), Load(dtype, out.data(), i),
                        name + " element " + std::to_string(i));
          }
        }
      }
    }
  });
}

// Several tensors submitted together are fused (same dtype) or not (another dtype), in place
// and out of place, with prescale and postscale factors.
TEST_P(Collectives, FusedAllreduceWithScaling) {
  const std::vector<std::pair<DataType, int64_t>> tensors = {
      {DataType::FLOAT32, 5}, {DataType::FLOAT32, 1}, {DataType::FLOAT64, 33}, {DataType::FLOAT32, 4097},
      {DataType::FLOAT32, 3}};
  group_->Run([&](int rank, Engine& engine) {
    for (int round = 0; round < 3; ++round) {  // rounds 1 and 2 come from the response cache
      std::vector<std::vector<char>> in(tensors.size()), out(tensors.size());
      std::vector<Request> requests;
      std::vector<TensorTableEntry> entries;
      for (size_t t = 0; t < tensors.size(); ++t) {
        const auto [dtype, count] = tensors[t];
        in[t].resize(count * DataTypeSize(dtype));
        for (int64_t i = 0; i < count; ++i) Store(dtype, in[t].data(), i, Value(dtype, ReduceOp::SUM, i + t, rank));
        const bool in_place = t % 2 == 1;
        if (!in_place) out[t].resize(in[t].size());
        const std::string name = "fused." + std::to_string(t);
        Request request = MakeRequest(OpType::ALLREDUCE, name, dtype, {count});
        request.prescale_factor = 2.0;
        request.postscale_factor = 0.25;
        requests.push_back(request);
        entries.push_back(MakeEntry(name, in[t].data(), in_place ? in[t].data() : out[t].data(), dtype, {count}));
      }
      auto state = SubmitAndWait(engine, requests, entries);
      ExpectOk(*state, "fused allreduce");
      for (size_t t = 0; t < tensors.size(); ++t) {
        const auto [dtype, count] = tensors[t];
        const void* result = out[t].empty() ? in[t].data() : out[t].data();
        for (int64_t i = 0; i < count; ++i) {
          double expected = 0;
          for (int r = 0; r < size(); ++r) expected += Value(dtype, ReduceOp::SUM, i + t, r) * 2.0;
          ExpectClose(dtype, expected * 0.25, Load(dtype, result, i),
                      "tensor " + std::to_string(t) + " element " + std::to_string(i) + " round " +
                          std::to_string(round));
        }
      }
    }
  });
  EXPECT_GT(group_->engine(0).GlobalStats().cache_hits, 0);
}

TEST_P(Collectives, Allgather) {
  group_->Run([&](int rank, Engine& engine) {
    for (DataType dtype : {DataType::FLOAT32, DataType::INT64, DataType::UINT8}) {
      for (int64_t width : {1, 3, 1000}) {
        // Rank r contributes r + 1 rows (rank 0 one row, ...); row j of rank r holds r*100 + j.
        const int64_t rows = rank + 1;
        std::vector<char> in(rows * width * DataTypeSize(dtype));
        for (int64_t j = 0; j < rows; ++j) {
          for (int64_t k = 0; k < width; ++k) Store(dtype, in.data(), j * width + k, (rank * 10 + j + k) % 100);
        }
        const std::string name = std::string("allgather.") + DataTypeName(dtype) + "." + std::to_string(width);
        auto state = SubmitAndWait(engine, {MakeRequest(OpType::ALLGATHER, name, dtype, {rows, width})},
                                   {MakeEntry(name, in.data(), nullptr, dtype, {rows, width})});
        ExpectOk(*state, name);
        const auto outputs = state->outputs();
        ASSERT_EQ(outputs.size(), 1u);
        ASSERT_EQ(outputs[0].size(), 1u);
        const OutputBuffer& out = *outputs[0][0];
        const int64_t total_rows = static_cast<int64_t>(size()) * (size() + 1) / 2;
        ASSERT_EQ(out.shape(), (std::vector<int64_t>{total_rows, width})) << name;
        int64_t row = 0;
        for (int r = 0; r < size(); ++r) {
          for (int64_t j = 0; j <= r; ++j, ++row) {
            for (int64_t k = 0; k < width; ++k) {
              ASSERT_EQ(Load(dtype, out.data(), row * width + k), (r * 10 + j + k) % 100) << name << " row " << row;
            }
          }
        }
      }
    }
  });
}

TEST_P(Collectives, Broadcast) {
  group_->Run([&](int rank, Engine& engine) {
    for (int root = 0; root < size(); ++root) {
      for (int64_t count : {int64_t{1}, int64_t{999}, kLargeCount}) {
        const DataType dtype = count == 999 ? DataType::INT32 : DataType::FLOAT32;
        std::vector<char> buffer(count * DataTypeSize(dtype));
        for (int64_t i = 0; i < count; ++i) Store(dtype, buffer.data(), i, (i + rank * 5) % 50);
        const std::string name = "broadcast." + std::to_string(root) + "." + std::to_string(count);
        Request request = MakeRequest(OpType::BROADCAST, name, dtype, {count});
        request.root_rank = root;
        auto state = SubmitAndWait(engine, {request}, {MakeEntry(name, buffer.data(), buffer.data(), dtype, {count})});
        ExpectOk(*state, name);
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(Load(dtype, buffer.data(), i), (i + root * 5) % 50) << name << " element " << i;
        }
      }
    }
  });
}

// Reduce to each root in turn, out of place and in place, with scaling: the root gets the
// reduction, the other ranks' outputs are their inputs.
TEST_P(Collectives, Reduce) {
  const std::vector<std::pair<DataType, ReduceOp>> cases = {
      {DataType::FLOAT32, ReduceOp::SUM}, {DataType::FLOAT32, ReduceOp::AVERAGE}, {DataType::FLOAT64, ReduceOp::MIN},
      {DataType::INT32, ReduceOp::MAX},   {DataType::INT64, ReduceOp::PRODUCT},
  };
  group_->Run([&](int rank, Engine& engine) {
    for (int root = 0; root < size(); ++root) {
      for (const auto& [dtype, op] : cases) {
        for (int64_t count : {int64_t{1}, int64_t{1001}}) {
          for (bool in_place : {false, true}) {
            const double prescale = IsFloat(dtype) ? 0.5 : 1.0, postscale = IsFloat(dtype) ? 3.0 : 1.0;
            const std::string name = "reduce." + std::to_string(root) + "." + DataTypeName(dtype) + "." +
                                     ReduceOpName(op) + "." + std::to_string(count) + (in_place ? ".in" : ".out");
            std::vector<char> in(count * DataTypeSize(dtype)), out(in.size());
            for (int64_t i = 0; i < count; ++i) Store(dtype, in.data(), i, Value(dtype, op, i, rank));
            char* output = in_place ? in.data() : out.data();
            Request request = MakeRequest(OpType::REDUCE, name, dtype, {count});
            request.reduce_op = op;
            request.root_rank = root;
            request.prescale_factor = prescale;
            request.postscale_factor = postscale;
            auto state = SubmitAndWait(engine, {request}, {MakeEntry(name, in.data(), output, dtype, {count})});
            ExpectOk(*state, name);
            for (int64_t i = 0; i < count; ++i) {
              const double expected = rank == root ? Expected(dtype, op, i, size(), prescale, postscale)
                                                   : Value(dtype, op, i, rank);
              ExpectClose(dtype, expected, Load(dtype, output, i), name + " element " + std::to_string(i));
              if (!in_place) ASSERT_EQ(Load(dtype, in.data(), i), Value(dtype, op, i, rank)) << name << " input";
            }
          }
        }
      }
    }
  });
}

TEST_P(Collectives, Alltoall) {
  group_->Run([&](int rank, Engine& engine) {
    for (int64_t width : {1, 5, 2000}) {
      // Rank r sends (r + to) % 3 rows to rank `to`; each row holds sender, receiver and row index.
      std::vector<int64_t> splits(size());
      for (int to = 0; to < size(); ++to) splits[to] = (rank + to) % 3;
      const int64_t rows = std::accumulate(splits.begin(), splits.end(), int64_t{0});
      std::vector<float> in(std::max<int64_t>(rows, 1) * width);
      int64_t row = 0;
      for (int to = 0; to < size(); ++to) {
        for (int64_t j = 0; j < splits[to]; ++j, ++row) {
          for (int64_t k = 0; k < width; ++k) in[row * width + k] = static_cast<float>(rank * 1000 + to * 100 + j * 10 + k % 10);
        }
      }
      const std::string name = "alltoall." + std::to_string(width);
      Request request = MakeRequest(OpType::ALLTOALL, name, DataType::FLOAT32, {rows, width});
      request.splits = splits;
      auto state = SubmitAndWait(engine, {request}, {MakeEntry(name, in.data(), nullptr, DataType::FLOAT32, {rows, width})});
      ExpectOk(*state, name);
      const auto outputs = state->outputs();
      ASSERT_EQ(outputs.at(0).size(), 2u) << "the received tensor and the received splits";
      const OutputBuffer& out = *outputs[0][0];
      const auto* received_splits = static_cast<const int32_t*>(outputs[0][1]->data());
      int64_t received_rows = 0;
      for (int from = 0; from < size(); ++from) {
        ASSERT_EQ(received_splits[from], (from + rank) % 3) << name << " from rank " << from;
        received_rows += (from + rank) % 3;
      }
      ASSERT_EQ(out.shape(), (std::vector<int64_t>{received_rows, width}));
      const auto* got = static_cast<const float*>(out.data());
      row = 0;
      for (int from = 0; from < size(); ++from) {
        for (int64_t j = 0; j < (from + rank) % 3; ++j, ++row) {
          for (int64_t k = 0; k < width; ++k) {
            ASSERT_EQ(got[row * width + k], static_cast<float>(from * 1000 + rank * 100 + j * 10 + k % 10))
                << name << " row " << row;
          }
        }
      }
    }
  });
}

TEST_P(Collectives, Reducescatter) {
  group_->Run([&](int rank, Engine& engine) {
    for (DataType dtype : {DataType::FLOAT32, DataType::INT32}) {
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVERAGE}) {
        // size*2 + 1 rows: the first rank gets one more row than the others.
        for (int64_t width : {1, 3, 700}) {
          const int64_t rows = size() * 2 + 1;
          std::vector<char> in(rows * width * DataTypeSize(dtype));
          for (int64_t i = 0; i < rows * width; ++i) Store(dtype, in.data(), i, Value(dtype, op, i, rank));
          const std::string name = std::string("reducescatter.") + DataTypeName(dtype) + "." + ReduceOpName(op) + "." +
                                   std::to_string(width);
          Request request = MakeRequest(OpType::REDUCESCATTER, name, dtype, {rows, width});
          request.reduce_op = op;
          auto state = SubmitAndWait(engine, {request}, {MakeEntry(name, in.data(), nullptr, dtype, {rows, width})});
          ExpectOk(*state, name);
          const OutputBuffer& out = *state->outputs().at(0).at(0);
          const int64_t my_rows = 2 + (rank == 0 ? 1 : 0);
          ASSERT_EQ(out.shape(), (std::vector<int64_t>{my_rows, width})) << name;
          const int64_t first_row = rank == 0 ? 0 : 3 + (rank - 1) * 2;
          for (int64_t i = 0; i < my_rows * width; ++i) {
            ExpectClose(dtype, Expected(dtype, op, first_row * width + i, size()), Load(dtype, out.data(), i),
                        name + " element " + std::to_string(i));
          }
        }
      }
    }
  });
}

// Ranks that disagree get the coordinator's error on every rank, and the engines go on working.
TEST_P(Collectives, MismatchFailsEveryRankAndTheEnginesGoOn) {
  group_->Run([&](int rank, Engine& engine) {
    const int64_t count = rank == size() - 1 ? 5 : 4;
    std::vector<float> buffer(count, 1.0f);
    auto state = SubmitAndWait(engine, {MakeRequest(OpType::ALLREDUCE, "bad", DataType::FLOAT32, {count})},
                               {MakeEntry("bad", buffer.data(), buffer.data(), DataType::FLOAT32, {count})});
    const Status status = state->status();
    EXPECT_EQ(status.type(), StatusType::PRECONDITION_ERROR) << "rank " << rank;
    EXPECT_NE(status.reason().find("Mismatched ALLREDUCE tensor shapes"), std::string::npos) << status.reason();

    std::vector<float> good(3, static_cast<float>(rank));
    state = SubmitAndWait(engine, {MakeRequest(OpType::ALLREDUCE, "good", DataType::FLOAT32, {3})},
                          {MakeEntry("good", good.data(), good.data(), DataType::FLOAT32, {3})});
    ExpectOk(*state, "allreduce after the error");
    EXPECT_EQ(good[2], static_cast<float>(size() * (size() - 1) / 2));
  });
}

// Caller execution (engine.h): a caller that waits runs the cycles itself when no other thread
// is in one. Two threads per rank submit and wait in turn on their own allreduces (so callers
// contend for the cycle with each other and with the background thread); every result must be
// right. With HOROVOD_CALLER_EXECUTION=1 (the default) callers ran cycles on every rank; with 0
// none did.
class CallerExecution : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(CallerExecution, ConcurrentWaitersGetTheirResults) {
  const auto [on, size] = GetParam();
  EngineGroup group(size, {{"HOROVOD_CALLER_EXECUTION", on ? "1" : "0"}});
  constexpr int kThreads = 2, kOps = 40;
  group.Run([&, size = size](int rank, Engine& engine) {
    std::vector<std::thread> threads;
    std::vector<std::string> errors(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          for (int i = 0; i < kOps; ++i) {
            const std::string name = "caller." + std::to_string(t) + "." + std::to_string(i);
            const int64_t count = 1 + (i * 97) % 3000;
            std::vector<float> buffer(count);
            for (int64_t k = 0; k < count; ++k) buffer[k] = static_cast<float>(rank + t + k % 5);
            auto state = SubmitAndWait(engine, {MakeRequest(OpType::ALLREDUCE, name, DataType::FLOAT32, {count})},
                                       {MakeEntry(name, buffer.data(), buffer.data(), DataType::FLOAT32, {count})});
            ExpectOk(*state, name);
            for (int64_t k = 0; k < count; ++k) {
              const float expected = static_cast<float>(size * (size - 1) / 2 + size * (t + k % 5));
              if (buffer[k] != expected) {
                throw std::runtime_error(name + " element " + std::to_string(k) + ": expected " +
                                         std::to_string(expected) + ", got " + std::to_string(buffer[k]));
              }
            }
          }
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (const auto& error : errors) EXPECT_EQ(error, "") << "rank " << rank;
    if (on) {
      EXPECT_GT(engine.caller_cycles(), 0) << "rank " << rank;
    } else {
      EXPECT_EQ(engine.caller_cycles(), 0) << "rank " << rank;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Engines, CallerExecution, ::testing::Combine(::testing::Bool(), ::testing::Values(2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<bool, int>>& info) {
                           return std::string(std::get<0>(info.param) ? "on" : "off") + "_np" +
                                  std::to_string(std::get<1>(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(
    Engines, Collectives,
    ::testing::Combine(::testing::Values(Transport{"gloo", false}, Transport{"shm", true}), ::testing::Values(2, 3, 4)),
    [](const ::testing::TestParamInfo<std::tuple<Transport, int>>& info) {
      return std::string(std::get<0>(info.param).name) + "_np" + std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace horovod
