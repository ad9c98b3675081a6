// The module horovod.common._core: argument conversion between Python and the engine, the GIL
// released around blocking calls, and engine errors raised as Python exceptions (conversion
// helpers in bindings/convert.*, test-only parts in bindings/testing.cc). What an operation
// accepts is checked by its collective (csrc/collectives/), not here. The Python package
// horovod.common re-exports a clean API over this module.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "backends/nccl/gpu_ops.h"
#include "backends/registry.h"
#include "bindings/convert.h"
#include "common/config.h"
#include "engine/engine.h"

namespace nb = nanobind;
using namespace horovod;
using namespace horovod::bindings;

namespace horovod::bindings {
void DefineTesting(nb::module_& parent);
}  // namespace horovod::bindings

namespace {

// The engine of this process (one per hvd.init(); replaced after shutdown and init again). Calls
// take a reference under the mutex, so a concurrent shutdown never frees an engine in use.
std::mutex g_engine_mu;
std::shared_ptr<Engine> g_engine;

std::shared_ptr<Engine> CurrentEngine() {
  std::lock_guard<std::mutex> lock(g_engine_mu);
  return g_engine;
}

const char* const kNotInitialized = "Horovod has not been initialized; use hvd.init().";

// For operations: not being initialised is a HorovodInternalError (spec core.md §6.11).
std::shared_ptr<Engine> RequireEngine() {
  std::shared_ptr<Engine> engine = CurrentEngine();
  if (!engine) TranslateStatus(Status::PreconditionError(kNotInitialized));
  return engine;
}

// For queries (rank(), size(), ...): not being initialised is a ValueError (spec core.md §2).
std::shared_ptr<Engine> RequireEngineForQuery() {
  std::shared_ptr<Engine> engine = CurrentEngine();
  if (!engine) throw nb::value_error(kNotInitialized);
  return engine;
}

void CheckNames(const std::vector<std::string>& names, size_t count) {
  if (names.size() != count) {
    throw nb::value_error(("expected one name per tensor: got " + std::to_string(names.size()) + " names for " +
                           std::to_string(count) + " tensors")
                              .c_str());
  }
}

// A group's id, the same on every rank and in every step (so grouped tensors stay cacheable): a
// hash of its first tensor's name (FNV-1a), never 0.
int64_t GroupId(const std::vector<std::string>& names) {
  if (names.size() < 2) return 0;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : names[0]) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1) | 1;
}

// Fills `request` in place (where it already lies in the vector submitted: the per-gradient
// allreduce saves a move of the whole Request, about 60 ns).
void FillRequest(Request& request, OpType type, const TensorView& view, const std::string& name, int64_t group_id) {
  request.type = type;
  request.dtype = view.dtype;
  request.name = name;
  request.shape = view.shape;
  request.device = view.device;
  request.group_id = group_id;
}

Request MakeRequest(OpType type, const TensorView& view, const std::string& name, int64_t group_id) {
  Request request;
  FillRequest(request, type, view, name, group_id);
  return request;
}

TensorTableEntry MakeEntry(const std::string& name, const TensorView& input, const TensorView& output) {
  TensorTableEntry entry;
  entry.name = name;
  entry.input = input;
  entry.output = output;
  return entry;
}

// Queues `requests` with their `entries` on the engine; returns the handle.
int64_t Submit(int32_t process_set_id, std::vector<Request> requests, std::vector<TensorTableEntry> entries,
               intptr_t stream = 0) {
  std::shared_ptr<Engine> engine = RequireEngine();
  try {
    return engine->Enqueue(process_set_id, std::move(requests), std::move(entries), stream);
  } catch (const EngineError& e) {
    TranslateStatus(e.status());
  }
}

ReduceOp ToReduceOp(int32_t op) {
  if (op < 0 || op > static_cast<int32_t>(ReduceOp::PRODUCT)) {
    throw nb::value_error(("unknown reduce op " + std::to_string(op) + "; expected one of hvd.Average, hvd.Sum, "
                           "hvd.Min, hvd.Max, hvd.Product")
                              .c_str());
  }
  return static_cast<ReduceOp>(op);
}

