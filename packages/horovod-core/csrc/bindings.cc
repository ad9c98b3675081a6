// The only nanobind file: builds horovod.common._core. It converts Python and DLPack arguments
// into engine types, releases the GIL around blocking calls, and maps engine errors onto Python
// exceptions (in TranslateStatus, the one place that does so). The Python package horovod.common
// re-exports a clean API over this module.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "backends/communicator.h"
#include "backends/nccl/gpu_ops.h"
#include "engine/autotune/bayesian_optimization.h"
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
  // The engine may be destroyed on a thread without the GIL.
  ~PythonStore() override {
    if (Py_IsInitialized()) {
      nb::gil_scoped_acquire gil;
      store_.reset();
    } else {
      store_.release();
    }
  }
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
  TensorView view;
  if (array.device_type() == nb::device::cuda::value && NcclVersionBuilt() != 0) {
    view.device = array.device_id();
  } else if (array.device_type() != nb::device::cpu::value) {
    if (NcclVersionBuilt() == 0) {
      throw nb::value_error((std::string(what) + " is on a GPU device; this build of Horovod supports CPU tensors "
                             "only (GPU tensors need a build with NCCL).")
                                .c_str());
    }
    throw nb::value_error((std::string(what) + " is on DLPack device type " + std::to_string(array.device_type()) +
                           "; Horovod supports CPU and CUDA tensors only.")
                              .c_str());
  }
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

// GPU tensors: records the ready event of each on the framework's `stream` (gpu_ops.h), loading
// the NCCL plugin on first use. Nothing happens for CPU tensors.
void AttachStream(std::vector<TensorTableEntry>& entries, intptr_t stream) {
  for (TensorTableEntry& entry : entries) {
    if (entry.input.device == kCpuDevice) continue;
    std::string why;
    GpuOps* gpu = LoadGpuOps(&why);
    if (gpu == nullptr) TranslateStatus(Status::PreconditionError("Cannot run '" + entry.name + "' on a GPU: " + why + "."));
    entry.stream = stream;
    try {
      entry.ready_event = gpu->RecordEvent(entry.input.device, stream);
    } catch (const std::exception& e) {
      TranslateStatus(Status::PreconditionError(e.what()));
    }
  }
}

// NCCL reduces these types only (it has no int16, uint16 or bool reductions).
void CheckGpuReduction(const TensorView& view, const char* op) {
  if (view.device == kCpuDevice) return;
  switch (view.dtype) {
    case DataType::UINT8: case DataType::INT8: case DataType::INT32: case DataType::INT64: case DataType::FLOAT16:
    case DataType::BFLOAT16: case DataType::FLOAT32: case DataType::FLOAT64:
      return;
    default:
      throw nb::value_error((std::string(op) + " of " + DataTypeName(view.dtype) + " GPU tensors is not supported "
                             "(NCCL reduces uint8, int8, int32, int64, float16, bfloat16, float32 and float64).")
                                .c_str());
  }
}

void EnqueueChecked(Engine& engine, int32_t process_set_id, int64_t handle, std::vector<Request> requests,
                    std::vector<TensorTableEntry> entries, intptr_t stream = 0) {
  AttachStream(entries, stream);
  try {
    engine.Enqueue(process_set_id, handle, std::move(requests), std::move(entries));
  } catch (const EngineError& e) {
    TranslateStatus(e.status());
  }
}

