// The synchronous mesh's control plane: the response cache's round (with an eager allreduce's data
// riding along), the coordinator's gather of requests and its broadcast of responses.
#include <cstring>
#include <stdexcept>
#include <string>

#include "backends/gloo/sync_mesh.h"
#include "backends/gloo/tuning.h"
#include "common/reduction.h"

namespace horovod::gloo_backend {

// The cache round, every rank's words ANDed, with an allreduce's data where a rank has one
// (Communicator::AllreduceBitsAndEager; tag 0: none): each rank sends every other one framed
// message, [tag, data bytes, words..., data], where the data rides along when it fits the first
// staged message, and otherwise follows in a message of its own, straight from the tensor. The
// data is reduced in rank order as it arrives (from rank 0 up), into `output` directly at two
// ranks and into scratch_ at more, until some rank's tag differs from this one's; the rest is
// read and dropped. The messages go through buffers kept from round to round (this runs every
// cycle): round_out_, and each peer's `round`, which holds its inline data until its next round.
bool SyncMesh::AllreduceBitsAndEager(std::vector<uint64_t>& words, const EagerAllreduceOptions& eager) {
  const int64_t bytes = eager.tag != 0 ? eager.count * DataTypeSize(eager.dtype) : 0;
  if (bytes > one_step_bytes()) throw std::logic_error("eager allreduce of more than the one-step size");
  constexpr size_t kHeadWords = 2;
  const size_t head_bytes = (kHeadWords + words.size()) * sizeof(uint64_t);
  auto inline_data = [&](uint64_t n) { return head_bytes + n <= kDirectBytes - kFrameHeader; };
  const bool inline_mine = inline_data(static_cast<uint64_t>(bytes));
  round_out_.resize(head_bytes + (inline_mine ? bytes : 0));
  const uint64_t head[kHeadWords] = {eager.tag, static_cast<uint64_t>(bytes)};
  std::memcpy(round_out_.data(), head, sizeof(head));
  std::memcpy(round_out_.data() + sizeof(head), words.data(), words.size() * sizeof(uint64_t));
  if (inline_mine && bytes > 0) std::memcpy(round_out_.data() + head_bytes, eager.input, static_cast<size_t>(bytes));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    SendFramed(r, round_out_);
    if (!inline_mine && bytes > 0) Send(r, eager.input, static_cast<size_t>(bytes));
  }
  bool agreed = eager.tag != 0;
  const void* acc = nullptr;  // x_0 op ... op x_r once rank r's data is in
  char* into = size_ == 2 ? static_cast<char*>(eager.output) : scratch_.data();
  for (int r = 0; r < size_; ++r) {
    const void* theirs = eager.input;
    if (r != rank_) {
      std::vector<char>& got = peers_[r].round;
      RecvFramed(r, got);
      uint64_t their_head[kHeadWords] = {};
      if (got.size() >= head_bytes) std::memcpy(their_head, got.data(), sizeof(their_head));
      const uint64_t n = their_head[1];
      if (got.size() < head_bytes || n > static_cast<uint64_t>(one_step_bytes()) ||
          got.size() != head_bytes + (inline_data(n) ? n : 0)) {
        throw std::runtime_error("control plane: rank " + std::to_string(r) + " sent a cache round of " +
                                 std::to_string(got.size()) + " bytes; expected " + std::to_string(head_bytes) +
                                 " and the data it announced (" + std::to_string(n) + " bytes)");
      }
      for (size_t i = 0; i < words.size(); ++i) {
        uint64_t w;
        std::memcpy(&w, got.data() + sizeof(their_head) + i * sizeof(uint64_t), sizeof(w));
        words[i] &= w;
      }
      if (n == 0) {
        theirs = nullptr;
      } else if (inline_data(n)) {
        theirs = got.data() + head_bytes;
      } else {
        theirs = Recv(r, static_cast<size_t>(n));  // valid until the next message from rank r
      }
      if (their_head[0] != eager.tag || n != static_cast<uint64_t>(bytes)) agreed = false;
    }
    if (!agreed) continue;
    if (r == 0) {
      acc = theirs;
      continue;
    }
    Reduce(into, acc, theirs, eager.count, eager.dtype, eager.op);
    acc = into;
  }
  if (agreed && into != eager.output) std::memcpy(eager.output, into, static_cast<size_t>(bytes));
  return agreed;
}

// Each rank's bytes, at `root` (elsewhere: nothing).
std::vector<std::vector<char>> SyncMesh::Gatherv(const std::vector<char>& data, int root) {
  std::vector<std::vector<char>> result;
  if (rank_ != root) {
    SendFramed(root, data);
    return result;
  }
  result.resize(size_);
  for (int r = 0; r < size_; ++r) result[r] = r == root ? data : RecvFramed(r);
  return result;
}

// `data` of `root` on every rank, its length included in the first message.
void SyncMesh::BroadcastBytes(std::vector<char>& data, int root) {
  if (rank_ != root) {
    RecvFramed(root, data);  // into `data`, keeping its capacity
    return;
  }
  for (int r = 0; r < size_; ++r) {
    if (r != root) SendFramed(r, data);
  }
}

}  // namespace horovod::gloo_backend