// FillRequest for one tensor of an allreduce (Adasum for ReduceOp::ADASUM).
void FillAllreduceRequest(Request& request, const TensorView& view, const std::string& name, ReduceOp op,
                          double prescale, double postscale, int64_t group_id) {
  FillRequest(request, op == ReduceOp::ADASUM ? OpType::ADASUM : OpType::ALLREDUCE, view, name, group_id);
  request.reduce_op = op;
  request.prescale_factor = prescale;
  request.postscale_factor = postscale;
}

int64_t EnqueueAllreduce(const nb::sequence& inputs, const nb::sequence& outputs,
                         const std::vector<std::string>& names, int32_t op, double prescale, double postscale,
                         int32_t process_set_id, intptr_t stream) {
  std::vector<TensorView> in = ToTensorViews(inputs, "allreduce input");
  // An output that is its input (in place) is imported once: DLPack export is not free.
  std::vector<TensorView> out;
  const size_t num_outputs = nb::len(outputs);
  if (num_outputs != in.size()) throw nb::value_error("allreduce needs one output per input");
  for (size_t i = 0; i < num_outputs; ++i) {
    nb::object output = outputs[i];
    nb::object input = inputs[i];
    out.push_back(output.is(input) ? in[i] : ToTensorView(output, "allreduce output"));
  }
  CheckNames(names, in.size());
  const ReduceOp reduce_op = ToReduceOp(op);
  const int64_t group_id = GroupId(names);
  std::vector<Request> requests(in.size());
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < in.size(); ++i) {
    FillAllreduceRequest(requests[i], in[i], names[i], reduce_op, prescale, postscale, group_id);
    entries.push_back(MakeEntry(names[i], in[i], out[i]));
  }
  return Submit(process_set_id, std::move(requests), std::move(entries), stream);
}

// One tensor, the call a training step makes per gradient: EnqueueAllreduce of one-element lists,
// without the lists, and with the name and the views moved into the table entry, not copied.
int64_t EnqueueAllreduceOne(nb::handle input, nb::handle output, std::string name, int32_t op, double prescale,
                            double postscale, int32_t process_set_id, intptr_t stream) {
  TensorView in = ToTensorView(input, "allreduce input");
  TensorView out = output.is(input) ? in : ToTensorView(output, "allreduce output");
  std::vector<Request> requests(1);
  FillAllreduceRequest(requests[0], in, name, ToReduceOp(op), prescale, postscale, 0);
  std::vector<TensorTableEntry> entries(1);
  entries[0].name = std::move(name);
  entries[0].input = std::move(in);
  entries[0].output = std::move(out);
  return Submit(process_set_id, std::move(requests), std::move(entries), stream);
}

int64_t EnqueueAllgather(const nb::sequence& inputs, const std::vector<std::string>& names, int32_t process_set_id,
                         intptr_t stream) {
  std::vector<TensorView> in = ToTensorViews(inputs, "allgather input");
  CheckNames(names, in.size());
  const int64_t group_id = GroupId(names);
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < in.size(); ++i) {
    requests.push_back(MakeRequest(OpType::ALLGATHER, in[i], names[i], group_id));
    entries.push_back(MakeEntry(names[i], in[i], TensorView()));
  }
  return Submit(process_set_id, std::move(requests), std::move(entries), stream);
}

int64_t EnqueueBroadcast(const nb::sequence& tensors, const std::vector<std::string>& names, int32_t root_rank,
                         int32_t process_set_id, intptr_t stream) {
  std::vector<TensorView> views = ToTensorViews(tensors, "broadcast tensor");
  CheckNames(names, views.size());
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < views.size(); ++i) {
    Request request = MakeRequest(OpType::BROADCAST, views[i], names[i], 0);
    request.root_rank = root_rank;
    requests.push_back(std::move(request));
    entries.push_back(MakeEntry(names[i], views[i], views[i]));
  }
  return Submit(process_set_id, std::move(requests), std::move(entries), stream);
}

