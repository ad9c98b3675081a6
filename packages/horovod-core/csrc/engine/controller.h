// Negotiation: deciding, once per cycle, which tensors every rank of a communicator runs and in
// which order.
//
// Every rank sends the requests submitted since the last cycle to the coordinator (rank 0 of the
// communicator). The coordinator counts, per tensor name, which ranks have submitted it; a name is
// ready once all ranks have. It checks that the ranks agree on the operation (dtype, op type,
// shape, scale factors, reduce op, root, device), turning disagreement into an ERROR response, fuses
// ready allreduces, and broadcasts the ordered response list, with the OR of every rank's shutdown
// flag. Every rank then executes that list, so all ranks run the same operations in the same order
// whatever order they submitted them in.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "backend.h"
#include "config.h"
#include "message.h"

namespace horovod {

class Controller {
 public:
  Controller(Backend& backend, const Config& config);
  // Collective over the communicator: every rank calls it once per cycle.
  ResponseList ComputeResponseList(std::vector<Request> requests, bool shutdown);

 private:
  // Coordinator only: records one rank's requests; appends names that became ready to `ready`.
  void RecordRequests(const RequestList& list, int rank, std::vector<std::string>& ready);
  Response BuildResponse(const std::string& name);
  // Coordinator only: turns every rank's request list (indexed by rank) into the response list.
  ResponseList Coordinate(const std::vector<RequestList>& lists);

  Backend& backend_;
  const Config& config_;
  // Per tensor name, the requests of the ranks that have submitted it, in arrival order. A rank
  // never has two requests of one name in flight (TensorQueue refuses duplicates), so the count
  // of requests is the count of ranks.
  std::unordered_map<std::string, std::vector<Request>> pending_;
};

}  // namespace horovod
