// Where the background thread runs (engine.h, "Where the background thread runs"):
// HOROVOD_THREAD_AFFINITY's core, the core of the last submission (HOROVOD_THREAD_FOLLOW_CALLER
// where the host has no core to spare), or wherever the scheduler puts it.
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/logging.h"
#include "engine/engine.h"

namespace horovod {

namespace {

// Where a rank has no core to spare and the cycle time is the default, the background thread looks
// for asynchronous work at most this often while it polls (see BackgroundLoop).
constexpr std::chrono::milliseconds kBusyHostPollPeriod{10};

}  // namespace

int Engine::ThreadAffinity(const Config& config) {
  if (config.thread_affinity.empty()) return -1;
  const int core = config.thread_affinity[static_cast<size_t>(config.local_rank)];
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && !CPU_ISSET(core, &allowed)) {
    throw EngineError(Status::InvalidArgument(
        "HOROVOD_THREAD_AFFINITY gives local rank " + std::to_string(config.local_rank) + " core " +
        std::to_string(core) + ", which this process may not run on (its CPU affinity has " +
        std::to_string(CPU_COUNT(&allowed)) + " cores)."));
  }
  return core;
}

void Engine::PlaceBackgroundThread(int pinned_cpu) {
  pinned_cpu_ = pinned_cpu;
  // No core to spare: this host's ranks are at least as many as the cores a rank may use.
  cpu_set_t cpus;
  const int available = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  const bool no_spare_core = available > 0 && available <= config_.local_size;
  follow_caller_ = pinned_cpu < 0 && config_.thread_follow_caller && no_spare_core;
  // A cycle time the user set, or autotune's, is kept as it is.
  if (no_spare_core && !config_.cycle_time_fixed && !config_.autotune) busy_poll_period_ = kBusyHostPollPeriod;
  HVD_LOG(DEBUG) << "background thread: " << available << " core(s) for " << config_.local_size
                 << " rank(s) on this host; "
                 << (pinned_cpu >= 0    ? "pinned"
                     : follow_caller_ ? "follows the submitting thread's core"
                                      : "placed by the scheduler");
}

void Engine::BackgroundThreadStarted() {
  background_tid_.store(static_cast<int64_t>(::syscall(SYS_gettid)));
  ::pthread_setname_np(::pthread_self(), "hvd-background");  // top -H, /proc/<pid>/task/*/comm
  ::pthread_getaffinity_np(::pthread_self(), sizeof(started_cpus_), &started_cpus_);
  if (pinned_cpu_ >= 0 && !BindBackgroundThread(pinned_cpu_)) {
    HVD_LOG(WARNING) << "HOROVOD_THREAD_AFFINITY: could not bind the background thread to core " << pinned_cpu_;
  }
}

bool Engine::BindBackgroundThread(int cpu) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  CPU_SET(cpu, &cpus);
  if (::pthread_setaffinity_np(::pthread_self(), sizeof(cpus), &cpus) != 0) return false;
  background_cpu_.store(cpu, std::memory_order_relaxed);
  return true;
}

void Engine::FollowCaller() {
  const int cpu = submit_cpu_.load(std::memory_order_relaxed);
  if (cpu < 0 || cpu == background_cpu_.load(std::memory_order_relaxed) || BindBackgroundThread(cpu)) return;
  // The core was taken from this process (its cpuset changed): back to the cores the thread
  // started with, and the scheduler places it from now on.
  ::pthread_setaffinity_np(::pthread_self(), sizeof(started_cpus_), &started_cpus_);
  follow_caller_.store(false);
  background_cpu_.store(-1, std::memory_order_relaxed);
}

}  // namespace horovod
