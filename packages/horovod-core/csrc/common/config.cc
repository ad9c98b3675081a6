#include "config.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "common.h"

namespace horovod {

namespace {

[[noreturn]] void Invalid(const char* name, const std::string& value, const std::string& expected) {
  throw EngineError(Status::InvalidArgument(std::string("Invalid value '") + value + "' for environment variable " +
                                            name + ": expected " + expected + "."));
}

int64_t ToInt(const char* name, const std::string& value, int64_t min_value) {
  char* end = nullptr;
  long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0') Invalid(name, value, "an integer");
  if (parsed < min_value) Invalid(name, value, "an integer >= " + std::to_string(min_value));
  return parsed;
}

double ToDouble(const char* name, const std::string& value, double min_value) {
  char* end = nullptr;
  double parsed = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0') Invalid(name, value, "a number");
  if (parsed < min_value) Invalid(name, value, "a number >= " + std::to_string(min_value));
  return parsed;
}

// Upstream's booleans are "true when the integer value is > 0".
bool ToBool(const char* name, const std::string& value) { return ToInt(name, value, INT64_MIN) > 0; }

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string OneOf(const char* name, const std::string& value, const std::vector<std::string>& allowed) {
  std::string lowered = Lower(value);
  if (std::find(allowed.begin(), allowed.end(), lowered) != allowed.end()) return lowered;
  std::string expected = "one of";
  for (const auto& a : allowed) expected += " " + a;
  Invalid(name, value, expected + " (case-insensitive)");
}

// A comma-separated list of core ids (HOROVOD_THREAD_AFFINITY); empty: none.
std::vector<int> ToCoreList(const char* name, const std::string& value) {
  std::vector<int> cores;
  if (value.empty()) return cores;
  for (size_t at = 0;;) {
    const size_t comma = value.find(',', at);
    const std::string item = value.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    const long long core = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || core < 0 || core >= CPU_SETSIZE) {
      Invalid(name, value, "a comma-separated list of core ids (integers from 0), entry [local rank] for each "
                           "rank of the host");
    }
    cores.push_back(static_cast<int>(core));
    if (comma == std::string::npos) return cores;
    at = comma + 1;
  }
}

LogLevel ToLogLevel(const std::string& value) {
  static const std::vector<std::pair<std::string, LogLevel>> levels = {
      {"trace", LogLevel::TRACE}, {"debug", LogLevel::DEBUG}, {"info", LogLevel::INFO},
      {"warning", LogLevel::WARNING}, {"error", LogLevel::ERROR}, {"fatal", LogLevel::FATAL}};
  std::string lowered = Lower(value);
  for (const auto& [text, level] : levels)
    if (lowered == text) return level;
  return LogLevel::WARNING;  // spec: an unknown level means warning
}

#define INT_KNOB(NAME, FIELD, MIN) [](Config& c, const std::string& v) { c.FIELD = ToInt(NAME, v, MIN); }
#define DOUBLE_KNOB(NAME, FIELD, MIN) [](Config& c, const std::string& v) { c.FIELD = ToDouble(NAME, v, MIN); }
#define BOOL_KNOB(NAME, FIELD) [](Config& c, const std::string& v) { c.FIELD = ToBool(NAME, v); }
#define STRING_KNOB(FIELD) [](Config& c, const std::string& v) { c.FIELD = v; }

}  // namespace

