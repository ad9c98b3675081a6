// The knob table: defaults, the values each kind of knob accepts, and errors naming the variable.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/common.h"
#include "common/config.h"

namespace horovod {
namespace {

// Parses `env` and returns the error text, failing unless it is INVALID_ARGUMENT.
std::string ParseError(const std::map<std::string, std::string>& env) {
  try {
    ParseConfig(env);
  } catch (const EngineError& e) {
    EXPECT_EQ(e.status().type(), StatusType::INVALID_ARGUMENT);
    return e.what();
  }
  ADD_FAILURE() << "ParseConfig accepted the values";
  return "";
}

TEST(Config, EmptyEnvironmentGivesTheDefaults) {
  const Config c = ParseConfig({});
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.size, 1);
  EXPECT_EQ(c.local_size, 1);
  EXPECT_EQ(c.fusion_threshold_bytes, 128 * 1024 * 1024);
  EXPECT_EQ(c.cache_capacity, 1024);
  EXPECT_DOUBLE_EQ(c.cycle_time_ms, 1.0);
  EXPECT_DOUBLE_EQ(c.gloo_timeout_seconds, 30.0);
  EXPECT_DOUBLE_EQ(c.stall_check_time_seconds, 60.0);
  EXPECT_DOUBLE_EQ(c.deadlock_timeout_seconds, 5.0);
  EXPECT_EQ(c.log_level, LogLevel::WARNING);
  EXPECT_TRUE(c.shared_memory);
  EXPECT_TRUE(c.shared_memory_single_copy);
  EXPECT_FALSE(c.autotune);
  EXPECT_FALSE(c.hostname_given);
  EXPECT_FALSE(c.fusion_threshold_fixed);
  EXPECT_FALSE(c.cycle_time_fixed);
  EXPECT_FALSE(c.cache_capacity_fixed);
  EXPECT_FALSE(c.launched_by_mpi);
}

// The table's default texts are what the Config struct holds when nothing is set: setting every
// variable to its documented default changes no field, the empty defaults ("unset") included.
TEST(Config, DocumentedDefaultsMatchTheStruct) {
  std::map<std::string, std::string> env;
  std::set<std::string> names;
  for (const Knob& knob : Knobs()) {
    EXPECT_TRUE(names.insert(knob.name).second) << knob.name << " is declared twice";
    EXPECT_EQ(std::string(knob.name).rfind("HOROVOD_", 0), 0u) << knob.name;
    EXPECT_GT(std::string(knob.doc).size(), 0u) << knob.name;
    env[knob.name] = knob.default_value;
  }
  const Config d = ParseConfig({});
  const Config c = ParseConfig(env);
  EXPECT_EQ(c.fusion_threshold_bytes, d.fusion_threshold_bytes);
  EXPECT_EQ(c.cache_capacity, d.cache_capacity);
  EXPECT_DOUBLE_EQ(c.cycle_time_ms, d.cycle_time_ms);
  EXPECT_DOUBLE_EQ(c.gloo_timeout_seconds, d.gloo_timeout_seconds);
  EXPECT_DOUBLE_EQ(c.stall_check_time_seconds, d.stall_check_time_seconds);
  EXPECT_DOUBLE_EQ(c.stall_shutdown_time_seconds, d.stall_shutdown_time_seconds);
  EXPECT_DOUBLE_EQ(c.deadlock_timeout_seconds, d.deadlock_timeout_seconds);
  EXPECT_DOUBLE_EQ(c.autotune_gaussian_process_noise, d.autotune_gaussian_process_noise);
  EXPECT_EQ(c.autotune_warmup_samples, d.autotune_warmup_samples);
  EXPECT_EQ(c.autotune_steps_per_sample, d.autotune_steps_per_sample);
  EXPECT_EQ(c.autotune_bayes_opt_max_samples, d.autotune_bayes_opt_max_samples);
  EXPECT_EQ(c.adasum_mpi_chunk_size, d.adasum_mpi_chunk_size);
  EXPECT_EQ(c.num_nccl_streams, d.num_nccl_streams);
  EXPECT_EQ(c.rendezvous_port, d.rendezvous_port);
  EXPECT_EQ(c.hostname, d.hostname);
  EXPECT_EQ(c.log_level, d.log_level);
  EXPECT_EQ(c.shared_memory, d.shared_memory);
  EXPECT_EQ(c.shared_memory_single_copy, d.shared_memory_single_copy);
  EXPECT_EQ(c.batch_d2d_memcopies, d.batch_d2d_memcopies);
  EXPECT_EQ(c.autotune, d.autotune);
  EXPECT_EQ(c.elastic, d.elastic);
  EXPECT_EQ(c.disable_group_fusion, d.disable_group_fusion);
  EXPECT_EQ(c.controller, d.controller);
  EXPECT_EQ(c.cpu_operations, d.cpu_operations);
  EXPECT_EQ(c.gloo_iface, d.gloo_iface);
  // ...but a variable that is set counts as fixed for autotune.
  EXPECT_TRUE(c.fusion_threshold_fixed);
  EXPECT_TRUE(c.cycle_time_fixed);
  EXPECT_TRUE(c.cache_capacity_fixed);
}

TEST(Config, ValuesAreParsed) {
  const Config c = ParseConfig({{"HOROVOD_RANK", "2"},
                                {"HOROVOD_SIZE", "4"},
                                {"HOROVOD_LOCAL_RANK", "0"},
                                {"HOROVOD_LOCAL_SIZE", "2"},
                                {"HOROVOD_FUSION_THRESHOLD", "0"},
                                {"HOROVOD_CYCLE_TIME", "0.5"},
                                {"HOROVOD_CACHE_CAPACITY", "0"},
                                {"HOROVOD_CONTROLLER", "GLOO"},
                                {"HOROVOD_CPU_OPERATIONS", "Mpi"},
                                {"HOROVOD_LOG_LEVEL", "DeBuG"},
                                {"HOROVOD_AUTOTUNE", "3"},
                                {"HOROVOD_ELASTIC", "-1"},
                                {"HOROVOD_HOSTNAME", "node7"},
                                {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.size, 4);
  EXPECT_EQ(c.local_size, 2);
  EXPECT_EQ(c.fusion_threshold_bytes, 0);
  EXPECT_DOUBLE_EQ(c.cycle_time_ms, 0.5);
  EXPECT_EQ(c.cache_capacity, 0);
  EXPECT_EQ(c.controller, "gloo");
  EXPECT_EQ(c.cpu_operations, "mpi");
  EXPECT_EQ(c.log_level, LogLevel::DEBUG);
  EXPECT_TRUE(c.autotune);    // booleans: an integer > 0
  EXPECT_FALSE(c.elastic);
  EXPECT_EQ(c.hostname, "node7");
  EXPECT_TRUE(c.hostname_given);
  EXPECT_TRUE(c.launched_by_mpi);
  EXPECT_EQ(ParseConfig({{"HOROVOD_LOG_LEVEL", "loud"}}).log_level, LogLevel::WARNING);
}

TEST(Config, BadValuesRaiseNamingTheVariable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"HOROVOD_FUSION_THRESHOLD", "lots"},  {"HOROVOD_FUSION_THRESHOLD", "-1"},
      {"HOROVOD_FUSION_THRESHOLD", "64MB"},  {"HOROVOD_FUSION_THRESHOLD", ""},
      {"HOROVOD_CYCLE_TIME", "fast"},        {"HOROVOD_CYCLE_TIME", "-0.1"},
      {"HOROVOD_CACHE_CAPACITY", "1.5"},     {"HOROVOD_SIZE", "0"},
      {"HOROVOD_RANK", "-1"},                {"HOROVOD_GLOO_TIMEOUT_SECONDS", "0"},
      {"HOROVOD_CONTROLLER", "nccl"},        {"HOROVOD_CPU_OPERATIONS", "tcp"},
      {"HOROVOD_AUTOTUNE", "yes"},           {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "1.5"},
      {"HOROVOD_NUM_NCCL_STREAMS", "0"},     {"HOROVOD_STALL_CHECK_TIME_SECONDS", "1e"},
      {"HOROVOD_THREAD_AFFINITY", "0;1"},    {"HOROVOD_THREAD_AFFINITY", "1,,2"},
      {"HOROVOD_THREAD_AFFINITY", "-1"},     {"HOROVOD_THREAD_AFFINITY", "2,x"},
  };
  for (const auto& [name, value] : bad) {
    const std::string message = ParseError({{name, value}});
    EXPECT_NE(message.find(name), std::string::npos) << message;
    EXPECT_NE(message.find("'" + value + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("expected"), std::string::npos) << message;
  }
}

TEST(Config, ThreadAffinityHasACoreForEachRankOfTheHost) {
  EXPECT_TRUE(ParseConfig({}).thread_affinity.empty());
  EXPECT_TRUE(ParseConfig({{"HOROVOD_THREAD_AFFINITY", ""}}).thread_affinity.empty());
  const Config c = ParseConfig({{"HOROVOD_LOCAL_RANK", "1"}, {"HOROVOD_LOCAL_SIZE", "3"},
                                {"HOROVOD_THREAD_AFFINITY", "4,0,17,3"}});
  EXPECT_EQ(c.thread_affinity, (std::vector<int>{4, 0, 17, 3}));
  const std::string message = ParseError({{"HOROVOD_LOCAL_SIZE", "3"}, {"HOROVOD_THREAD_AFFINITY", "4,0"}});
  EXPECT_NE(message.find("HOROVOD_THREAD_AFFINITY has 2 core id(s)"), std::string::npos) << message;
  EXPECT_NE(message.find("3 ranks"), std::string::npos) << message;
}

TEST(Config, RankMustBeBelowSize) {
  EXPECT_NE(ParseError({{"HOROVOD_RANK", "2"}, {"HOROVOD_SIZE", "2"}}).find("HOROVOD_RANK=2"), std::string::npos);
  EXPECT_NE(ParseError({{"HOROVOD_LOCAL_RANK", "1"}}).find("HOROVOD_LOCAL_SIZE=1"), std::string::npos);
  EXPECT_NO_THROW(ParseConfig({{"HOROVOD_RANK", "1"}, {"HOROVOD_SIZE", "2"}}));
}

}  // namespace
}  // namespace horovod
