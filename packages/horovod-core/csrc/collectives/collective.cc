#include "collectives/collective.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>
#include <stdexcept>

namespace horovod {

namespace {

std::map<OpType, std::unique_ptr<Collective>>& Registry() {
  static std::map<OpType, std::unique_ptr<Collective>> registry;
  return registry;
}

// The registry by lower_name() (_core.enqueue looks every submission up by name).
std::map<std::string, const Collective*, std::less<>>& ByName() {
  static std::map<std::string, const Collective*, std::less<>> by_name;
  return by_name;
}

std::string DeviceName(int32_t device) { return device == kCpuDevice ? "CPU" : "GPU"; }

}  // namespace

bool RegisterCollective(std::unique_ptr<Collective> collective) {
  const OpType type = collective->type();
  ByName()[collective->lower_name()] = collective.get();
  Registry()[type] = std::move(collective);
  return true;
}

std::string Collective::lower_name() const {
  std::string lower = name();
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

const Collective* CollectiveNamed(std::string_view name) {
  auto& by_name = ByName();
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

std::vector<std::string> CollectiveNames() {
  std::vector<std::string> names;
  for (const auto& [name, collective] : ByName()) names.push_back(name);
  return names;
}

const Collective& CollectiveFor(OpType type) {
  auto& registry = Registry();
  auto it = registry.find(type);
  if (it == registry.end()) throw std::logic_error(std::string("no collective for ") + OpTypeName(type));
  return *it->second;
}

std::string FindMismatch(const std::vector<Request>& requests, const AgreementContext& context) {
  const Request& first = requests[0];
  const char* op = OpTypeName(first.type);
  std::ostringstream err;
  for (const Request& r : requests) {
    if (r.dtype != first.dtype) {
      err << "Mismatched data types: one rank had type " << DataTypeName(first.dtype) << ", but another rank had type "
          << DataTypeName(r.dtype) << " (tensor " << first.name << ", operation " << op << ").";
      return err.str();
    }
  }
  for (const Request& r : requests) {
    if (r.type != first.type) {
      err << "Mismatched operations: one rank did an " << op << ", but another rank did an " << OpTypeName(r.type)
          << " on tensor " << first.name << ".";
      return err.str();
    }
  }
  std::string mismatch = CollectiveFor(first.type).CheckAgreement(requests, context);
  if (!mismatch.empty()) return mismatch;
  // The kind of device only: each rank uses its own GPU (usually its local rank's).
  for (const Request& r : requests) {
    if ((r.device == kCpuDevice) != (first.device == kCpuDevice)) {
      err << "Mismatched " << op << " CPU/GPU device selection: one rank specified device " << DeviceName(first.device)
          << ", but another rank specified device " << DeviceName(r.device) << " (tensor " << first.name << ").";
      return err.str();
    }
  }
  return "";
}

namespace agreement {

std::string SameShape(const std::vector<Request>& requests) {
  const Request& first = requests[0];
  for (const Request& r : requests) {
    if (r.shape != first.shape) {
      std::ostringstream err;
      err << "Mismatched " << OpTypeName(first.type) << " tensor shapes: one rank sent a tensor of shape "
          << ShapeString(first.shape) << ", but another rank sent a tensor of shape " << ShapeString(r.shape)
          << " (tensor " << first.name << ").";
      return err.str();
    }
  }
  return "";
}

std::string SameScaleAndOp(const std::vector<Request>& requests) {
  const Request& first = requests[0];
  const char* op = OpTypeName(first.type);
  std::ostringstream err;
  for (const Request& r : requests) {
    if (r.prescale_factor != first.prescale_factor || r.postscale_factor != first.postscale_factor) {
      err << "Mismatched prescale and/or postscale factors: one rank sent factors " << first.prescale_factor << ", "
          << first.postscale_factor << ", but another rank sent factors " << r.prescale_factor << ", "
          << r.postscale_factor << " (tensor " << first.name << ", operation " << op << ").";
      return err.str();
    }
  }
  for (const Request& r : requests) {
    if (r.reduce_op != first.reduce_op) {
      err << "Mismatched reduction operations: one rank requested " << ReduceOpName(first.reduce_op)
          << ", but another rank requested " << ReduceOpName(r.reduce_op) << " (tensor " << first.name
          << ", operation " << op << ").";
      return err.str();
    }
  }
  return "";
}

std::string GatherLikeShapes(const std::vector<Request>& requests, bool any_joined) {
  const Request& first = requests[0];
  const std::string op = OpTypeName(first.type);
  if (any_joined) {
    std::string msg = op + " is not supported with Join at this time (tensor " + first.name + ").";
    if (first.type == OpType::ALLGATHER) {
      msg += " If sparse gradients reach an allgather, use sparse_as_dense=True in DistributedOptimizer.";
    }
    return msg;
  }
  for (const Request& r : requests) {
    if (r.shape.empty()) {
      return op + " requires tensors of at least one dimension; rank " + std::to_string(r.rank) +
             " sent a scalar (tensor " + first.name + ").";
    }
  }
  std::ostringstream err;
  for (const Request& r : requests) {
    if (r.shape.size() != first.shape.size()) {
      err << "Mismatched " << op << " tensor ranks: one rank sent a tensor of rank " << first.shape.size()
          << ", but another rank sent a tensor of rank " << r.shape.size() << " (tensor " << first.name << ").";
      return err.str();
    }
    for (size_t d = 1; d < r.shape.size(); ++d) {
      if (r.shape[d] != first.shape[d]) {
        err << "Mismatched " << op << " tensor shapes: one rank sent a tensor with dimension " << d << " equal to "
            << first.shape[d] << ", but another rank sent a tensor with dimension " << d << " equal to " << r.shape[d]
            << " (tensor " << first.name << ").";
        return err.str();
      }
    }
  }
  return "";
}

}  // namespace agreement

Reduction EffectiveReduction(const Response& response, int size) {
  Reduction reduction{response.reduce_op, response.postscale_factor};
  if (reduction.op == ReduceOp::AVERAGE) {
    reduction.postscale /= size;
    reduction.op = ReduceOp::SUM;
  }
  return reduction;
}

int SetRankOf(const std::vector<int>& set_ranks, int global_rank) {
  return static_cast<int>(std::lower_bound(set_ranks.begin(), set_ranks.end(), global_rank) - set_ranks.begin());
}

int64_t RowBytes(DataType dtype, const std::vector<int64_t>& shape) {
  std::vector<int64_t> row_shape(shape.begin() + (shape.empty() ? 0 : 1), shape.end());
  return NumElements(row_shape) * static_cast<int64_t>(DataTypeSize(dtype));
}

}  // namespace horovod