void EnqueueAllreduce(int64_t handle, const nb::sequence& inputs, const nb::sequence& outputs,
                      const std::vector<std::string>& names, int32_t op, double prescale, double postscale,
                      int32_t process_set_id, intptr_t stream) {
  std::shared_ptr<Engine> engine = RequireEngine();
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
  if (op < 0 || op > static_cast<int32_t>(ReduceOp::PRODUCT)) {
    throw nb::value_error(("unknown reduce op " + std::to_string(op) + "; expected one of hvd.Average, hvd.Sum, "
                           "hvd.Min, hvd.Max, hvd.Product")
                              .c_str());
  }
  const bool adasum = op == static_cast<int32_t>(ReduceOp::ADASUM);
  if (adasum) {
    // Spec core.md §6.10: global set only; on CPU a power-of-two number of ranks.
    if (process_set_id != 0) {
      TranslateStatus(Status::PreconditionError("Adasum is supported on the global process set only."));
    }
    const int size = engine->config().size;
    if ((size & (size - 1)) != 0) {
      TranslateStatus(Status::PreconditionError("Adasum on CPU tensors needs a power-of-two number of ranks; this "
                                                "job has " + std::to_string(size) + " (non-power-of-2 ranks unsupported)."));
    }
    for (const TensorView& v : in) {
      if (v.device != kCpuDevice) {
        TranslateStatus(Status::PreconditionError("Adasum is not supported on GPU tensors by this build of Horovod."));
      }
      if (v.dtype != DataType::FLOAT16 && v.dtype != DataType::FLOAT32 && v.dtype != DataType::FLOAT64) {
        throw nb::value_error(("Adasum supports float16, float32 and float64 tensors; got " +
                               std::string(DataTypeName(v.dtype)) + ".").c_str());
      }
    }
  }
  const int64_t group_id = GroupId(names);
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < in.size(); ++i) {
    if (out[i].dtype != in[i].dtype || out[i].shape != in[i].shape) {
      throw nb::value_error(("allreduce output for '" + names[i] + "' must have the input's dtype and shape").c_str());
    }
    if (out[i].device != in[i].device) {
      throw nb::value_error(("allreduce output for '" + names[i] + "' must be on the input's device").c_str());
    }
    CheckGpuReduction(in[i], "allreduce");
    if (in[i].dtype == DataType::BOOL && (prescale != 1.0 || postscale != 1.0 ||
                                          op == static_cast<int32_t>(ReduceOp::AVERAGE))) {
      throw nb::value_error("bool tensors support allreduce with Sum, Min, Max or Product and no scaling only");
    }
    Request request = MakeRequest(adasum ? RequestType::ADASUM : RequestType::ALLREDUCE, in[i], names[i], group_id);
    request.reduce_op = static_cast<ReduceOp>(op);
    request.prescale_factor = prescale;
    request.postscale_factor = postscale;
    requests.push_back(std::move(request));
    entries.push_back(MakeEntry(names[i], in[i], out[i]));
  }
  EnqueueChecked(*engine, process_set_id, handle, std::move(requests), std::move(entries), stream);
}

void EnqueueAllgather(int64_t handle, const nb::sequence& inputs, const std::vector<std::string>& names,
                      int32_t process_set_id, intptr_t stream) {
  std::shared_ptr<Engine> engine = RequireEngine();
  std::vector<TensorView> in = ToTensorViews(inputs, "allgather input");
  CheckNames(names, in.size());
  const int64_t group_id = GroupId(names);
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < in.size(); ++i) {
    requests.push_back(MakeRequest(RequestType::ALLGATHER, in[i], names[i], group_id));
    entries.push_back(MakeEntry(names[i], in[i], TensorView()));
  }
  EnqueueChecked(*engine, process_set_id, handle, std::move(requests), std::move(entries), stream);
}

void EnqueueBroadcast(int64_t handle, const nb::sequence& tensors, const std::vector<std::string>& names,
                      int32_t root_rank, int32_t process_set_id, intptr_t stream) {
  std::shared_ptr<Engine> engine = RequireEngine();
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
  EnqueueChecked(*engine, process_set_id, handle, std::move(requests), std::move(entries), stream);
}

