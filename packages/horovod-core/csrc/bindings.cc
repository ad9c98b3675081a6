// The only nanobind file: builds horovod.common._core. It converts Python and DLPack arguments
// into engine types, releases the GIL around blocking calls, and maps engine errors onto Python
// exceptions (in TranslateStatus, the one place that does so). The Python package horovod.common
// re-exports a clean API over this module.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <mutex>

#include "engine/backend.h"
#include "engine/config.h"
#include "engine/engine.h"

namespace nb = nanobind;
using namespace horovod;

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

[[noreturn]] void TranslateStatus(const Status& status) {
  if (status.type() == StatusType::INVALID_ARGUMENT) throw nb::value_error(status.reason().c_str());
  nb::object error = nb::module_::import_("horovod.common.exceptions").attr("HorovodInternalError");
  PyErr_SetString(error.ptr(), status.reason().c_str());
  throw nb::python_error();
}

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

// The rendezvous store, backed by a Python object with set(key: str, value: bytes) and
// get(key: str) -> bytes (blocking until the key exists). Called from the init thread with the
// GIL released, so each call takes the GIL.
class PythonStore : public Store {
 public:
  explicit PythonStore(nb::object store) : store_(std::move(store)) {}
  void Set(const std::string& key, const std::vector<char>& value) override {
    nb::gil_scoped_acquire gil;
    store_.attr("set")(key, nb::bytes(value.data(), value.size()));
  }
  std::vector<char> Get(const std::string& key) override {
    nb::gil_scoped_acquire gil;
    nb::bytes value = nb::cast<nb::bytes>(store_.attr("get")(key));
    const char* data = value.c_str();
    return std::vector<char>(data, data + value.size());
  }

 private:
  nb::object store_;
};

DataType ToDataType(const nb::dlpack::dtype& dt) {
  using nb::dlpack::dtype_code;
  auto code = static_cast<dtype_code>(dt.code);
  if (dt.lanes == 1) {
    if (code == dtype_code::UInt && dt.bits == 8) return DataType::UINT8;
    if (code == dtype_code::UInt && dt.bits == 16) return DataType::UINT16;
    if (code == dtype_code::Int && dt.bits == 8) return DataType::INT8;
    if (code == dtype_code::Int && dt.bits == 16) return DataType::INT16;
    if (code == dtype_code::Int && dt.bits == 32) return DataType::INT32;
    if (code == dtype_code::Int && dt.bits == 64) return DataType::INT64;
    if (code == dtype_code::Float && dt.bits == 16) return DataType::FLOAT16;
    if (code == dtype_code::Float && dt.bits == 32) return DataType::FLOAT32;
    if (code == dtype_code::Float && dt.bits == 64) return DataType::FLOAT64;
    if (code == dtype_code::Bfloat && dt.bits == 16) return DataType::BFLOAT16;
    if (code == dtype_code::Bool && dt.bits == 8) return DataType::BOOL;
  }
  throw nb::value_error(("Horovod does not support tensors of DLPack type code " + std::to_string(dt.code) +
                         " with " + std::to_string(dt.bits) + " bits; supported: uint8, int8, uint16, int16, "
                         "int32, int64, float16, bfloat16, float32, float64, bool.")
                            .c_str());
}

nb::dlpack::dtype ToDLPack(DataType dtype) {
  using nb::dlpack::dtype_code;
  nb::dlpack::dtype dt;
  dt.lanes = 1;
  dt.bits = static_cast<uint8_t>(DataTypeSize(dtype) * 8);
  switch (dtype) {
    case DataType::UINT8: case DataType::UINT16: dt.code = static_cast<uint8_t>(dtype_code::UInt); break;
    case DataType::FLOAT16: case DataType::FLOAT32: case DataType::FLOAT64:
      dt.code = static_cast<uint8_t>(dtype_code::Float);
      break;
    case DataType::BFLOAT16: dt.code = static_cast<uint8_t>(dtype_code::Bfloat); break;
    case DataType::BOOL: dt.code = static_cast<uint8_t>(dtype_code::Bool); break;
    default: dt.code = static_cast<uint8_t>(dtype_code::Int);
  }
  return dt;
}

