#include "message.h"

#include <cstring>
#include <type_traits>

namespace horovod {

namespace {

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void Put(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  template <typename T>
  void Put(const std::vector<T>& v) {
    Put<uint64_t>(v.size());
    for (const T& item : v) Put(item);
  }
  std::vector<char> Take() { return std::move(bytes_); }

 private:
  std::vector<char> bytes_;
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& bytes) : bytes_(bytes) {}
  template <typename T>
  T Get() {
    static_assert(std::is_trivially_copyable_v<T>);
    Need(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string GetString() {
    auto n = Get<uint64_t>();
    Need(n);
    std::string s(bytes_.data() + pos_, n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> GetVector() {
    auto n = Get<uint64_t>();
    std::vector<T> v;
    v.reserve(n);
    for (uint64_t i = 0; i < n; ++i) v.push_back(Get<T>());
    return v;
  }
  std::vector<std::string> GetStrings() {
    auto n = Get<uint64_t>();
    std::vector<std::string> v;
    v.reserve(n);
    for (uint64_t i = 0; i < n; ++i) v.push_back(GetString());
    return v;
  }

 private:
  void Need(size_t n) {
    if (pos_ + n > bytes_.size()) throw std::runtime_error("truncated control message");
  }
  const std::vector<char>& bytes_;
  size_t pos_ = 0;
};

}  // namespace

bool SameOperation(const Request& a, const Request& b) {
  return a.type == b.type && a.dtype == b.dtype && a.name == b.name && a.shape == b.shape &&
         a.root_rank == b.root_rank && a.reduce_op == b.reduce_op && a.prescale_factor == b.prescale_factor &&
         a.postscale_factor == b.postscale_factor && a.device == b.device && a.group_id == b.group_id &&
         a.splits == b.splits;
}

std::vector<char> Serialize(const RequestList& list) {
  Writer w;
  w.Put<uint8_t>(list.shutdown);
  w.Put<uint64_t>(list.requests.size());
  for (const Request& r : list.requests) {
    w.Put(r.type);
    w.Put(r.dtype);
    w.Put(r.name);
    w.Put(r.shape);
    w.Put(r.root_rank);
    w.Put(r.reduce_op);
    w.Put(r.prescale_factor);
    w.Put(r.postscale_factor);
    w.Put(r.device);
    w.Put(r.group_id);
    w.Put(r.splits);
  }
  w.Put(list.shutdown_reason);
  w.Put<uint8_t>(list.waiting);
  return w.Take();
}

RequestList DeserializeRequestList(const std::vector<char>& bytes) {
  Reader r(bytes);
  RequestList list;
  list.shutdown = r.Get<uint8_t>() != 0;
  auto n = r.Get<uint64_t>();
  list.requests.resize(n);
  for (Request& q : list.requests) {
    q.type = r.Get<OpType>();
    q.dtype = r.Get<DataType>();
    q.name = r.GetString();
    q.shape = r.GetVector<int64_t>();
    q.root_rank = r.Get<int32_t>();
    q.reduce_op = r.Get<ReduceOp>();
    q.prescale_factor = r.Get<double>();
    q.postscale_factor = r.Get<double>();
    q.device = r.Get<int32_t>();
    q.group_id = r.Get<int64_t>();
    q.splits = r.GetVector<int64_t>();
  }
  list.shutdown_reason = r.GetString();
  list.waiting = r.Get<uint8_t>() != 0;
  return list;
}

std::vector<char> Serialize(const ResponseList& list) {
  Writer w;
  w.Put<uint8_t>(list.shutdown);
  w.Put<uint64_t>(list.responses.size());
  for (const Response& r : list.responses) {
    w.Put(r.type);
    w.Put<uint64_t>(r.names.size());
    for (const auto& name : r.names) w.Put(name);
    w.Put(r.error_message);
    w.Put(r.dtype);
    w.Put(r.reduce_op);
    w.Put(r.prescale_factor);
    w.Put(r.postscale_factor);
    w.Put(r.root_rank);
    w.Put(r.device);
    w.Put(r.group_id);
    w.Put(r.tensor_sizes);
  }
  w.Put(list.shutdown_reason);
  w.Put<uint8_t>(list.any_joined);
  w.Put<uint8_t>(list.parameters.has_value());
  if (list.parameters) {
    const TunedParameters& p = *list.parameters;
    w.Put(p.fusion_threshold_bytes);
    w.Put(p.cycle_time_ms);
    w.Put<uint8_t>(p.cache_enabled);
    w.Put<uint8_t>(p.hierarchical_allreduce);
    w.Put<uint8_t>(p.hierarchical_allgather);
    w.Put<uint8_t>(p.torus_allreduce);
    w.Put<uint8_t>(p.tuning);
  }
  return w.Take();
}

ResponseList DeserializeResponseList(const std::vector<char>& bytes) {
  Reader r(bytes);
  ResponseList list;
  list.shutdown = r.Get<uint8_t>() != 0;
  auto n = r.Get<uint64_t>();
  list.responses.resize(n);
  for (Response& p : list.responses) {
    p.type = r.Get<OpType>();
    p.names = r.GetStrings();
    p.error_message = r.GetString();
    p.dtype = r.Get<DataType>();
    p.reduce_op = r.Get<ReduceOp>();
    p.prescale_factor = r.Get<double>();
    p.postscale_factor = r.Get<double>();
    p.root_rank = r.Get<int32_t>();
    p.device = r.Get<int32_t>();
    p.group_id = r.Get<int64_t>();
    p.tensor_sizes = r.GetVector<int64_t>();
  }
  list.shutdown_reason = r.GetString();
  list.any_joined = r.Get<uint8_t>() != 0;
  if (r.Get<uint8_t>() != 0) {
    TunedParameters p;
    p.fusion_threshold_bytes = r.Get<int64_t>();
    p.cycle_time_ms = r.Get<double>();
    p.cache_enabled = r.Get<uint8_t>() != 0;
    p.hierarchical_allreduce = r.Get<uint8_t>() != 0;
    p.hierarchical_allgather = r.Get<uint8_t>() != 0;
    p.torus_allreduce = r.Get<uint8_t>() != 0;
    p.tuning = r.Get<uint8_t>() != 0;
    list.parameters = p;
  }
  return list;
}

}  // namespace horovod