int64_t EnqueueAlltoall(nb::handle tensor, nb::handle splits, const std::string& name, int32_t process_set_id,
                        intptr_t stream) {
  // A scalar is refused at negotiation, like a scalar allgather (spec core.md §6.11).
  TensorView view = ToTensorView(tensor, "alltoall input");
  Request request = MakeRequest(OpType::ALLTOALL, view, name, 0);
  request.splits = ToSplits(splits);
  return Submit(process_set_id, {request}, {MakeEntry(name, view, TensorView())}, stream);
}

int64_t EnqueueReducescatter(const nb::sequence& inputs, const std::vector<std::string>& names, int32_t op,
                             double prescale, double postscale, int32_t process_set_id, intptr_t stream) {
  std::vector<TensorView> in = ToTensorViews(inputs, "reducescatter input");
  CheckNames(names, in.size());
  const int64_t group_id = GroupId(names);
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < in.size(); ++i) {
    Request request = MakeRequest(OpType::REDUCESCATTER, in[i], names[i], group_id);
    request.reduce_op = static_cast<ReduceOp>(op);
    request.prescale_factor = prescale;
    request.postscale_factor = postscale;
    requests.push_back(std::move(request));
    entries.push_back(MakeEntry(names[i], in[i], TensorView()));
  }
  return Submit(process_set_id, std::move(requests), std::move(entries), stream);
}

// Barrier, join and process set registration: one request without a tensor.
int64_t EnqueueControl(OpType type, const std::string& name, std::vector<int64_t> args, int32_t process_set_id) {
  Request request;
  request.type = type;
  request.dtype = DataType::UINT8;
  request.name = name;
  request.shape = std::move(args);
  TensorTableEntry entry;
  entry.name = name;
  return Submit(process_set_id, {request}, {entry});
}

std::shared_ptr<HandleState> RequireHandle(int64_t handle) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  std::shared_ptr<HandleState> state = engine ? engine->GetHandle(handle) : nullptr;
  if (!state) throw nb::value_error(("unknown or already synchronized handle " + std::to_string(handle)).c_str());
  return state;
}

// Blocks until the handle is done, with the GIL released; wakes every 100 ms to let Ctrl-C through.
nb::list Wait(int64_t handle) {
  std::shared_ptr<HandleState> state = RequireHandle(handle);
  if (!state->done()) {
    std::shared_ptr<Engine> engine = CurrentEngine();
    // While blocked here this rank counts as waiting on the handle's set (deadlock detection).
    // The scope does not keep the engine alive (hvd.shutdown() on another thread ends it).
    struct WaitScope {
      std::weak_ptr<Engine> engine;
      int32_t set_id;
      WaitScope(const std::shared_ptr<Engine>& e, int32_t id) : engine(e), set_id(id) {
        if (e) e->WaitStarted(set_id);
      }
      ~WaitScope() {
        if (std::shared_ptr<Engine> e = engine.lock()) e->WaitEnded(set_id);
      }
    } scope(engine, state->process_set_id);
    engine.reset();
    while (true) {
      bool done = false;
      {
        nb::gil_scoped_release release;
        // Caller execution (engine.h): run the cycles on this thread; when they stop making
        // progress, wake the background thread and wait. Ctrl-C is checked at least every 200 ms.
        if (std::shared_ptr<Engine> e = scope.engine.lock()) {
          done = e->Wait(*state, std::chrono::milliseconds(100));
        } else {
          done = state->WaitFor(std::chrono::milliseconds(100));  // the queues were closed: completed
        }
      }
      if (done) break;
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    }
  }
  if (std::shared_ptr<Engine> engine = CurrentEngine()) engine->ReleaseHandle(handle);
  Status status = state->status();
  if (!status.ok()) TranslateStatus(status);
  nb::list result;
  if (state->has_value()) {
    result.append(nb::int_(state->value()));
    return result;
  }
  for (const auto& outputs : state->outputs()) {
    if (outputs.empty()) result.append(nb::none());
    for (const auto& output : outputs) result.append(OutputToPython(output));
  }
  return result;
}

// add_process_set / remove_process_set: negotiated on the global set; blocks with the GIL released.
int64_t RunControl(OpType type, const std::string& name, std::vector<int64_t> args) {
  std::shared_ptr<Engine> engine = RequireEngine();
  nb::list result = Wait(EnqueueControl(type, name, std::move(args), 0));
  return nb::cast<int64_t>(result[0]);
}

