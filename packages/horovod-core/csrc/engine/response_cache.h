// The response cache: negotiated single-tensor responses, kept identical on every rank of a process
// set, so that a step repeating the same tensors is settled by one bitwise AND of a bit vector
// instead of a round trip through the coordinator (spec core.md §7).
//
// Each entry occupies one bit position. Every rank applies the same operations in the same order
// (erase the invalidated bits in bit order, touch the executed hits in bit order, put the newly
// negotiated responses in response order), so bit positions and LRU order agree everywhere.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/message.h"

namespace horovod {

class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}

  enum class Lookup { MISS, HIT, INVALID };
  // HIT: `request` is the operation this rank put in the cache under its name. INVALID: the name
  // is cached with different parameters (or without this rank's request). `*bit` is set for HIT
  // and INVALID.
  Lookup Find(const Request& request, uint32_t* bit) const;

  // Caches `response` (one tensor), with this rank's own request when it submitted one. When the
  // cache is full the least recently used entry's bit is reused.
  void Put(const Response& response, const std::optional<Request>& own_request);
  void Touch(uint32_t bit);
  void Erase(uint32_t bit);

  const Response& response(uint32_t bit) const { return entries_[bit].response; }
  bool occupied(uint32_t bit) const { return bit < entries_.size() && entries_[bit].occupied; }
  size_t capacity() const { return capacity_; }
  // Number of bit positions in use so far (<= capacity): the length of the bit vectors.
  size_t num_bits() const { return entries_.size(); }
  size_t num_entries() const { return by_name_.size(); }


 private:
  struct Entry {
    bool occupied = false;
    Response response;
    std::optional<Request> own_request;
    std::list<uint32_t>::iterator lru_position;
  };
  size_t capacity_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::list<uint32_t> lru_;          // most recently used first
  std::vector<uint32_t> free_bits_;  // erased positions, reused lowest first
};

}  // namespace horovod
