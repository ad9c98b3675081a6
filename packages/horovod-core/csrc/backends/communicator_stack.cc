#include "backends/communicator_stack.h"

#include <sched.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "backends/hierarchical/hierarchical.h"
#include "backends/registry.h"
#include "backends/shm/shared_memory.h"
#include "common/logging.h"

namespace horovod {

namespace {
// How long HOROVOD_GLOO_BUSY_POLL=auto polls (yielding the core between polls) before sleeping.
constexpr std::chrono::microseconds kGlooSpin{200};
}  // namespace

BackendOptions CommunicatorOptions(const Config& config, Store* store, const std::string& key_prefix) {
  BackendOptions options;
  options.rank = config.rank;
  options.size = config.size;
  options.store = store;
  options.key_prefix = key_prefix;
  options.gloo.iface = config.gloo_iface;
  options.gloo.hostname = config.local_size == config.size ? "127.0.0.1" : config.hostname;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.gloo_timeout_seconds * 1000));
  options.gloo.busy_poll = config.gloo_busy_poll == "1";
  options.gloo.cross_memory = config.shared_memory && config.shared_memory_single_copy;
  // On one host the shared-memory transport carries the hot path above the Gloo backend.
  options.gloo.local_channel = config.shared_memory && config.local_size < config.size;
  if (config.gloo_busy_poll == "auto") {
    // A short poll catches a peer that is about to send (most messages of a collective whose ranks
    // arrived together) without the wake-up of a sleeping thread. Only where every rank of the
    // host has a core to itself (as in the shared-memory transport): elsewhere the polling rank
    // would take the core of the rank it waits for.
    cpu_set_t cpus;
    const int available = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    if (available >= config.local_size) options.gloo.spin = kGlooSpin;
  }
  return options;
}

HierarchicalStats HierarchicalStatsOf(const CommunicatorStack& stack) {
  HierarchicalStats stats;
  const auto& state = stack.hierarchical;
  if (!state) return stats;
  stats.available = true;
  stats.allreduce = state->allreduce;
  stats.allgather = state->allgather;
  stats.local_shared_memory = state->local_shared_memory;
  stats.allreduces = state->allreduces;
  stats.allgathers = state->allgathers;
  return stats;
}

void SwitchHierarchical(CommunicatorStack& stack, bool allreduce, bool allgather) {
  if (!stack.hierarchical) return;
  stack.hierarchical->allreduce = allreduce;
  stack.hierarchical->allgather = allgather;
}

std::string CpuBackendName(const Config& config) {
  if (!config.cpu_operations.empty()) return config.cpu_operations;
  if (!config.controller.empty()) return config.controller;
  if (config.launched_by_mpi && BackendRegistry::Built("mpi")) return "mpi";
  return "gloo";
}

std::vector<std::vector<char>> AllgatherBytes(Communicator& communicator, const std::vector<char>& mine) {
  std::vector<std::vector<char>> all = communicator.Gatherv(mine, 0);
  std::vector<char> packed;
  if (communicator.rank() == 0) {
    for (const auto& bytes : all) {
      uint64_t n = bytes.size();
      packed.insert(packed.end(), reinterpret_cast<const char*>(&n), reinterpret_cast<const char*>(&n) + sizeof(n));
      packed.insert(packed.end(), bytes.begin(), bytes.end());
    }
  }
  communicator.BroadcastBytes(packed, 0);
  all.assign(communicator.size(), {});
  size_t pos = 0;
  for (int r = 0; r < communicator.size(); ++r) {
    uint64_t n;
    std::memcpy(&n, packed.data() + pos, sizeof(n));
    pos += sizeof(n);
    all[r].assign(packed.data() + pos, packed.data() + pos + n);
    pos += n;
  }
  return all;
}