// splits: None, a sequence of ints, or a 1-D int32 DLPack array.
std::vector<int64_t> ToSplits(nb::handle splits) {
  std::vector<int64_t> out;
  if (splits.is_none()) return out;
  nb::ndarray<> array;
  if (nb::try_cast(splits, array, /*convert=*/false)) {
    if (array.dtype() != nb::dtype<int32_t>()) {
      throw nb::value_error("alltoall splits must be an int32 tensor (or a list of ints).");
    }
    if (array.ndim() > 1) {
      throw nb::value_error(("alltoall splits must be a 1-D tensor; got " + std::to_string(array.ndim()) +
                             " dimensions.").c_str());
    }
    if (array.device_type() != nb::device::cpu::value) throw nb::value_error("alltoall splits must be on the CPU.");
    const size_t n = array.ndim() == 0 ? 1 : array.shape(0);
    const int64_t stride = array.ndim() == 0 ? 1 : array.stride(0);
    const auto* data = static_cast<const int32_t*>(array.data());
    for (size_t i = 0; i < n; ++i) out.push_back(data[i * stride]);
    return out;
  }
  if (!nb::isinstance<nb::sequence>(splits)) {
    throw nb::value_error("alltoall splits must be None, a sequence of ints or a 1-D int32 tensor.");
  }
  for (nb::handle item : nb::borrow<nb::sequence>(splits)) {
    if (!nb::isinstance<nb::int_>(item)) throw nb::value_error("alltoall splits must contain ints only.");
    out.push_back(nb::cast<int64_t>(item));
  }
  return out;
}

void EnqueueAlltoall(int64_t handle, nb::handle tensor, nb::handle splits, const std::string& name,
                     int32_t process_set_id, intptr_t stream) {
  std::shared_ptr<Engine> engine = RequireEngine();
  // A scalar is refused at negotiation, like a scalar allgather (spec core.md §6.11).
  TensorView view = ToTensorView(tensor, "alltoall input");
  Request request = MakeRequest(RequestType::ALLTOALL, view, name, 0);
  request.splits = ToSplits(splits);
  std::vector<Request> requests{request};
  std::vector<TensorTableEntry> entries{MakeEntry(name, view, TensorView())};
  EnqueueChecked(*engine, process_set_id, handle, std::move(requests), std::move(entries), stream);
}

void EnqueueReducescatter(int64_t handle, const nb::sequence& inputs, const std::vector<std::string>& names,
                          int32_t op, double prescale, double postscale, int32_t process_set_id, intptr_t stream) {
  std::shared_ptr<Engine> engine = RequireEngine();
  if (op != static_cast<int32_t>(ReduceOp::AVERAGE) && op != static_cast<int32_t>(ReduceOp::SUM)) {
    TranslateStatus(Status::Aborted("Reducescatter supports only the Average and Sum reduce ops; got op " +
                                    std::to_string(op) + "."));
  }
  std::vector<TensorView> in = ToTensorViews(inputs, "reducescatter input");
  CheckNames(names, in.size());
  const int64_t group_id = GroupId(names);
  std::vector<Request> requests;
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].dtype == DataType::BOOL) throw nb::value_error("reducescatter does not support bool tensors.");
    CheckGpuReduction(in[i], "reducescatter");
    Request request = MakeRequest(RequestType::REDUCESCATTER, in[i], names[i], group_id);
    request.reduce_op = static_cast<ReduceOp>(op);
    request.prescale_factor = prescale;
    request.postscale_factor = postscale;
    requests.push_back(std::move(request));
    entries.push_back(MakeEntry(names[i], in[i], TensorView()));
  }
  EnqueueChecked(*engine, process_set_id, handle, std::move(requests), std::move(entries), stream);
}