// Imports one tensor through DLPack without conversion (no copies), checking that the engine can
// use it in place.
TensorView ToTensorView(nb::handle object, const char* what) {
  nb::ndarray<> array;
  if (!nb::try_cast(object, array, /*convert=*/false)) {
    throw nb::value_error((std::string(what) + " must support the DLPack protocol (__dlpack__) or the buffer "
                           "protocol; got " + nb::type_name(object.type()).c_str() + ".")
                              .c_str());
  }
  if (array.device_type() != nb::device::cpu::value) {
    throw nb::value_error((std::string(what) + " is on a GPU device; this build of Horovod supports CPU tensors "
                           "only (GPU tensors need a build with NCCL).")
                              .c_str());
  }
  TensorView view;
  view.dtype = ToDataType(array.dtype());
  view.data = array.data();
  // Strides are irrelevant for empty tensors and for dimensions of size 1.
  int64_t expected = array.size() == 0 ? -1 : 1;
  for (size_t i = array.ndim(); expected > 0 && i-- > 0;) {
    int64_t dim = static_cast<int64_t>(array.shape(i));
    if (dim != 1 && array.stride(i) != expected) {
      throw nb::value_error((std::string(what) + " must be contiguous (C order); make a contiguous copy "
                             "first, e.g. tensor.contiguous() or numpy.ascontiguousarray().")
                                .c_str());
    }
    expected *= dim;
  }
  view.shape.assign(array.shape_ptr(), array.shape_ptr() + array.ndim());
  return view;
}

std::vector<TensorView> ToTensorViews(const nb::sequence& objects, const char* what) {
  std::vector<TensorView> views;
  for (nb::handle object : objects) views.push_back(ToTensorView(object, what));
  return views;
}

void CheckNames(const std::vector<std::string>& names, size_t count) {
  if (names.size() != count) {
    throw nb::value_error(("expected one name per tensor: got " + std::to_string(names.size()) + " names for " +
                           std::to_string(count) + " tensors")
                              .c_str());
  }
}

void CheckProcessSet(int32_t process_set_id) {
  if (process_set_id != 0) {
    throw nb::value_error(("process set " + std::to_string(process_set_id) +
                           " is unknown: only the global process set (id 0) exists in this release")
                              .c_str());
  }
}

Request MakeRequest(RequestType type, const TensorView& view, const std::string& name, int64_t group_id) {
  Request request;
  request.type = type;
  request.dtype = view.dtype;
  request.name = name;
  request.shape = view.shape;
  request.device = view.device;
  request.group_id = group_id;
  return request;
}

TensorTableEntry MakeEntry(const std::string& name, const TensorView& input, const TensorView& output) {
  TensorTableEntry entry;
  entry.name = name;
  entry.input = input;
  entry.output = output;
  return entry;
}

void EnqueueChecked(Engine& engine, int64_t handle, std::vector<Request> requests,
                    std::vector<TensorTableEntry> entries) {
  try {
    engine.Enqueue(handle, std::move(requests), std::move(entries));
  } catch (const EngineError& e) {
    TranslateStatus(e.status());
  }
}

