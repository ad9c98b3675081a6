// horovod.common._core's read-only queries that build dicts: the configuration a set of HOROVOD_*
// variables gives, the runtime variables, and the engine's counters and tuned parameters.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <map>
#include <memory>
#include <string>

#include "bindings/convert.h"
#include "common/config.h"
#include "engine/engine.h"

namespace nb = nanobind;

namespace horovod::bindings {

namespace {
// bindings.cc's engine of this process; raises ValueError when Horovod is not running.
std::shared_ptr<Engine> (*g_require_engine)() = nullptr;
std::shared_ptr<Engine> RequireEngine() { return g_require_engine(); }
}  // namespace

// `require_engine` returns the engine of this process, or raises ValueError when Horovod is not
// running.
void DefineQueries(nb::module_& m, std::shared_ptr<Engine> (*require_engine)()) {
  g_require_engine = require_engine;
  m.def("parse_config", [](const std::map<std::string, std::string>& env) {
    try {
      Config c = ParseConfig(env);
      nb::dict d;
      d["rank"] = c.rank; d["size"] = c.size; d["local_rank"] = c.local_rank; d["local_size"] = c.local_size;
      d["cross_rank"] = c.cross_rank; d["cross_size"] = c.cross_size; d["hostname"] = c.hostname;
      d["rendezvous_addr"] = c.rendezvous_addr; d["rendezvous_port"] = c.rendezvous_port;
      d["gloo_timeout_seconds"] = c.gloo_timeout_seconds; d["elastic"] = c.elastic;
      d["dynamic_process_sets"] = c.dynamic_process_sets; d["timeline"] = c.timeline;
      d["backend"] = CpuBackendName(c); d["launched_by_mpi"] = c.launched_by_mpi;
      return d;
    } catch (const EngineError& e) {
      TranslateStatus(e.status());
    }
  }, "Parses HOROVOD_* variables given as a dict; raises ValueError naming an invalid variable.");
  m.def("read_environment", &ReadEnvironment, "The HOROVOD_* variables of the process environment.");
  m.def("knobs", [] {
    nb::list rows;
    for (const Knob& k : Knobs()) rows.append(nb::make_tuple(k.name, k.default_value, k.doc));
    return rows;
  }, "Every HOROVOD_* runtime variable as (name, default, description).");

  m.def("engine_stats", [] {
    std::shared_ptr<Engine> engine = RequireEngine();
    NegotiationStats s = engine->GlobalStats();
    nb::dict d;
    d["cycles"] = s.cycles;
    d["coordinator_rounds"] = s.coordinator_rounds;
    d["cache_hits"] = s.cache_hits;
    d["eager_allreduces"] = s.eager_allreduces;
    d["negotiation_us"] = s.negotiation_us;
    d["caller_cycles"] = engine->caller_cycles();
    d["background_thread_id"] = engine->background_thread_id();
    d["background_cpu"] = engine->background_cpu();
    d["shared_memory"] = engine->shared_memory();
    d["shared_memory_single_copy"] = engine->shared_memory_single_copy();
    d["local_channels"] = engine->local_channels();
    Engine::HierarchicalStats h = engine->hierarchical_stats();
    d["hosts"] = engine->num_hosts();
    d["hierarchical"] = h.available;
    d["hierarchical_allreduce"] = h.allreduce;
    d["hierarchical_allgather"] = h.allgather;
    d["hierarchical_allreduces"] = h.allreduces;
    d["hierarchical_allgathers"] = h.allgathers;
    d["hierarchical_shared_memory"] = h.local_shared_memory;
    return d;
  }, "Negotiation counters of the global process set (cycles, coordinator_rounds, cache_hits, negotiation_us, and "
     "eager_allreduces: allreduces whose data the cache round carried), "
     "the cycles run by waiting callers instead of the background thread (caller_cycles, HOROVOD_CALLER_EXECUTION), "
     "the background thread's id (background_thread_id, as in /proc/self/task) and the core it is bound to now "
     "(background_cpu, -1 when not bound: HOROVOD_THREAD_AFFINITY, HOROVOD_THREAD_FOLLOW_CALLER), "
     "whether its collectives go through shared memory (shared_memory) and its large allreduces read the peers' "
     "buffers directly (shared_memory_single_copy); how many peers on this host this rank's Gloo messages reach "
     "through a shared-memory channel instead of TCP on several hosts (local_channels); the number of hosts the "
     "ranks are grouped into (hosts, by HOROVOD_HOSTNAME when set), whether the hierarchical collectives were set "
     "up (hierarchical: several hosts with the same number of ranks each, and hierarchical allreduce/allgather asked "
     "for or autotuned), whether each is switched on now (hierarchical_allreduce, hierarchical_allgather), how many allreduces/allgathers went that "
     "way (hierarchical_allreduces, hierarchical_allgathers), and whether their steps within a host use shared "
     "memory (hierarchical_shared_memory).");
  m.def("tuned_parameters", [] {
    TunedParameters p = RequireEngine()->CurrentParameters();
    nb::dict d;
    d["fusion_threshold_bytes"] = p.fusion_threshold_bytes;
    d["cycle_time_ms"] = p.cycle_time_ms;
    d["cache_enabled"] = p.cache_enabled;
    d["hierarchical_allreduce"] = p.hierarchical_allreduce;
    d["hierarchical_allgather"] = p.hierarchical_allgather;
    d["torus_allreduce"] = p.torus_allreduce;
    d["tuning"] = p.tuning;
    return d;
  }, "The parameters in force (read-only; HOROVOD_AUTOTUNE changes them): fusion_threshold_bytes, cycle_time_ms, "
     "cache_enabled, hierarchical_allreduce, hierarchical_allgather, torus_allreduce, and tuning (whether the "
     "autotuner is still searching).");
}

}  // namespace horovod::bindings
