// The flight recorder's ring (engine/flight_recorder.h): what it keeps, the JSON it writes, and
// its files.
#include "engine/flight_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace horovod {
namespace {

Request MakeRequest(const std::string& name, OpType type, std::vector<int64_t> shape, DataType dtype) {
  Request r;
  r.name = name;
  r.type = type;
  r.shape = std::move(shape);
  r.dtype = dtype;
  return r;
}

size_t Count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(FlightRecorder, OffRecordsNothing) {
  FlightRecorder recorder(0, "", 0, 1, "host-a");
  EXPECT_FALSE(recorder.enabled());
  EXPECT_EQ(recorder.Submitted({MakeRequest("allreduce.x", OpType::ALLREDUCE, {4}, DataType::FLOAT32)}, 0), 0u);
  TensorTableEntry entry;
  recorder.Started({&entry, nullptr}, 1);  // ignored
  recorder.Ended({&entry}, "");
  recorder.Ended(0, 1, "");
}

TEST(FlightRecorder, KeepsTheLastOperationsWithTheirTimesAndOutcomes) {
  FlightRecorder recorder(3, "", 1, 2, "host-b");
  std::vector<TensorTableEntry> entries(5);
  for (int i = 0; i < 5; ++i) {
    entries[i].flight_id = recorder.Submitted(
        {MakeRequest("allreduce.t" + std::to_string(i), OpType::ALLREDUCE, {2, 3}, DataType::FLOAT64)},
        i % 2);  // sets 0 and 1 alternate
  }
  recorder.Started({&entries[0]}, 5);  // overwritten: ignored
  recorder.Started({&entries[3], nullptr, &entries[4]}, WallMicros());
  recorder.Ended({&entries[3]}, "");
  recorder.Ended(entries[4].flight_id, 1, "Mismatched \"shapes\"\n");
  const std::string json = recorder.ToJson("on demand", {{0, {0, 1}}, {1, {1}}});
  EXPECT_EQ(Count(json, "\"seq\":"), 3u) << json;
  EXPECT_EQ(json.find("allreduce.t1"), std::string::npos) << json;
  // Oldest first; sequence numbers count per set: t2 is set 0's second, t3 set 1's second, t4
  // set 0's third.
  const size_t t2 = json.find("{\"seq\": 1, \"process_set\": 0, \"name\": \"allreduce.t2\"");
  const size_t t3 = json.find("{\"seq\": 1, \"process_set\": 1, \"name\": \"allreduce.t3\"");
  const size_t t4 = json.find("{\"seq\": 2, \"process_set\": 0, \"name\": \"allreduce.t4\"");
  ASSERT_NE(t2, std::string::npos) << json;
  ASSERT_NE(t3, std::string::npos) << json;
  ASSERT_NE(t4, std::string::npos) << json;
  EXPECT_LT(t2, t3);
  EXPECT_LT(t3, t4);
  EXPECT_NE(json.find("\"collective\": \"ALLREDUCE\", \"dtype\": \"float64\", \"shape\": [2, 3], \"bytes\": 48"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"negotiated_us\": null, \"started_us\": null, \"ended_us\": null, \"outcome\": \"pending\""),
            std::string::npos)
      << json;
  EXPECT_EQ(Count(json, "\"outcome\": \"completed\""), 1u) << json;
  EXPECT_NE(json.find("\"outcome\": \"failed\", \"error\": \"Mismatched \\\"shapes\\\"\\n\""), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"rank\": 1, \"size\": 2, \"host\": \"host-b\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"reason\": \"on demand\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"capacity\": 3, \"process_sets\": {\"0\": [0, 1], \"1\": [1]}"), std::string::npos) << json;
}

TEST(FlightRecorder, DumpWritesTheRanksFileAndCreatesTheDirectory) {
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) /
                                    ("horovod-flight-recorder-test-" + std::to_string(getpid())) / "nested";
  FlightRecorder recorder(4, dir.string(), 3, 4, "host-c");
  // A group gets consecutive ids.
  const FlightRecorder::Id first = recorder.Submitted(
      {MakeRequest("broadcast.w", OpType::BROADCAST, {}, DataType::INT32),
       MakeRequest("broadcast.v", OpType::BROADCAST, {2}, DataType::INT32)},
      0);
  recorder.Ended(first, 2, "refused");
  const std::string path = recorder.Dump(dir.string(), "signal SIGUSR2", {});
  EXPECT_EQ(path, (dir / "flight_recorder_rank_3.json").string());
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_NE(text.str().find("\"name\": \"broadcast.w\", \"collective\": \"BROADCAST\", \"dtype\": \"int32\", "
                            "\"shape\": [], \"bytes\": 4"),
            std::string::npos)
      << text.str();
  EXPECT_EQ(Count(text.str(), "\"outcome\": \"failed\", \"error\": \"refused\""), 2u) << text.str();
  EXPECT_NE(text.str().find("{\"seq\": 1, \"process_set\": 0, \"name\": \"broadcast.v\""), std::string::npos)
      << text.str();
  // Nothing else is left in the directory (the temporary file was renamed).
  size_t entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) entries += entry.is_regular_file() ? 1 : 0;
  EXPECT_EQ(entries, 1u);
  std::filesystem::remove_all(dir.parent_path());
}

TEST(FlightRecorder, DumpIntoAFileFailsWithAnError) {
  const std::filesystem::path blocker =
      std::filesystem::path(testing::TempDir()) / ("horovod-flight-recorder-blocker-" + std::to_string(getpid()));
  std::ofstream(blocker) << "not a directory";
  FlightRecorder recorder(2, "", 0, 1, "h");
  EXPECT_THROW(recorder.Dump((blocker / "sub").string(), "x", {}), EngineError);
  std::filesystem::remove(blocker);
}

}  // namespace
}  // namespace horovod