const std::vector<Knob>& Knobs() {
  static const std::vector<Knob> knobs = {
      {"HOROVOD_RANK", "0", "global rank of this process", INT_KNOB("HOROVOD_RANK", rank, 0)},
      {"HOROVOD_SIZE", "1", "number of processes in the job", INT_KNOB("HOROVOD_SIZE", size, 1)},
      {"HOROVOD_LOCAL_RANK", "0", "index of this process on its host", INT_KNOB("HOROVOD_LOCAL_RANK", local_rank, 0)},
      {"HOROVOD_LOCAL_SIZE", "1", "processes on this host", INT_KNOB("HOROVOD_LOCAL_SIZE", local_size, 1)},
      {"HOROVOD_CROSS_RANK", "0", "index of this host among hosts with this local rank",
       INT_KNOB("HOROVOD_CROSS_RANK", cross_rank, 0)},
      {"HOROVOD_CROSS_SIZE", "1", "hosts with a process of this local rank",
       INT_KNOB("HOROVOD_CROSS_SIZE", cross_size, 1)},
      {"HOROVOD_HOSTNAME", "localhost", "host identity given by the launcher", STRING_KNOB(hostname)},
      {"HOROVOD_GLOO_RENDEZVOUS_ADDR", "", "address of the rendezvous store (unset: single process)",
       STRING_KNOB(rendezvous_addr)},
      {"HOROVOD_GLOO_RENDEZVOUS_PORT", "-1", "port of the rendezvous store",
       INT_KNOB("HOROVOD_GLOO_RENDEZVOUS_PORT", rendezvous_port, -1)},
      {"HOROVOD_GLOO_IFACE", "", "network interface for the data transport", STRING_KNOB(gloo_iface)},
      {"HOROVOD_GLOO_TIMEOUT_SECONDS", "30", "rendezvous and collective I/O timeout, seconds",
       DOUBLE_KNOB("HOROVOD_GLOO_TIMEOUT_SECONDS", gloo_timeout_seconds, 0.001)},
      {"HOROVOD_GLOO_BUSY_POLL", "auto",
       "how Gloo's collectives wait for a peer's message: 1 polls the socket, 0 sleeps until data arrives, auto "
       "polls for up to 200 microseconds first when this host has a CPU per rank",
       [](Config& c, const std::string& v) { c.gloo_busy_poll = OneOf("HOROVOD_GLOO_BUSY_POLL", v, {"auto", "0", "1"}); }},
      // Empty, the documented default, means unset: the backend is chosen as engine.h says.
      {"HOROVOD_CONTROLLER", "", "negotiation transport: gloo or mpi",
       [](Config& c, const std::string& v) {
         c.controller = v.empty() ? "" : OneOf("HOROVOD_CONTROLLER", v, {"gloo", "mpi"});
       }},
      {"HOROVOD_CPU_OPERATIONS", "", "backend for CPU tensors: gloo, mpi or ccl",
       [](Config& c, const std::string& v) {
         c.cpu_operations = v.empty() ? "" : OneOf("HOROVOD_CPU_OPERATIONS", v, {"gloo", "mpi", "ccl"});
       }},
      {"HOROVOD_CYCLE_TIME", "1", "longest wait of the background thread between cycles, milliseconds",
       DOUBLE_KNOB("HOROVOD_CYCLE_TIME", cycle_time_ms, 0.0)},
      {"HOROVOD_CALLER_EXECUTION", "1",
       "a thread that waits on an unfinished operation runs the negotiation and the collectives itself "
       "instead of waking the background thread (0: only the background thread runs them)",
       BOOL_KNOB("HOROVOD_CALLER_EXECUTION", caller_execution)},
      {"HOROVOD_FUSION_THRESHOLD", "134217728", "fusion buffer size in bytes; 0 disables fusion",
       INT_KNOB("HOROVOD_FUSION_THRESHOLD", fusion_threshold_bytes, 0)},
      {"HOROVOD_CACHE_CAPACITY", "1024", "response cache entries; 0 disables the cache",
       INT_KNOB("HOROVOD_CACHE_CAPACITY", cache_capacity, 0)},
      {"HOROVOD_DISABLE_GROUP_FUSION", "0", "fuse a group only with itself",
       BOOL_KNOB("HOROVOD_DISABLE_GROUP_FUSION", disable_group_fusion)},
      {"HOROVOD_TIMELINE", "", "timeline file written by rank 0, or DYNAMIC", STRING_KNOB(timeline)},
      {"HOROVOD_TIMELINE_MARK_CYCLES", "0", "write CYCLE_START markers into the timeline",
       BOOL_KNOB("HOROVOD_TIMELINE_MARK_CYCLES", timeline_mark_cycles)},
      {"HOROVOD_STALL_CHECK_DISABLE", "0", "disable the stall inspector",
       BOOL_KNOB("HOROVOD_STALL_CHECK_DISABLE", stall_check_disable)},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "60", "stall warning threshold, seconds",
       DOUBLE_KNOB("HOROVOD_STALL_CHECK_TIME_SECONDS", stall_check_time_seconds, 0.0)},
      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0", "shut down after a stall this long, seconds (0: never)",
       DOUBLE_KNOB("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", stall_shutdown_time_seconds, 0.0)},
      {"HOROVOD_DEADLOCK_TIMEOUT_SECONDS", "5",
       "fail the pending operations once every rank of a set has waited this long on operations that cannot "
       "complete, seconds (0: never)",
       DOUBLE_KNOB("HOROVOD_DEADLOCK_TIMEOUT_SECONDS", deadlock_timeout_seconds, 0.0)},
      {"HOROVOD_FLIGHT_RECORDER_SIZE", "1024", "operations the flight recorder keeps per rank (0: off)",
       INT_KNOB("HOROVOD_FLIGHT_RECORDER_SIZE", flight_recorder_size, 0)},
      {"HOROVOD_FLIGHT_RECORDER_DIR", "",
       "directory the flight recorder is written to on a deadlock, mismatch or stall error or a lost peer "
       "(empty: only on demand)",
       STRING_KNOB(flight_recorder_dir)},
      {"HOROVOD_AUTOTUNE", "0", "tune fusion threshold, cycle time and response cache (rank 0 decides)", BOOL_KNOB("HOROVOD_AUTOTUNE", autotune)},
      {"HOROVOD_AUTOTUNE_LOG", "", "CSV log of autotune samples (rank 0)", STRING_KNOB(autotune_log)},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "3", "autotune samples discarded at the start",
       INT_KNOB("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", autotune_warmup_samples, 0)},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "10", "steps per autotune sample",
       INT_KNOB("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", autotune_steps_per_sample, 0)},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "20", "Bayesian optimisation samples",
       INT_KNOB("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", autotune_bayes_opt_max_samples, 0)},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.8", "noise of the Gaussian-process regression, in [0, 1]",
       [](Config& c, const std::string& v) {
         c.autotune_gaussian_process_noise = ToDouble("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", v, 0.0);
         if (c.autotune_gaussian_process_noise > 1.0) {
           Invalid("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", v, "a number in [0, 1]");
         }
       }},
      {"HOROVOD_LOG_LEVEL", "warning", "trace, debug, info, warning, error or fatal",
       [](Config& c, const std::string& v) { c.log_level = ToLogLevel(v); }},
      {"HOROVOD_LOG_HIDE_TIME", "0", "drop the timestamp from log lines",
       BOOL_KNOB("HOROVOD_LOG_HIDE_TIME", log_hide_time)},
      {"HOROVOD_ELASTIC", "0", "elastic mode", BOOL_KNOB("HOROVOD_ELASTIC", elastic)},
      {"HOROVOD_DYNAMIC_PROCESS_SETS", "0", "allow adding and removing process sets after init",
       BOOL_KNOB("HOROVOD_DYNAMIC_PROCESS_SETS", dynamic_process_sets)},
      {"HOROVOD_MPI_THREADS_DISABLE", "0", "initialise MPI single-threaded",
       BOOL_KNOB("HOROVOD_MPI_THREADS_DISABLE", mpi_threads_disable)},
      {"HOROVOD_SHARED_MEMORY", "1",
       "collectives through shared memory when every rank of the job is on one host (0: the backend's own)",
       BOOL_KNOB("HOROVOD_SHARED_MEMORY", shared_memory)},
      {"HOROVOD_SHARED_MEMORY_SINGLE_COPY", "1",
       "large allreduces read and write the buffers of ranks on the same host directly (cross-memory attach) when "
       "allowed: through shared memory, and between the ranks of a host in a job over Gloo on several hosts",
       BOOL_KNOB("HOROVOD_SHARED_MEMORY_SINGLE_COPY", shared_memory_single_copy)},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "0", "hierarchical allreduce",
       BOOL_KNOB("HOROVOD_HIERARCHICAL_ALLREDUCE", hierarchical_allreduce)},
      {"HOROVOD_HIERARCHICAL_ALLGATHER", "0", "hierarchical allgather",
       BOOL_KNOB("HOROVOD_HIERARCHICAL_ALLGATHER", hierarchical_allgather)},
      {"HOROVOD_TORUS_ALLREDUCE", "0", "torus allreduce", BOOL_KNOB("HOROVOD_TORUS_ALLREDUCE", torus_allreduce)},
      {"HOROVOD_NUM_NCCL_STREAMS", "1", "NCCL streams per device",
       INT_KNOB("HOROVOD_NUM_NCCL_STREAMS", num_nccl_streams, 1)},
      {"HOROVOD_BATCH_D2D_MEMCOPIES", "1", "batched device copies into the fusion buffer",
       BOOL_KNOB("HOROVOD_BATCH_D2D_MEMCOPIES", batch_d2d_memcopies)},
      {"HOROVOD_ENABLE_ASYNC_COMPLETION", "0", "GPU completion through events instead of a CPU wait",
       BOOL_KNOB("HOROVOD_ENABLE_ASYNC_COMPLETION", enable_async_completion)},
      {"HOROVOD_THREAD_AFFINITY", "", "comma-separated core ids; entry [local_rank] pins the background thread",
       [](Config& c, const std::string& v) { c.thread_affinity = ToCoreList("HOROVOD_THREAD_AFFINITY", v); }},
      {"HOROVOD_THREAD_FOLLOW_CALLER", "1",
       "where this host's ranks are at least as many as the cores a rank may use, the background thread "
       "runs its cycles on the core of the thread that last submitted an operation (0: wherever the "
       "scheduler puts it)",
       BOOL_KNOB("HOROVOD_THREAD_FOLLOW_CALLER", thread_follow_caller)},
      {"HOROVOD_ADASUM_MPI_CHUNK_SIZE", "1073741824", "Adasum message chunk size, bytes",
       INT_KNOB("HOROVOD_ADASUM_MPI_CHUNK_SIZE", adasum_mpi_chunk_size, 1)},
      {"HOROVOD_ENABLE_XLA_OPS", "0", "TensorFlow XLA ops (not supported)",
       BOOL_KNOB("HOROVOD_ENABLE_XLA_OPS", enable_xla_ops)},
  };
  return knobs;
}

