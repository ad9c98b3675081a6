// Conversion between Python objects and the engine's types, for the module in bindings.cc: DLPack
// tensors in and out (without copies), alltoall splits, the rendezvous store, and the one mapping
// of engine errors onto Python exceptions.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/collective.h"
#include "common/common.h"
#include "common/store.h"
#include "common/tensor_queue.h"

namespace horovod::bindings {

namespace nb = nanobind;

// Raises the Python exception of `status`: INVALID_ARGUMENT -> ValueError, every other error ->
// horovod.common.exceptions.HorovodInternalError.
[[noreturn]] void TranslateStatus(const Status& status);

// Imports one tensor through DLPack without conversion (no copies), checking that the engine can
// use it in place (contiguous, a supported dtype, on the CPU or a CUDA device of an NCCL build).
// Raises ValueError naming `what` otherwise.
TensorView ToTensorView(nb::handle object, const char* what);
std::vector<TensorView> ToTensorViews(const nb::sequence& objects, const char* what);

// An engine-allocated output as a DLPack-capable array that shares its memory (None for null).
nb::object OutputToPython(const std::shared_ptr<OutputBuffer>& output);

// Alltoall splits: None (empty), a sequence of ints, or a 1-D int32 CPU DLPack array. Raises
// ValueError otherwise.
std::vector<int64_t> ToSplits(nb::handle splits);

// The collective named `op` (_core.enqueue's first argument); raises ValueError listing the known
// names otherwise.
const Collective& RequireCollective(std::string_view op);

// "<operation> input" and "<operation> output", the words of a collective's conversion errors,
// made once per collective rather than per call.
struct Labels {
  std::string input, output;
};
const Labels& LabelsOf(const Collective& collective);

// The rendezvous store, backed by a Python object with set(key: str, value: bytes) and
// get(key: str) -> bytes.
std::unique_ptr<Store> MakePythonStore(nb::object store);

}  // namespace horovod::bindings
