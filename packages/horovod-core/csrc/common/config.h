// Every HOROVOD_* runtime variable is declared once, in the table in config.cc, with its default
// and a one-line description; nothing else in the engine calls getenv. ParseConfig reads the
// environment through that table and rejects invalid values with an error naming the variable.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "logging.h"

namespace horovod {

struct Config {
  // Topology given by the launcher (spec core.md §8). Unset means a single process.
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  std::string hostname = "localhost";
  // Whether HOROVOD_HOSTNAME was set: ranks are then grouped into hosts by it (so that a launcher,
  // or a test, can lay out several "hosts" on one machine) instead of by gethostname().
  bool hostname_given = false;
  std::string rendezvous_addr;  // empty: single process, in-memory store
  int rendezvous_port = -1;
  std::string gloo_iface;
  double gloo_timeout_seconds = 30.0;
  std::string gloo_busy_poll = "auto";  // HOROVOD_GLOO_BUSY_POLL: "auto", "0" or "1"
  std::string controller;      // "" (default), "gloo" or "mpi"
  std::string cpu_operations;  // "" (default), "gloo", "mpi" or "ccl"

  double cycle_time_ms = 1.0;
  // HOROVOD_CALLER_EXECUTION: a caller that waits on an unfinished handle runs the cycles itself
  // when the background thread is not in one (engine.h, "Threading contract").
  bool caller_execution = true;
  int64_t fusion_threshold_bytes = 128 * 1024 * 1024;
  int64_t cache_capacity = 1024;
  bool disable_group_fusion = false;

  std::string timeline;
  bool timeline_mark_cycles = false;
  bool stall_check_disable = false;
  double stall_check_time_seconds = 60.0;
  double stall_shutdown_time_seconds = 0.0;
  // Every rank of a set blocked waiting, nothing completable and nothing new for this long: the
  // pending operations fail with a deadlock error (engine/controller.h). 0 disables.
  double deadlock_timeout_seconds = 5.0;
  // The flight recorder: operations kept per rank (0: off), and where automatic dumps go ("": none).
  int64_t flight_recorder_size = 1024;
  std::string flight_recorder_dir;

  bool autotune = false;
  std::string autotune_log;
  int64_t autotune_warmup_samples = 3;
  int64_t autotune_steps_per_sample = 10;
  int64_t autotune_bayes_opt_max_samples = 20;
  double autotune_gaussian_process_noise = 0.8;
  // Which tunable variables the user set explicitly: autotune leaves those alone (spec core.md §12).
  bool cycle_time_fixed = false;
  bool fusion_threshold_fixed = false;
  bool cache_capacity_fixed = false;
  bool hierarchical_allreduce_fixed = false;
  bool hierarchical_allgather_fixed = false;
  bool torus_allreduce_fixed = false;

  LogLevel log_level = LogLevel::WARNING;
  bool log_hide_time = false;

  bool elastic = false;
  bool dynamic_process_sets = false;
  bool mpi_threads_disable = false;
  // Started by an MPI launcher (its variables are in the environment): MPI is the default backend.
  bool launched_by_mpi = false;
  bool hierarchical_allreduce = false;
  bool shared_memory = true;  // HOROVOD_SHARED_MEMORY: the shared-memory transport on one host
  bool shared_memory_single_copy = true;  // HOROVOD_SHARED_MEMORY_SINGLE_COPY: cross-memory attach for large allreduces
  bool hierarchical_allgather = false;
  bool torus_allreduce = false;
  int64_t num_nccl_streams = 1;
  bool batch_d2d_memcopies = true;
  bool enable_async_completion = false;
  // HOROVOD_THREAD_AFFINITY: core ids, at least one per rank of the host (checked by ParseConfig);
  // entry [local_rank] pins the background thread. Empty: not set.
  std::vector<int> thread_affinity;
  // HOROVOD_THREAD_FOLLOW_CALLER: where this host's ranks have no spare core (at least as many ranks
  // as this process may use cores), the background thread runs its cycles on the core of the thread
  // that last submitted an operation (engine.h, "Threading contract").
  bool thread_follow_caller = true;
  int64_t adasum_mpi_chunk_size = 1 << 30;
  bool enable_xla_ops = false;
};

// One row of the knob table: the variable, its default as text, its meaning, and how a value is applied.
struct Knob {
  const char* name;
  const char* default_value;
  const char* doc;
  std::function<void(Config&, const std::string&)> apply;
};

const std::vector<Knob>& Knobs();

// Builds a Config from `env` (name -> value). Throws EngineError(INVALID_ARGUMENT) naming the
// variable when a value cannot be parsed or is out of range.
Config ParseConfig(const std::map<std::string, std::string>& env);

// Reads the process environment for every variable in the knob table.
std::map<std::string, std::string> ReadEnvironment();

}  // namespace horovod