nb::object AddProcessSet(std::vector<int64_t> ranks) {
  // Sorted: the engine checks the ranks (collectives/control.cc).
  std::sort(ranks.begin(), ranks.end());
  int64_t id = RunControl(OpType::ADD_PROCESS_SET, "add_process_set.noname", std::move(ranks));
  if (id < 0) return nb::none();
  return nb::int_(id);
}

nb::object RemoveProcessSet(int64_t id) {
  int64_t removed = RunControl(OpType::REMOVE_PROCESS_SET, "remove_process_set.noname", {id});
  if (removed < 0) return nb::none();
  return nb::int_(removed);
}

template <typename F>
auto Checked(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const EngineError& e) {
    TranslateStatus(e.status());
  }
}

void Init(const std::map<std::string, std::string>& env, nb::object store, const std::string& key_prefix,
          const std::vector<std::vector<int>>& process_sets, intptr_t mpi_comm, const std::vector<int>& mpi_ranks) {
  std::lock_guard<std::mutex> lock(g_engine_mu);
  if (g_engine) return;
  Config config;
  try {
    config = ParseConfig(env);
  } catch (const EngineError& e) {
    TranslateStatus(e.status());
  }
  std::unique_ptr<Store> python_store;
  if (!store.is_none()) python_store = MakePythonStore(store);
  std::unique_ptr<Engine> engine;
  try {
    nb::gil_scoped_release release;
    engine = Engine::Start(config, std::move(python_store), key_prefix, process_sets, mpi_comm, mpi_ranks);
  } catch (const EngineError& e) {
    TranslateStatus(e.status());
  }
  g_engine = std::shared_ptr<Engine>(std::move(engine));
}