void EnqueueAllreduce(int64_t handle, const nb::sequence& inputs, const nb::sequence& outputs,
                      const std::vector<std::string>& names, int32_t op, double prescale, double postscale,
                      int32_t process_set_id) {
  std::shared_ptr<Engine> engine = RequireEngine();
  CheckProcessSet(process_set_id);
  std::vector<TensorView> in = ToTensorViews(inputs, "allreduce input");
  std::vector<TensorView> out = ToTensorViews(outputs, "allreduce output");
  CheckNames(names, in.size());
  if (out.size() != in.size()) throw nb::value_error("allreduce needs one output per input");
  if (op < 0 || op > static_cast<int32_t>(ReduceOp::PRODUCT)) {
    throw nb::value_error(("unknown reduce op " + std::to_string(op) + "; expected one of hvd.Average, hvd.Sum, "
                           "hvd.Min, hvd.Max, hvd.Product")
                              .c_str());
  }
  if (op == static_cast<int32_t>(ReduceOp::ADASUM)) {
    TranslateStatus(Status::PreconditionError("Adasum is not supported by this release of Horovod."));
  }
  const int64_t group_id = in.size() > 1 ? handle : 0;
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < in.size(); ++i) {
    if (out[i].dtype != in[i].dtype || out[i].shape != in[i].shape) {
      throw nb::value_error(("allreduce output for '" + names[i] + "' must have the input's dtype and shape").c_str());
    }
    if (in[i].dtype == DataType::BOOL && (prescale != 1.0 || postscale != 1.0 ||
                                          op == static_cast<int32_t>(ReduceOp::AVERAGE))) {
      throw nb::value_error("bool tensors support allreduce with Sum, Min, Max or Product and no scaling only");
    }
    Request request = MakeRequest(RequestType::ALLREDUCE, in[i], names[i], group_id);
    request.reduce_op = static_cast<ReduceOp>(op);
    request.prescale_factor = prescale;
    request.postscale_factor = postscale;
    requests.push_back(std::move(request));
    entries.push_back(MakeEntry(names[i], in[i], out[i]));
  }
  EnqueueChecked(*engine, handle, std::move(requests), std::move(entries));
}

void EnqueueAllgather(int64_t handle, const nb::sequence& inputs, const std::vector<std::string>& names,
                      int32_t process_set_id) {
  std::shared_ptr<Engine> engine = RequireEngine();
  CheckProcessSet(process_set_id);
  std::vector<TensorView> in = ToTensorViews(inputs, "allgather input");
  CheckNames(names, in.size());
  const int64_t group_id = in.size() > 1 ? handle : 0;
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < in.size(); ++i) {
    requests.push_back(MakeRequest(RequestType::ALLGATHER, in[i], names[i], group_id));
    entries.push_back(MakeEntry(names[i], in[i], TensorView()));
  }
  EnqueueChecked(*engine, handle, std::move(requests), std::move(entries));
}

void EnqueueBroadcast(int64_t handle, const nb::sequence& tensors, const std::vector<std::string>& names,
                      int32_t root_rank, int32_t process_set_id) {
  std::shared_ptr<Engine> engine = RequireEngine();
  CheckProcessSet(process_set_id);
  if (root_rank < 0 || root_rank >= engine->config().size) {
    throw nb::value_error(("broadcast root rank " + std::to_string(root_rank) + " is not a rank of the process set "
                           "(expected 0 <= root_rank < " + std::to_string(engine->config().size) + ")")
                              .c_str());
  }
  std::vector<TensorView> views = ToTensorViews(tensors, "broadcast tensor");
  CheckNames(names, views.size());
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < views.size(); ++i) {
    Request request = MakeRequest(RequestType::BROADCAST, views[i], names[i], 0);
    request.root_rank = root_rank;
    requests.push_back(std::move(request));
    entries.push_back(MakeEntry(names[i], views[i], views[i]));
  }
  EnqueueChecked(*engine, handle, std::move(requests), std::move(entries));
}

std::shared_ptr<HandleState> RequireHandle(int64_t handle) {
  std::shared_ptr<Engine> engine = CurrentEngine();
  std::shared_ptr<HandleState> state = engine ? engine->GetHandle(handle) : nullptr;
  if (!state) throw nb::value_error(("unknown or already synchronized handle " + std::to_string(handle)).c_str());
  return state;
}

