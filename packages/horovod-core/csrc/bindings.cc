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
#include "collectives/collective.h"
#include "common/config.h"
#include "engine/engine.h"

namespace nb = nanobind;
using namespace horovod;
using namespace horovod::bindings;

namespace horovod::bindings {
void DefineTesting(nb::module_& parent);
void DefineQueries(nb::module_& m, std::shared_ptr<Engine> (*engine)());
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

// The options of _core.enqueue, into the request every tensor's request starts from; the
// collective reads those it uses (csrc/collectives/).
void ReadOptions(nb::handle options, Request& request) {
  if (options.is_none()) return;
  if (!nb::isinstance<nb::dict>(options)) throw nb::value_error("options must be a dict or None");
  for (auto [key, value] : nb::borrow<nb::dict>(options)) {
    // Compared in place (no string built per key: this runs for every gradient of a step).
    const std::string_view k = nb::borrow<nb::str>(key).c_str();
    if (k == "op") {
      request.reduce_op = ToReduceOp(nb::cast<int32_t>(value));
    } else if (k == "prescale_factor") {
      request.prescale_factor = nb::cast<double>(value);
    } else if (k == "postscale_factor") {
      request.postscale_factor = nb::cast<double>(value);
    } else if (k == "root_rank") {
      request.root_rank = nb::cast<int32_t>(value);
    } else if (k == "splits") {
      request.splits = ToSplits(value);
    } else if (k == "args") {
      request.shape = nb::cast<std::vector<int64_t>>(value);
    } else {
      throw nb::value_error(("unknown option '" + std::string(k) + "'; expected op, prescale_factor, "
                             "postscale_factor, root_rank, splits or args").c_str());
    }
  }
}

// The output of `input`: none (the engine allocates it), the input itself (in place: imported
// once, as DLPack export is not free), or its own tensor.
TensorView OutputOf(nb::handle input, const TensorView& in, nb::handle output, const char* what) {
  if (output.is_none()) return TensorView();
  return output.is(input) ? in : ToTensorView(output, what);
}

// _core.enqueue: one operation of the collective named `op` on one tensor (`names` a str:
// `inputs` and `outputs` are the tensor and its output, the call a training step makes per
// gradient) or a group (`names` a list: one input, and one output or None, per name). Operations
// without tensors (barrier, join) take one name and no inputs.
int64_t Enqueue(nb::str op, nb::handle inputs, nb::handle outputs, nb::handle names, nb::handle options,
                int32_t process_set_id, intptr_t stream) {
  const Collective& collective = RequireCollective(op.c_str());
  const Labels& labels = LabelsOf(collective);
  const std::string& input_what = labels.input;
  const std::string& output_what = labels.output;
  Request proto;
  proto.type = collective.type();
  ReadOptions(options, proto);
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  auto add = [&](std::string name, TensorView in, TensorView out, int64_t group_id) {
    Request& request = requests.emplace_back(proto);
    request.dtype = in.dtype;
    request.name = name;
    request.shape = in.shape;
    request.device = in.device;
    request.group_id = group_id;
    TensorTableEntry& entry = entries.emplace_back();
    entry.name = std::move(name);
    entry.input = std::move(in);
    entry.output = std::move(out);
  };
  if (!collective.has_tensors()) {
    Request& request = requests.emplace_back(std::move(proto));
    request.dtype = DataType::UINT8;
    request.name = nb::cast<std::string>(names);
    entries.emplace_back().name = request.name;
  } else if (nb::isinstance<nb::str>(names)) {
    TensorView in = ToTensorView(inputs, input_what.c_str());
    TensorView out = OutputOf(inputs, in, outputs, output_what.c_str());
    add(nb::cast<std::string>(names), std::move(in), std::move(out), 0);
  } else {
    const std::vector<std::string> all = nb::cast<std::vector<std::string>>(names);
    std::vector<TensorView> in = ToTensorViews(nb::borrow<nb::sequence>(inputs), input_what.c_str());
    CheckNames(all, in.size());
    if (!outputs.is_none() && nb::len(outputs) != in.size()) {
      throw nb::value_error((collective.lower_name() + " needs one output per input").c_str());
    }
    const int64_t group_id = GroupId(all);
    requests.reserve(in.size());
    entries.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      nb::handle output = outputs.is_none() ? nb::none() : nb::handle(outputs[i]);
      TensorView out = OutputOf(inputs[i], in[i], output, output_what.c_str());
      add(all[i], std::move(in[i]), std::move(out), group_id);
    }
  }
  return Submit(process_set_id, std::move(requests), std::move(entries), stream);
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
  Request request;
  request.type = type;
  request.dtype = DataType::UINT8;
  request.name = name;
  request.shape = std::move(args);
  TensorTableEntry entry;
  entry.name = name;
  nb::list result = Wait(Submit(0, {request}, {entry}));
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

  m.def("operations", &CollectiveNames, "The names of the operations enqueue accepts, sorted.");
  m.def("enqueue", &Enqueue, nb::arg("op"), nb::arg("inputs").none(), nb::arg("outputs").none(), nb::arg("names"),
        nb::arg("options").none(), nb::arg("process_set_id"), nb::arg("stream") = 0,
        "Queues the operation `op` (a name of operations()) of `inputs` (one tensor when `names` is a str, else "
        "one per name) into `outputs` (None: engine-allocated; an output may be its input), with `options` (a dict: "
        "op, prescale_factor, postscale_factor, root_rank, splits, args); returns its handle.");
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
  DefineQueries(m, &RequireEngineForQuery);
  DefineTesting(m);
  m.def("poll", [](int64_t handle) { return RequireHandle(handle)->done(); });
  m.def("wait", &Wait, nb::arg("handle"));
}
