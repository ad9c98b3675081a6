#include "bindings/convert.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>

#include "backends/nccl/gpu_ops.h"

namespace horovod::bindings {

[[noreturn]] void TranslateStatus(const Status& status) {
  if (status.type() == StatusType::INVALID_ARGUMENT) throw nb::value_error(status.reason().c_str());
  nb::object error = nb::module_::import_("horovod.common.exceptions").attr("HorovodInternalError");
  PyErr_SetString(error.ptr(), status.reason().c_str());
  throw nb::python_error();
}

namespace {

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

nb::dlpack::dtype ToDLPack(DataType dtype);

}  // namespace

std::unique_ptr<Store> MakePythonStore(nb::object store) { return std::make_unique<PythonStore>(std::move(store)); }

namespace {

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

// A numpy array of the bfloat16 dtype ml_dtypes registers (what TensorFlow's and JAX's numpy
// values of bfloat16 tensors are): an array with view() whose dtype is named 'bfloat16', 2 bytes each.
bool IsNumpyBfloat16(nb::handle object) {
  if (!nb::hasattr(object, "dtype") || !nb::hasattr(object, "view")) return false;
  nb::object dtype = object.attr("dtype");
  if (!nb::hasattr(dtype, "name") || !nb::hasattr(dtype, "itemsize")) return false;
  return nb::cast<std::string>(nb::str(dtype.attr("name"))) == "bfloat16" && nb::cast<int>(dtype.attr("itemsize")) == 2;
}

}  // namespace

// Imports one tensor through DLPack without conversion (no copies), checking that the engine can
// use it in place.
TensorView ToTensorView(nb::handle object, const char* what) {
  nb::ndarray<> array;
  bool numpy_bfloat16 = false;
  if (!nb::try_cast(object, array, /*convert=*/false)) {
    numpy_bfloat16 = IsNumpyBfloat16(object);
    // numpy exports no bfloat16 through DLPack or the buffer protocol: its bits are read through a
    // uint16 view of the same memory (no copy) and the dtype restored below.
    if (numpy_bfloat16 && nb::try_cast(object.attr("view")("uint16"), array, /*convert=*/false)) {
      // array views the same buffer; the caller keeps `object` alive.
    } else {
      throw nb::value_error((std::string(what) + " must support the DLPack protocol (__dlpack__) or the buffer "
                             "protocol; got " + nb::type_name(object.type()).c_str() + ".")
                                .c_str());
    }
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
  view.dtype = numpy_bfloat16 ? DataType::BFLOAT16 : ToDataType(array.dtype());
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

const Collective& RequireCollective(std::string_view op) {
  if (const Collective* collective = CollectiveNamed(op)) return *collective;
  std::string known;
  for (const std::string& name : CollectiveNames()) known += (known.empty() ? "" : ", ") + name;
  throw nb::value_error(("unknown operation '" + std::string(op) + "'; known: " + known).c_str());
}

const Labels& LabelsOf(const Collective& collective) {
  // The collectives register from static initialisers, before any call: the table is made once, on
  // first use, and only read afterwards (no lock on the enqueue path).
  static const std::map<const Collective*, Labels> labels = [] {
    std::map<const Collective*, Labels> made;
    for (const std::string& name : CollectiveNames()) {
      made.emplace(CollectiveNamed(name), Labels{name + " input", name + " output"});
    }
    return made;
  }();
  return labels.at(&collective);
}

}  // namespace horovod::bindings
