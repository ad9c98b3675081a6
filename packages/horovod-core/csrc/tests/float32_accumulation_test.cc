// bfloat16 reductions end to end (collectives/float32_accumulation.h): N engines over Gloo on
// loopback and over the shared-memory transport, at 2, 3 and 4 ranks, against the float32
// reduction of the ranks' values rounded once to bfloat16, compared bit for bit. The values have
// 8 significant bits and exponents within a few powers of two of each other, so that float32 holds
// every partial sum exactly (the reference does not depend on the order of the sum) while bfloat16
// does not (a reduction that rounded its partial sums would differ in many elements).
#include <gtest/gtest.h>

#include <cstdint>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/reduction.h"
#include "engine/engine.h"
#include "test_support.h"

namespace horovod {
namespace {

using testing::EngineGroup;
using testing::MakeEntry;
using testing::MakeRequest;
using testing::SubmitAndWait;

// Rank `rank`'s value at element i: +-(1 + k/128) * 2^e, k < 128, e in -2..2 (Sum, Min, Max), or
// 1 + k/8 for Product (four factors of 4 significant bits fit float32's 24).
float Value(ReduceOp op, int64_t i, int rank) {
  if (op == ReduceOp::PRODUCT) return 1.0f + static_cast<float>((i * 5 + rank * 3) % 8) / 8.0f;
  const float mantissa = 1.0f + static_cast<float>((i * 37 + rank * 59) % 128) / 128.0f;
  const float sign = (i + rank) % 3 == 0 ? -1.0f : 1.0f;
  return sign * std::ldexp(mantissa, static_cast<int>((i * 3 + rank) % 5) - 2);
}

uint16_t Input(ReduceOp op, int64_t i, int rank) { return FloatToBFloat16(Value(op, i, rank)); }

// The float32 reduction of every rank's (prescaled) value, postscaled, rounded once.
uint16_t Expected(ReduceOp op, int64_t i, int size, float prescale, float postscale) {
  float acc = BFloat16ToFloat(Input(op, i, 0)) * prescale;
  for (int r = 1; r < size; ++r) {
    const float v = BFloat16ToFloat(Input(op, i, r)) * prescale;
    switch (op) {
      case ReduceOp::SUM: acc += v; break;
      case ReduceOp::MIN: acc = std::min(acc, v); break;
      case ReduceOp::MAX: acc = std::max(acc, v); break;
      case ReduceOp::PRODUCT: acc *= v; break;
      default: throw std::invalid_argument("op not used by these tests");
    }
  }
  return FloatToBFloat16(acc * postscale);
}

void ExpectOk(HandleState& state, const std::string& what) {
  Status status = state.status();
  if (!status.ok()) throw std::runtime_error(what + " failed: " + status.reason());
}

class Bfloat16 : public ::testing::TestWithParam<std::tuple<bool, int>> {
 protected:
  void SetUp() override {
    group_ = std::make_unique<EngineGroup>(
        size(), std::map<std::string, std::string>{{"HOROVOD_SHARED_MEMORY", shared_memory() ? "1" : "0"}});
  }
  void TearDown() override { group_.reset(); }
  bool shared_memory() const { return std::get<0>(GetParam()); }
  int size() const { return std::get<1>(GetParam()); }

