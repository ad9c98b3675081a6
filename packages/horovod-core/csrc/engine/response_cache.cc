#include "response_cache.h"

#include <algorithm>

namespace horovod {

ResponseCache::Lookup ResponseCache::Find(const Request& request, uint32_t* bit) const {
  auto it = by_name_.find(request.name);
  if (it == by_name_.end()) return Lookup::MISS;
  *bit = it->second;
  const Entry& entry = entries_[it->second];
  if (entry.own_request && SameOperation(*entry.own_request, request)) return Lookup::HIT;
  return Lookup::INVALID;
}

void ResponseCache::Put(const Response& response, const std::optional<Request>& own_request) {
  if (capacity_ == 0) return;
  const std::string& name = response.names[0];
  auto existing = by_name_.find(name);
  if (existing != by_name_.end()) Erase(existing->second);
  uint32_t bit;
  if (!free_bits_.empty()) {
    auto lowest = std::min_element(free_bits_.begin(), free_bits_.end());
    bit = *lowest;
    free_bits_.erase(lowest);
  } else if (entries_.size() < capacity_) {
    bit = static_cast<uint32_t>(entries_.size());
    entries_.emplace_back();
  } else {
    bit = lru_.back();
    Erase(bit);
    free_bits_.erase(std::find(free_bits_.begin(), free_bits_.end(), bit));
  }
  Entry& entry = entries_[bit];
  entry.occupied = true;
  entry.response = response;
  entry.own_request = own_request;
  lru_.push_front(bit);
  entry.lru_position = lru_.begin();
  by_name_[name] = bit;
}

void ResponseCache::Touch(uint32_t bit) {
  Entry& entry = entries_[bit];
  lru_.erase(entry.lru_position);
  lru_.push_front(bit);
  entry.lru_position = lru_.begin();
}

void ResponseCache::Erase(uint32_t bit) {
  Entry& entry = entries_[bit];
  if (!entry.occupied) return;
  by_name_.erase(entry.response.names[0]);
  lru_.erase(entry.lru_position);
  entry = Entry();
  free_bits_.push_back(bit);
}

}  // namespace horovod