// Barrier, join and process set registration: one request without a tensor.
void EnqueueControl(int64_t handle, RequestType type, const std::string& name, std::vector<int64_t> args,
                    int32_t process_set_id) {
  std::shared_ptr<Engine> engine = RequireEngine();
  Request request;
  request.type = type;
  request.dtype = DataType::UINT8;
  request.name = name;
  request.shape = std::move(args);
  std::vector<Request> requests{request};
  TensorTableEntry entry;
  entry.name = name;
  std::vector<TensorTableEntry> entries{entry};
  EnqueueChecked(*engine, process_set_id, handle, std::move(requests), std::move(entries));
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
  const bool on_gpu = output->device() != kCpuDevice;
  nb::ndarray<nb::array_api> array(output->data(), shape.size(), shape.data(), capsule, nullptr,
                                   ToDLPack(output->dtype()), on_gpu ? nb::device::cuda::value : nb::device::cpu::value,
                                   on_gpu ? output->device() : 0);
  return nb::cast(array);
}

// Blocks until the handle is done, with the GIL released; wakes every 100 ms to let Ctrl-C through.
nb::list Wait(int64_t handle) {
  std::shared_ptr<HandleState> state = RequireHandle(handle);
  if (!state->done()) {
    if (std::shared_ptr<Engine> engine = CurrentEngine()) engine->NotifyWaiting();
  }
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
int64_t RunControl(RequestType type, const std::string& name, std::vector<int64_t> args) {
  std::shared_ptr<Engine> engine = RequireEngine();
  int64_t handle = engine->NewHandle();
  EnqueueControl(handle, type, name, std::move(args), 0);
  nb::list result = Wait(handle);
  return nb::cast<int64_t>(result[0]);
}

void RequireDynamicSets(const Engine& engine, const char* what) {
  if (!engine.config().dynamic_process_sets) {
    throw nb::value_error((std::string(what) + " needs dynamic process sets: set HOROVOD_DYNAMIC_PROCESS_SETS=1 "
                           "or call hvd.init(process_sets=\"dynamic\").").c_str());
  }
}

std::vector<int64_t> CheckRanks(const Engine& engine, std::vector<int64_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  const int size = engine.config().size;
  if (ranks.empty()) throw nb::value_error("A process set needs at least one rank.");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size) {
      throw nb::value_error(("Process set rank " + std::to_string(ranks[i]) + " is out of range: expected 0 <= rank < " +
                             std::to_string(size) + ".").c_str());
    }
    if (i > 0 && ranks[i] == ranks[i - 1]) {
      throw nb::value_error(("Process set rank " + std::to_string(ranks[i]) + " is listed twice.").c_str());
    }
  }
  return ranks;
}

nb::object AddProcessSet(std::vector<int64_t> ranks) {
  std::shared_ptr<Engine> engine = RequireEngine();
  RequireDynamicSets(*engine, "hvd.add_process_set()");
  int64_t id = RunControl(RequestType::ADD_PROCESS_SET, "add_process_set.noname", CheckRanks(*engine, std::move(ranks)));
  if (id < 0) return nb::none();
  return nb::int_(id);
}