nb::object OutputToPython(const std::shared_ptr<OutputBuffer>& output) {
  if (!output) return nb::none();
  auto* owner = new std::shared_ptr<OutputBuffer>(output);
  nb::capsule capsule(owner, [](void* p) noexcept { delete static_cast<std::shared_ptr<OutputBuffer>*>(p); });
  std::vector<size_t> shape(output->shape().begin(), output->shape().end());
  // array_api: a nanobind.nb_ndarray object with __dlpack__/__dlpack_device__ that any framework's
  // from_dlpack wraps without a copy.
  nb::ndarray<nb::array_api> array(output->data(), shape.size(), shape.data(), capsule, nullptr,
                                   ToDLPack(output->dtype()), nb::device::cpu::value);
  return nb::cast(array);
}

// Blocks until the handle is done, with the GIL released; wakes every 100 ms to let Ctrl-C through.
nb::list Wait(int64_t handle) {
  std::shared_ptr<HandleState> state = RequireHandle(handle);
  while (true) {
    bool done;
    {
      nb::gil_scoped_release release;
      done = state->WaitFor(std::chrono::milliseconds(100));
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
  if (std::shared_ptr<Engine> engine = CurrentEngine()) engine->ReleaseHandle(handle);
  Status status = state->status();
  if (!status.ok()) TranslateStatus(status);
  nb::list result;
  for (const auto& output : state->outputs()) result.append(OutputToPython(output));
  return result;
}

void Init(const std::map<std::string, std::string>& env, nb::object store, const std::string& key_prefix) {
  std::lock_guard<std::mutex> lock(g_engine_mu);
  if (g_engine) return;
  Config config;
  try {
    config = ParseConfig(env);
  } catch (const EngineError& e) {
    TranslateStatus(e.status());
  }
  std::unique_ptr<PythonStore> python_store;
  if (!store.is_none()) python_store = std::make_unique<PythonStore>(store);
  std::unique_ptr<Engine> engine;
  {
    nb::gil_scoped_release release;
    engine = Engine::Start(config, python_store.get(), key_prefix);
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
  m.def("parse_config", [](const std::map<std::string, std::string>& env) {
    try {
      Config c = ParseConfig(env);
      nb::dict d;
      d["rank"] = c.rank; d["size"] = c.size; d["local_rank"] = c.local_rank; d["local_size"] = c.local_size;
      d["cross_rank"] = c.cross_rank; d["cross_size"] = c.cross_size; d["hostname"] = c.hostname;
      d["rendezvous_addr"] = c.rendezvous_addr; d["rendezvous_port"] = c.rendezvous_port;
      d["gloo_timeout_seconds"] = c.gloo_timeout_seconds; d["elastic"] = c.elastic;
      d["dynamic_process_sets"] = c.dynamic_process_sets; d["timeline"] = c.timeline;
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

  m.def("init", &Init, nb::arg("env"), nb::arg("store").none(), nb::arg("key_prefix"));
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

  m.def("new_handle", [] { return RequireEngine()->NewHandle(); });
  m.def("enqueue_allreduce", &EnqueueAllreduce, nb::arg("handle"), nb::arg("inputs"), nb::arg("outputs"),
        nb::arg("names"), nb::arg("op"), nb::arg("prescale_factor"), nb::arg("postscale_factor"),
        nb::arg("process_set_id"));
  m.def("enqueue_allgather", &EnqueueAllgather, nb::arg("handle"), nb::arg("inputs"), nb::arg("names"),
        nb::arg("process_set_id"));
  m.def("enqueue_broadcast", &EnqueueBroadcast, nb::arg("handle"), nb::arg("tensors"), nb::arg("names"),
        nb::arg("root_rank"), nb::arg("process_set_id"));
  m.def("poll", [](int64_t handle) { return RequireHandle(handle)->done(); });
  m.def("wait", &Wait, nb::arg("handle"));
}
