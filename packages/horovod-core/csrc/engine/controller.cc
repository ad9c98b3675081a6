#include "controller.h"

#include <sstream>

#include "fusion.h"
#include "logging.h"

namespace horovod {

namespace {

std::string DeviceName(int32_t device) { return device == kCpuDevice ? "CPU" : "GPU " + std::to_string(device); }

// Checks every rank's request for `name` against the first one; returns an error text naming the
// operation and both conflicting values, or "" when they agree. The order of checks is spec
// core.md §6.11's: the first failure wins.
std::string FindMismatch(const std::vector<Request>& requests) {
  const Request& first = requests[0];
  const char* op = RequestTypeName(first.type);
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
      err << "Mismatched operations: one rank did an " << op << ", but another rank did an "
          << RequestTypeName(r.type) << " on tensor " << first.name << ".";
      return err.str();
    }
  }
  if (first.type == RequestType::ALLREDUCE || first.type == RequestType::BROADCAST) {
    for (const Request& r : requests) {
      if (r.shape != first.shape) {
        err << "Mismatched " << op << " tensor shapes: one rank sent a tensor of shape " << ShapeString(first.shape)
            << ", but another rank sent a tensor of shape " << ShapeString(r.shape) << " (tensor " << first.name
            << ").";
        return err.str();
      }
    }
  }
  if (first.type == RequestType::ALLREDUCE) {
    for (const Request& r : requests) {
      if (r.prescale_factor != first.prescale_factor || r.postscale_factor != first.postscale_factor) {
        err << "Mismatched prescale and/or postscale factors: one rank sent factors " << first.prescale_factor << ", "
            << first.postscale_factor << ", but another rank sent factors " << r.prescale_factor << ", "
            << r.postscale_factor << " (tensor " << first.name << ").";
        return err.str();
      }
    }
    for (const Request& r : requests) {
      if (r.reduce_op != first.reduce_op) {
        err << "Mismatched reduction operations: one rank requested " << ReduceOpName(first.reduce_op)
            << ", but another rank requested " << ReduceOpName(r.reduce_op) << " (tensor " << first.name << ").";
        return err.str();
      }
    }
  }
  if (first.type == RequestType::ALLGATHER) {
    if (first.shape.empty()) {
      return "Allgather requires tensors of at least one dimension; rank " + std::to_string(first.rank) +
             " sent a scalar (tensor " + first.name + ").";
    }
    for (const Request& r : requests) {
      if (r.shape.size() != first.shape.size()) {
        err << "Mismatched " << op << " tensor ranks: one rank sent a tensor of rank " << first.shape.size()
            << ", but another rank sent a tensor of rank " << r.shape.size() << " (tensor " << first.name << ").";
        return err.str();
      }
      for (size_t d = 1; d < r.shape.size(); ++d) {
        if (r.shape[d] != first.shape[d]) {
          err << "Mismatched " << op << " tensor shapes: one rank sent a tensor with dimension " << d << " equal to "
              << first.shape[d] << ", but another rank sent a tensor with dimension " << d << " equal to "
              << r.shape[d] << " (tensor " << first.name << ").";
          return err.str();
        }
      }
    }
  }
  if (first.type == RequestType::BROADCAST) {
    for (const Request& r : requests) {
      if (r.root_rank != first.root_rank) {
        err << "Mismatched " << op << " root ranks: one rank specified root rank " << first.root_rank
            << ", but another rank specified root rank " << r.root_rank << " (tensor " << first.name << ").";
        return err.str();
      }
    }
  }
  for (const Request& r : requests) {
    if (r.device != first.device) {
      err << "Mismatched " << op << " CPU/GPU device selection: one rank specified device " << DeviceName(first.device)
          << ", but another rank specified device " << DeviceName(r.device) << " (tensor " << first.name << ").";
      return err.str();
    }
  }
  return "";
}

}  // namespace

Controller::Controller(Backend& backend, const Config& config) : backend_(backend), config_(config) {}

void Controller::RecordRequests(const RequestList& list, int rank, std::vector<std::string>& ready) {
  for (const Request& request : list.requests) {
    std::vector<Request>& pending = pending_[request.name];
    pending.push_back(request);
    pending.back().rank = rank;
    if (static_cast<int>(pending.size()) == backend_.size()) ready.push_back(request.name);
  }
}

Response Controller::BuildResponse(const std::string& name) {
  auto it = pending_.find(name);
  std::vector<Request> requests = std::move(it->second);
  pending_.erase(it);

  Response response;
  response.names.push_back(name);
  std::string mismatch = FindMismatch(requests);
  if (!mismatch.empty()) {
    response.type = ResponseType::ERROR;
    response.error_message = mismatch;
    return response;
  }
  const Request& first = requests[0];
  response.type = static_cast<ResponseType>(first.type);
  response.dtype = first.dtype;
  response.reduce_op = first.reduce_op;
  response.prescale_factor = first.prescale_factor;
  response.postscale_factor = first.postscale_factor;
  response.root_rank = first.root_rank;
  response.device = first.device;
  response.group_id = first.group_id;
  if (first.type == RequestType::ALLREDUCE) {
    response.tensor_sizes.push_back(NumElements(first.shape));
  } else if (first.type == RequestType::ALLGATHER) {
    response.tensor_sizes.assign(backend_.size(), 0);
    for (const Request& r : requests) response.tensor_sizes[r.rank] = r.shape[0];
  }
  return response;
}

ResponseList Controller::Coordinate(const std::vector<RequestList>& lists) {
  ResponseList list;
  std::vector<std::string> ready;
  for (int rank = 0; rank < static_cast<int>(lists.size()); ++rank) {
    list.shutdown = list.shutdown || lists[rank].shutdown;
    RecordRequests(lists[rank], rank, ready);
  }
  for (const auto& name : ready) list.responses.push_back(BuildResponse(name));
  list.responses =
      FuseResponses(std::move(list.responses), config_.fusion_threshold_bytes, config_.disable_group_fusion);
  return list;
}

ResponseList Controller::ComputeResponseList(std::vector<Request> requests, bool shutdown) {
  std::vector<RequestList> lists(1);
  lists[0].requests = std::move(requests);
  lists[0].shutdown = shutdown;
  if (backend_.size() == 1) return Coordinate(lists);

  const int root = 0;
  std::vector<std::vector<char>> gathered = backend_.Gatherv(Serialize(lists[0]), root);
  std::vector<char> reply;
  if (backend_.rank() != root) {
    backend_.Broadcast(reply, root);
    return DeserializeResponseList(reply);
  }
  lists.clear();
  for (const auto& bytes : gathered) lists.push_back(DeserializeRequestList(bytes));
  ResponseList list = Coordinate(lists);
  reply = Serialize(list);
  backend_.Broadcast(reply, root);
  return list;
}

}  // namespace horovod