namespace {
// Variables that MPI launchers (Open MPI's mpirun, Hydra/PMI, PMIx) give their processes.
const char* const kMpiLauncherVariables[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
}  // namespace

std::map<std::string, std::string> ReadEnvironment() {
  std::map<std::string, std::string> env;
  for (const Knob& knob : Knobs()) {
    if (const char* value = std::getenv(knob.name)) env[knob.name] = value;
  }
  for (const char* name : kMpiLauncherVariables) {
    if (const char* value = std::getenv(name)) env[name] = value;
  }
  return env;
}

Config ParseConfig(const std::map<std::string, std::string>& env) {
  Config config;
  for (const Knob& knob : Knobs()) {
    auto it = env.find(knob.name);
    if (it == env.end()) continue;
    knob.apply(config, it->second);
  }
  config.hostname_given = env.count("HOROVOD_HOSTNAME") > 0 && !config.hostname.empty();
  config.cycle_time_fixed = env.count("HOROVOD_CYCLE_TIME") > 0;
  config.fusion_threshold_fixed = env.count("HOROVOD_FUSION_THRESHOLD") > 0;
  config.cache_capacity_fixed = env.count("HOROVOD_CACHE_CAPACITY") > 0;
  config.hierarchical_allreduce_fixed = env.count("HOROVOD_HIERARCHICAL_ALLREDUCE") > 0;
  config.hierarchical_allgather_fixed = env.count("HOROVOD_HIERARCHICAL_ALLGATHER") > 0;
  config.torus_allreduce_fixed = env.count("HOROVOD_TORUS_ALLREDUCE") > 0;
  for (const char* name : kMpiLauncherVariables) config.launched_by_mpi = config.launched_by_mpi || env.count(name);
  if (config.rank >= config.size) {
    throw EngineError(Status::InvalidArgument("HOROVOD_RANK=" + std::to_string(config.rank) +
                                              " must be smaller than HOROVOD_SIZE=" + std::to_string(config.size) +
                                              "."));
  }
  if (config.local_rank >= config.local_size) {
    throw EngineError(Status::InvalidArgument("HOROVOD_LOCAL_RANK=" + std::to_string(config.local_rank) +
                                              " must be smaller than HOROVOD_LOCAL_SIZE=" +
                                              std::to_string(config.local_size) + "."));
  }
  // (Against the local size, not the local rank, so that every rank of the host fails alike.)
  if (!config.thread_affinity.empty() && static_cast<int>(config.thread_affinity.size()) < config.local_size) {
    throw EngineError(Status::InvalidArgument(
        "HOROVOD_THREAD_AFFINITY has " + std::to_string(config.thread_affinity.size()) +
        " core id(s): expected an entry for each of the host's " + std::to_string(config.local_size) + " ranks."));
  }
  return config;
}

}  // namespace horovod