nb::object RemoveProcessSet(int64_t id) {
  std::shared_ptr<Engine> engine = RequireEngine();
  RequireDynamicSets(*engine, "hvd.remove_process_set()");
  int64_t removed = RunControl(RequestType::REMOVE_PROCESS_SET, "remove_process_set.noname", {id});
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
  if (!store.is_none()) python_store = std::make_unique<PythonStore>(store);
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
  m.def("mpi_finalize", [] { BackendRegistry::FinalizeMpi(); },
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

  m.def("new_handle", [] { return RequireEngine()->NewHandle(); });
  m.def("enqueue_allreduce", &EnqueueAllreduce, nb::arg("handle"), nb::arg("inputs"), nb::arg("outputs"),
        nb::arg("names"), nb::arg("op"), nb::arg("prescale_factor"), nb::arg("postscale_factor"),
        nb::arg("process_set_id"), nb::arg("stream") = 0);
  m.def("enqueue_allgather", &EnqueueAllgather, nb::arg("handle"), nb::arg("inputs"), nb::arg("names"),
        nb::arg("process_set_id"), nb::arg("stream") = 0);
  m.def("enqueue_broadcast", &EnqueueBroadcast, nb::arg("handle"), nb::arg("tensors"), nb::arg("names"),
        nb::arg("root_rank"), nb::arg("process_set_id"), nb::arg("stream") = 0);
  m.def("enqueue_alltoall", &EnqueueAlltoall, nb::arg("handle"), nb::arg("tensor"), nb::arg("splits").none(),
        nb::arg("name"), nb::arg("process_set_id"), nb::arg("stream") = 0);
  m.def("enqueue_reducescatter", &EnqueueReducescatter, nb::arg("handle"), nb::arg("inputs"), nb::arg("names"),
        nb::arg("op"), nb::arg("prescale_factor"), nb::arg("postscale_factor"), nb::arg("process_set_id"),
        nb::arg("stream") = 0);
  m.def("enqueue_barrier", [](int64_t handle, int32_t process_set_id) {
    EnqueueControl(handle, RequestType::BARRIER, "barrier.noname", {}, process_set_id);
  }, nb::arg("handle"), nb::arg("process_set_id"));
  m.def("enqueue_join", [](int64_t handle) { EnqueueControl(handle, RequestType::JOIN, "join.noname", {}, 0); },
        nb::arg("handle"));
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
    d["negotiation_us"] = s.negotiation_us;
    d["shared_memory"] = engine->shared_memory();
    d["shared_memory_single_copy"] = engine->shared_memory_single_copy();
    Engine::HierarchicalStats h = engine->hierarchical_stats();
    d["hosts"] = engine->num_hosts();
    d["hierarchical"] = h.available;
    d["hierarchical_allreduce"] = h.allreduce;
    d["hierarchical_allgather"] = h.allgather;
    d["hierarchical_allreduces"] = h.allreduces;
    d["hierarchical_allgathers"] = h.allgathers;
    d["hierarchical_shared_memory"] = h.local_shared_memory;
    return d;
  }, "Negotiation counters of the global process set (cycles, coordinator_rounds, cache_hits, negotiation_us), "
     "whether its collectives go through shared memory (shared_memory) and its large allreduces read the peers' "
     "buffers directly (shared_memory_single_copy); the number of hosts the ranks are grouped into (hosts, by "
     "HOROVOD_HOSTNAME when set), whether the hierarchical collectives were set up (hierarchical: several hosts with "
     "the same number of ranks each, and hierarchical allreduce/allgather asked for or autotuned), whether each is "
     "switched on now (hierarchical_allreduce, hierarchical_allgather), how many allreduces/allgathers went that "
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
  // The autotuner's optimiser on its own, so that tests can check it against known functions.
  nb::class_<BayesianOptimization>(m, "BayesianOptimization")
      .def("__init__", [](BayesianOptimization* self, std::vector<std::pair<double, double>> bounds, double noise,
                          double xi, uint64_t seed) {
        try {
          new (self) BayesianOptimization(std::move(bounds), noise, xi, seed);
        } catch (const std::invalid_argument& e) {
          throw nb::value_error(e.what());
        }
      }, nb::arg("bounds"), nb::arg("noise"), nb::arg("xi") = 0.01, nb::arg("seed") = 1)
      .def("add_sample", [](BayesianOptimization& self, const std::vector<double>& x, double score) {
        try {
          self.AddSample(x, score);
        } catch (const std::invalid_argument& e) {
          throw nb::value_error(e.what());
        }
      }, nb::arg("x"), nb::arg("score"))
      .def("next_sample", &BayesianOptimization::NextSample)
      .def("expected_improvement", &BayesianOptimization::ExpectedImprovement, nb::arg("x"))
      .def_prop_ro("num_samples", &BayesianOptimization::num_samples);
  m.def("poll", [](int64_t handle) { return RequireHandle(handle)->done(); });
  m.def("wait", &Wait, nb::arg("handle"));
}