void Shutdown() {
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(g_engine_mu);
    engine = std::move(g_engine);
  }
  if (!engine) return;
  nb::gil_scoped_release release;
  engine->Shutdown();
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "The compiled Horovod engine. Use horovod.common, not this module.";

  m.def("built_backends", &BackendRegistry::Names, "Names of the backends compiled into this build.");
  m.def("nccl_built", &NcclVersionBuilt, "NCCL's version code this build was compiled with (e.g. 23203), 0 without NCCL.");
  m.def("cuda_built", &CudaBuilt, "Whether this build has CUDA support (its NCCL plugin).");
  m.def("gpu_error", [] {
    std::string why;
    return LoadGpuOps(&why) != nullptr ? std::string() : why;
  }, "Why GPU tensors cannot be used in this process (\"\" when they can). Loads the NCCL plugin and initialises "
     "CUDA on first call.");
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

  m.def("init", &Init, nb::arg("env"), nb::arg("store").none(), nb::arg("key_prefix"),
        nb::arg("process_sets") = std::vector<std::vector<int>>(), nb::arg("mpi_comm") = 0,
        nb::arg("mpi_ranks") = std::vector<int>());
  m.def("mpi_threads_supported", [] { return RequireEngineForQuery()->mpi_threads_supported(); });
  m.def("mpi_finalize", [] { BackendRegistry::FinalizePlugin("mpi"); },
        "Finalizes MPI if Horovod's MPI backend initialised it (at interpreter exit, after shutdown).");
  m.def("plugin_error", &BackendRegistry::PluginError, nb::arg("name"),
        "Why a backend plugin could not be loaded (\"\" when it was).");
  m.def("shutdown", &Shutdown);
  m.def("is_initialized", [] { return CurrentEngine() != nullptr; });
  m.def("rank", [] { return RequireEngineForQuery()->config().rank; });
  m.def("size", [] { return RequireEngineForQuery()->config().size; });
  m.def("local_rank", [] { return RequireEngineForQuery()->config().local_rank; });
  m.def("local_size", [] { return RequireEngineForQuery()->config().local_size; });
  m.def("cross_rank", [] { return RequireEngineForQuery()->config().cross_rank; });
  m.def("cross_size", [] { return RequireEngineForQuery()->config().cross_size; });
  m.def("is_homogeneous", [] { return RequireEngineForQuery()->is_homogeneous(); });
  m.def("backend_name", [] { return std::string(RequireEngineForQuery()->backend_name()); });

  m.def("enqueue_allreduce", &EnqueueAllreduce, nb::arg("inputs"), nb::arg("outputs"), nb::arg("names"),
        nb::arg("op"), nb::arg("prescale_factor"), nb::arg("postscale_factor"), nb::arg("process_set_id"),
        nb::arg("stream") = 0, "Queues an allreduce (or Adasum) of `inputs` into `outputs`; returns its handle.");
  m.def("enqueue_allreduce_one", &EnqueueAllreduceOne, nb::arg("input"), nb::arg("output"), nb::arg("name"),
        nb::arg("op"), nb::arg("prescale_factor"), nb::arg("postscale_factor"), nb::arg("process_set_id"),
        nb::arg("stream") = 0,
        "enqueue_allreduce of one tensor (`output` may be `input`: in place); returns its handle.");
  m.def("enqueue_allgather", &EnqueueAllgather, nb::arg("inputs"), nb::arg("names"), nb::arg("process_set_id"),
        nb::arg("stream") = 0, "Queues an allgather of `inputs`; returns its handle.");
  m.def("enqueue_broadcast", &EnqueueBroadcast, nb::arg("tensors"), nb::arg("names"), nb::arg("root_rank"),
        nb::arg("process_set_id"), nb::arg("stream") = 0, "Queues an in-place broadcast; returns its handle.");
  m.def("enqueue_alltoall", &EnqueueAlltoall, nb::arg("tensor"), nb::arg("splits").none(), nb::arg("name"),
        nb::arg("process_set_id"), nb::arg("stream") = 0, "Queues an alltoall; returns its handle.");
  m.def("enqueue_reducescatter", &EnqueueReducescatter, nb::arg("inputs"), nb::arg("names"), nb::arg("op"),
        nb::arg("prescale_factor"), nb::arg("postscale_factor"), nb::arg("process_set_id"), nb::arg("stream") = 0,
        "Queues a reducescatter of `inputs`; returns its handle.");
  m.def("enqueue_barrier", [](int32_t process_set_id) {
    return EnqueueControl(OpType::BARRIER, "barrier.noname", {}, process_set_id);
  }, nb::arg("process_set_id"), "Queues a barrier; returns its handle.");
  m.def("enqueue_join", [] { return EnqueueControl(OpType::JOIN, "join.noname", {}, 0); },
        "Queues a join; returns its handle.");
  m.def("add_process_set", &AddProcessSet, nb::arg("ranks"),
        "Registers a process set on every rank (collective); its id, or None if it exists.");
  m.def("remove_process_set", &RemoveProcessSet, nb::arg("process_set_id"),
        "Removes a process set on every rank (collective); its id, or None if it was unknown.");
  m.def("process_set_ids_and_ranks", [] { return RequireEngineForQuery()->ProcessSetRanks(); });
  m.def("process_set_rank", [](int32_t id) {
    auto engine = RequireEngineForQuery();
    return Checked([&] { return engine->ProcessSetRank(id); });
  });
  m.def("process_set_size", [](int32_t id) {
    auto engine = RequireEngineForQuery();
    return Checked([&] { return engine->ProcessSetSize(id); });
  });
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    auto engine = RequireEngineForQuery();
    Checked([&] { engine->StartTimeline(path, mark_cycles); });
  }, nb::arg("file_path"), nb::arg("mark_cycles"));
  m.def("dump_flight_recorder", [](const std::string& dir, const std::string& reason) {
    auto engine = RequireEngineForQuery();
    return Checked([&] { return engine->DumpFlightRecorder(dir, reason); });
  }, nb::arg("dir"), nb::arg("reason"));
  m.def("stop_timeline", [] {
    auto engine = RequireEngineForQuery();
    Checked([&] { engine->StopTimeline(); });
  });
  m.def("engine_stats", [] {
    std::shared_ptr<Engine> engine = RequireEngineForQuery();
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
    TunedParameters p = RequireEngineForQuery()->CurrentParameters();
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
  DefineTesting(m);
  m.def("poll", [](int64_t handle) { return RequireHandle(handle)->done(); });
  m.def("wait", &Wait, nb::arg("handle"));
}