namespace {

// Several hosts: the hierarchical collectives (backends/hierarchical/), when asked for or when
// autotune may switch them on. Their communicators cost a rendezvous and a segment per host, so a
// job that can never use them does not build them.
void MaybeHierarchical(CommunicatorStack& stack, const Config& config, const HostLayout& host_layout,
                       const std::vector<int64_t>& pids, const BackendOptions& options) {
  Communicator& global = *stack.global;
  const bool may_tune =
      config.autotune && !(config.hierarchical_allreduce_fixed && config.hierarchical_allgather_fixed);
  const bool asked = config.hierarchical_allreduce || config.hierarchical_allgather;
  if (host_layout.hosts.size() == 1 && asked && global.size() > 1 && global.rank() == 0) {
    HVD_LOG(INFO) << "Every rank is on one host: hierarchical allreduce/allgather do not apply; collectives go "
                  << "through " << (stack.shared_memory ? "shared memory" : stack.backend_name) << ".";
  }
  if (host_layout.hosts.size() <= 1 || !(asked || may_tune)) return;
  if (!host_layout.homogeneous) {
    if (global.rank() == 0) {
      // A warning when the user asked for the path; only information when autotune might have
      // tried it.
      const LogLevel level = asked ? LogLevel::WARNING : LogLevel::INFO;
      std::ostringstream counts;
      for (size_t h = 0; h < host_layout.hosts.size(); ++h) counts << (h ? ", " : "") << host_layout.hosts[h].size();
      if (level >= CurrentLogLevel()) {
        LogMessage(__FILE__, __LINE__, level).stream()
            << "Hierarchical allreduce/allgather need the same number of ranks on every host, but this job has "
            << counts.str() << " ranks on its " << host_layout.hosts.size() << " hosts; collectives use the flat "
            << stack.backend_name << " communicator instead.";
      }
    }
    return;
  }
  auto state = std::make_shared<HierarchicalState>();
  state->allreduce = config.hierarchical_allreduce;
  state->allgather = config.hierarchical_allgather;
  stack.global = std::make_unique<HierarchicalBackend>(std::move(stack.global), host_layout, pids, options,
                                                       config.shared_memory, config.shared_memory_single_copy, state);
  stack.hierarchical = state;
  HVD_LOG(INFO) << "Hierarchical collectives available: " << host_layout.hosts.size() << " hosts of "
                << host_layout.hosts[0].size() << " ranks"
                << (state->local_shared_memory ? ", shared memory within each host" : "") << "; allreduce "
                << (config.hierarchical_allreduce ? "on" : "off") << ", allgather "
                << (config.hierarchical_allgather ? "on" : "off") << ".";
}

}  // namespace

CommunicatorStack BuildCommunicatorStack(Config& config, Store* store, const std::string& key_prefix,
                                         intptr_t mpi_comm, const std::vector<int>& mpi_ranks) {
  CommunicatorStack stack;
  BackendOptions options = CommunicatorOptions(config, store, key_prefix);
  options.mpi.comm = mpi_comm;
  options.mpi.ranks = mpi_ranks;
  options.mpi.threads_disable = config.mpi_threads_disable;
  stack.global = BackendRegistry::Create(CpuBackendName(config), options);
  Communicator& global = *stack.global;
  stack.backend_name = global.name();
  stack.local_channels = global.local_channels();
  // MPI knows the job's layout from its launcher; the HOROVOD_* topology variables are not needed.
  if (global.Topology(&config.local_rank, &config.local_size, &config.cross_rank, &config.cross_size)) {
    config.rank = global.rank();
    config.size = global.size();
  }

  // Topology facts, agreed by every rank. Ranks are grouped into hosts by HOROVOD_HOSTNAME when the
  // launcher set it (horovodrun sets it per slot, so `-H localhost:2,127.0.0.1:2` is two hosts
  // even on one machine), else by gethostname().
  std::ostringstream me;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  me << config.local_size << "\n" << host << "\n" << ::getpid() << "\n"
     << (config.hostname_given ? config.hostname : std::string(host));
  std::string mine = me.str();
  std::vector<std::string> group_hosts;
  for (const auto& bytes : AllgatherBytes(global, std::vector<char>(mine.begin(), mine.end()))) {
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    std::string local_size, peer_host, pid, group;
    std::getline(in, local_size);
    std::getline(in, peer_host);
    std::getline(in, pid);
    std::getline(in, group);
    if (std::stoi(local_size) != config.local_size) stack.homogeneous = false;
    stack.peers.emplace_back(peer_host, std::stoll(pid));
    group_hosts.push_back(group);
  }
  std::vector<int64_t> pids;
  for (const auto& peer : stack.peers) pids.push_back(peer.second);
  const HostLayout host_layout = GroupByHost(group_hosts, global.rank());
  stack.num_hosts = static_cast<int>(host_layout.hosts.size());

  // One host: the hot path goes through shared memory (backends/shm/).
  if (global.size() > 1 && host_layout.hosts.size() == 1 && config.shared_memory) {
    std::string why;
    bool single_copy = config.shared_memory_single_copy;
    std::unique_ptr<Communicator> shared = MakeSharedMemoryBackend(stack.global, pids, options, &single_copy, &why);
    if (shared) {
      stack.global = std::move(shared);
      stack.shared_memory = true;
      stack.shared_memory_single_copy = single_copy;
    } else {
      HVD_LOG(WARNING) << "Horovod could not set up shared memory between its ranks (" << why << "); collectives go "
                       << "through " << stack.backend_name << " instead.";
    }
  }
  MaybeHierarchical(stack, config, host_layout, pids, options);
  return stack;
}

}  // namespace horovod
