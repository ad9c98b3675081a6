// The communicator's defaults (every operation unsupported unless the transport says otherwise)
// and the forwarding base class. Compiled into the core and into each plugin.
#include "backends/communicator.h"

#include <cctype>
#include <cstring>
#include <stdexcept>

namespace horovod {

// ---- Communicator ----

std::string Communicator::Activity(const char* op) const {
  std::string activity = name();
  for (char& c : activity) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return activity + "_" + op;
}

void Communicator::Unsupported(const char* what) const {
  throw UnsupportedError(std::string("backend ") + name() + " does not support " + what);
}

std::vector<std::vector<char>> Communicator::Gatherv(const std::vector<char>&, int) { Unsupported("gatherv"); }

void Communicator::BroadcastBytes(std::vector<char>&, int) { Unsupported("broadcast of control messages"); }

void Communicator::AllreduceBitsAnd(std::vector<uint64_t>& words) {
  if (size_ == 1) return;
  std::vector<char> mine(words.size() * sizeof(uint64_t));
  std::memcpy(mine.data(), words.data(), mine.size());
  std::vector<std::vector<char>> all = Gatherv(mine, 0);
  std::vector<char> result;
  if (rank_ == 0) {
    for (const auto& theirs : all) {
      if (theirs.size() != mine.size()) throw std::runtime_error("control plane: bit vectors of different lengths");
      for (size_t i = 0; i < words.size(); ++i) {
        uint64_t w;
        std::memcpy(&w, theirs.data() + i * sizeof(uint64_t), sizeof(uint64_t));
        words[i] &= w;
      }
    }
    result.resize(mine.size());
    std::memcpy(result.data(), words.data(), result.size());
  }
  BroadcastBytes(result, 0);
  std::memcpy(words.data(), result.data(), result.size());
}

std::unique_ptr<Communicator> Communicator::Split(const std::vector<int>&, const BackendOptions&) {
  Unsupported("split");
}

void Communicator::Allreduce(const AllreduceOptions&) { Unsupported("allreduce"); }

void Communicator::AllreducePieces(const AllreducePiecesOptions&) {
  Unsupported("allreduce of separate tensors");
}

void Communicator::Allgather(const AllgatherOptions&) { Unsupported("allgather"); }

void Communicator::Broadcast(const BroadcastOptions&) { Unsupported("broadcast"); }

void Communicator::Alltoall(const AlltoallOptions&) { Unsupported("alltoall"); }

void Communicator::Reducescatter(const ReducescatterOptions&) { Unsupported("reducescatter"); }

void Communicator::Barrier() { Unsupported("barrier"); }

void Communicator::SendRecv(const SendRecvOptions&) { Unsupported("send/receive"); }

// ---- ForwardingCommunicator ----

ForwardingCommunicator::ForwardingCommunicator(std::unique_ptr<Communicator> inner)
    : Communicator(inner->rank(), inner->size()), inner_(std::move(inner)) {}

}  // namespace horovod