  std::unique_ptr<EngineGroup> group_;
};

const std::vector<int64_t> kCounts = {1, 7, 2048, (1 << 19) + 3};  // up to 1 MiB + 6 bytes

struct Case {
  ReduceOp op;  // as requested (AVERAGE: SUM and a postscale of 1 / size)
  float prescale;
  float postscale;
};

TEST_P(Bfloat16, AllreduceRoundsOnce) {
  const std::vector<Case> cases = {{ReduceOp::SUM, 1.0f, 1.0f},     {ReduceOp::AVERAGE, 1.0f, 1.0f},
                                   {ReduceOp::SUM, 3.0f, 0.1f},     {ReduceOp::MIN, 1.0f, 1.0f},
                                   {ReduceOp::MAX, 1.0f, 0.3f},     {ReduceOp::PRODUCT, 1.0f, 1.0f}};
  group_->Run([&](int rank, Engine& engine) {
    for (const Case& c : cases) {
      // Small tensors twice: the second time from the response cache, whose round may carry a small
      // allreduce's data (eager allreduce, reduced there in the tensor's dtype).
      std::vector<int64_t> counts = kCounts;
      counts.insert(counts.end(), {1, 7, 2048});
      for (int64_t count : counts) {
        const ReduceOp op = c.op == ReduceOp::AVERAGE ? ReduceOp::SUM : c.op;
        const float postscale = c.op == ReduceOp::AVERAGE ? 1.0f / static_cast<float>(size()) : c.postscale;
        const std::string name = std::string("bf16.") + ReduceOpName(c.op) + "." + std::to_string(c.prescale) + "." +
                                 std::to_string(count);
        std::vector<uint16_t> in(count), out(count);
        for (int64_t i = 0; i < count; ++i) in[i] = Input(op, i, rank);
        Request request = MakeRequest(OpType::ALLREDUCE, name, DataType::BFLOAT16, {count});
        request.reduce_op = c.op;
        request.prescale_factor = c.prescale;
        request.postscale_factor = c.postscale;
        auto state = SubmitAndWait(engine, {request}, {MakeEntry(name, in.data(), out.data(), DataType::BFLOAT16, {count})});
        ExpectOk(*state, name);
        int64_t wrong = 0, first = -1;
        for (int64_t i = 0; i < count; ++i) {
          if (out[i] != Expected(op, i, size(), c.prescale, postscale)) {
            if (first < 0) first = i;
            ++wrong;
          }
        }
        ASSERT_EQ(wrong, 0) << name << " on rank " << rank << ": first at " << first << ", expected "
                            << BFloat16ToFloat(Expected(op, first, size(), c.prescale, postscale)) << ", got "
                            << BFloat16ToFloat(out[first]);
      }
    }
  });
}

// bfloat16 tensors fused with float32 ones, with scaling; three rounds (the later ones from the
// response cache).
TEST_P(Bfloat16, FusedWithFloat32) {
  const int64_t count = 1001;
  group_->Run([&](int rank, Engine& engine) {
    for (int round = 0; round < 3; ++round) {
      std::vector<uint16_t> a(count), b(count);
      std::vector<float> f(count);
      for (int64_t i = 0; i < count; ++i) {
        a[i] = Input(ReduceOp::SUM, i, rank);
        b[i] = Input(ReduceOp::SUM, i + 11, rank);
        f[i] = Value(ReduceOp::SUM, i, rank);
      }
      std::vector<Request> requests;
      std::vector<TensorTableEntry> entries;
      const std::vector<std::pair<std::string, std::pair<void*, DataType>>> tensors = {
          {"fused.bf16.a", {a.data(), DataType::BFLOAT16}},
          {"fused.f32", {f.data(), DataType::FLOAT32}},
          {"fused.bf16.b", {b.data(), DataType::BFLOAT16}}};
      for (const auto& [name, data] : tensors) {
        Request request = MakeRequest(OpType::ALLREDUCE, name, data.second, {count});
        request.reduce_op = ReduceOp::AVERAGE;
        request.prescale_factor = 3.0;
        requests.push_back(request);
        entries.push_back(MakeEntry(name, data.first, data.first, data.second, {count}));
      }
      auto state = SubmitAndWait(engine, requests, entries);
      ExpectOk(*state, "fused");
      const float average = 1.0f / static_cast<float>(size());
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(a[i], Expected(ReduceOp::SUM, i, size(), 3.0f, average)) << "a at " << i << " round " << round;
        ASSERT_EQ(b[i], Expected(ReduceOp::SUM, i + 11, size(), 3.0f, average)) << "b at " << i << " round " << round;
        float sum = 0;
        for (int r = 0; r < size(); ++r) sum += Value(ReduceOp::SUM, i, r) * 3.0f;
        ASSERT_NEAR(f[i], sum / static_cast<float>(size()), 1e-5f * (1 + std::fabs(sum))) << "f32 at " << i;
      }
    }
  });
}

TEST_P(Bfloat16, ReducescatterRoundsOnce) {
  const int64_t rows = 1003, columns = 3;
  group_->Run([&](int rank, Engine& engine) {
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVERAGE}) {
      const std::string name = std::string("bf16.reducescatter.") + ReduceOpName(op);
      std::vector<uint16_t> in(rows * columns);
      for (int64_t i = 0; i < rows * columns; ++i) in[i] = Input(ReduceOp::SUM, i, rank);
      Request request = MakeRequest(OpType::REDUCESCATTER, name, DataType::BFLOAT16, {rows, columns});
      request.reduce_op = op;
      auto state = SubmitAndWait(engine, {request}, {MakeEntry(name, in.data(), nullptr, DataType::BFLOAT16, {rows, columns})});
      ExpectOk(*state, name);
      int64_t first_row = 0;
      for (int r = 0; r < rank; ++r) first_row += rows / size() + (r < rows % size() ? 1 : 0);
      const int64_t my_rows = rows / size() + (rank < rows % size() ? 1 : 0);
      const OutputBuffer& out = *state->outputs().at(0).at(0);
      ASSERT_EQ(out.shape(), (std::vector<int64_t>{my_rows, columns})) << name;
      const auto* got = static_cast<const uint16_t*>(out.data());
      const float postscale = op == ReduceOp::AVERAGE ? 1.0f / static_cast<float>(size()) : 1.0f;
      for (int64_t i = 0; i < my_rows * columns; ++i) {
        ASSERT_EQ(got[i], Expected(ReduceOp::SUM, first_row * columns + i, size(), 1.0f, postscale))
            << name << " rank " << rank << " at " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, Bfloat16, ::testing::Combine(::testing::Bool(), ::testing::Values(2, 3, 4)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "shm" : "gloo") + "_np" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace horovod
