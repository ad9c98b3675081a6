#include "backends/hierarchical/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "backends/shm/shared_memory.h"
#include "common/logging.h"

namespace horovod {

namespace {

// Element counts of the L shards of `count` elements: the first count % L shards get one more.
std::vector<int64_t> ShardCounts(int64_t count, int parts) {
  std::vector<int64_t> counts(parts, count / parts);
  for (int p = 0; p < count % parts; ++p) ++counts[p];
  return counts;
}

}  // namespace

HostLayout GroupByHost(const std::vector<std::string>& host_of_rank, int rank) {
  HostLayout layout;
  std::map<std::string, int> index;
  for (int r = 0; r < static_cast<int>(host_of_rank.size()); ++r) {
    auto [it, added] = index.emplace(host_of_rank[r], static_cast<int>(layout.hosts.size()));
    if (added) layout.hosts.emplace_back();
    layout.hosts[it->second].push_back(r);  // ranks arrive in increasing order: each list stays sorted
    if (r == rank) {
      layout.host = it->second;
      layout.local_rank = static_cast<int>(layout.hosts[it->second].size()) - 1;
    }
  }
  for (const auto& ranks : layout.hosts) layout.homogeneous = layout.homogeneous && ranks.size() == layout.hosts[0].size();
  return layout;
}

HierarchicalBackend::HierarchicalBackend(std::unique_ptr<Communicator> global, const HostLayout& layout,
                                         const std::vector<int64_t>& pids, const BackendOptions& options,
                                         bool shared_memory, bool single_copy,
                                         std::shared_ptr<HierarchicalState> state)
    : ForwardingCommunicator(std::move(global)), layout_(layout), state_(std::move(state)) {
  local_size_ = static_cast<int>(layout_.hosts[0].size());
  const int num_hosts = static_cast<int>(layout_.hosts.size());
  cross_groups_.assign(local_size_, {});
  for (int l = 0; l < local_size_; ++l) {
    for (int h = 0; h < num_hosts; ++h) cross_groups_[l].push_back(layout_.hosts[h][l]);
    // Communicators count their members in increasing global rank order.
    std::sort(cross_groups_[l].begin(), cross_groups_[l].end());
  }
  // Split is collective over the global communicator for some backends (MPI): every rank creates
  // every group, in the same order, and keeps its own. Gloo only rendezvouses the members.
  if (local_size_ > 1) {
    for (int h = 0; h < num_hosts; ++h) {
      BackendOptions child = options;
      child.key_prefix = options.key_prefix + "hier.local" + std::to_string(h) + ".";
      std::unique_ptr<Communicator> comm = inner().Split(layout_.hosts[h], child);
      if (h == layout_.host) local_ = std::move(comm);
    }
    for (int l = 0; l < local_size_; ++l) {
      BackendOptions child = options;
      child.key_prefix = options.key_prefix + "hier.cross" + std::to_string(l) + ".";
      std::unique_ptr<Communicator> comm = inner().Split(cross_groups_[l], child);
      if (l == layout_.local_rank) cross_owned_ = std::move(comm);
    }
    if (!local_ || !cross_owned_) throw std::logic_error("hierarchical: this rank is missing from its own groups");
    cross_ = cross_owned_.get();
    if (shared_memory) {
      std::vector<int64_t> local_pids;
      for (int r : layout_.hosts[layout_.host]) local_pids.push_back(pids[r]);
      std::string why;
      std::unique_ptr<Communicator> shared = MakeSharedMemoryBackend(local_, local_pids, options, &single_copy, &why);
      if (shared) {
        local_ = std::move(shared);
        state_->local_shared_memory = true;
      } else {
        HVD_LOG(WARNING) << "Horovod could not set up shared memory between the ranks of this host (" << why
                         << "); the hierarchical collectives' steps within the host go through " << inner().name()
                         << " instead.";
      }
    }
  } else {
    // One rank per host: the cross communicator of local rank 0 is every rank.
    cross_ = &inner();
  }
}

std::string HierarchicalBackend::Activity(const char* op) const {
  const std::string name(op);
  if (name == "ALLREDUCE" && state_->allreduce.load(std::memory_order_relaxed)) return "HIERARCHICAL_ALLREDUCE";
  if (name == "ALLGATHER" && state_->allgather.load(std::memory_order_relaxed)) return "HIERARCHICAL_ALLGATHER";
  return global().Activity(op);
}

namespace {

int64_t ShardOffset(const std::vector<int64_t>& counts, int shard) {
  int64_t offset = 0;
  for (int s = 0; s < shard; ++s) offset += counts[s];
  return offset;
}

}  // namespace

void HierarchicalBackend::ReduceWithinHost(void* buffer, int64_t count, const std::vector<int64_t>& counts,
                                           DataType dtype, ReduceOp op) {
  // The shared-memory transport has no reduce-scatter of its own (it would fall back to its inner
  // backend's, over loopback TCP), and its allreduce already splits the reduction among the ranks:
  // use that. Other backends reduce-scatter.
  if (state_->local_shared_memory) {
    local_->Allreduce({buffer, count, dtype, op});
  } else {
    local_->Reducescatter({buffer, count, counts, dtype, op});
  }
}

void HierarchicalBackend::GatherWithinHost(void* buffer, const std::vector<int64_t>& counts, size_t element) {
  // shard_ is apart from `buffer`, so that the gather's input never overlaps its output.
  std::vector<int64_t> bytes(counts.size());
  for (size_t l = 0; l < counts.size(); ++l) bytes[l] = counts[l] * static_cast<int64_t>(element);
  local_->Allgather({shard_.data(), buffer, std::move(bytes)});
}

void HierarchicalBackend::Allreduce(const AllreduceOptions& options) {
  void* buffer = options.buffer;
  const int64_t count = options.count;
  const DataType dtype = options.dtype;
  const ReduceOp op = options.op;
  if (!state_->allreduce.load(std::memory_order_relaxed) || count == 0) {
    global().Allreduce(options);
    return;
  }
  state_->allreduces.fetch_add(1, std::memory_order_relaxed);
  if (!local_) {
    cross_->Allreduce(options);
    return;
  }
  const size_t element = DataTypeSize(dtype);
  const std::vector<int64_t> counts = ShardCounts(count, local_size_);
  const int me = layout_.local_rank;
  char* shard = static_cast<char*>(buffer) + static_cast<size_t>(ShardOffset(counts, me)) * element;
  // 1. Within the host.
  ReduceWithinHost(buffer, count, counts, dtype, op);
  // 2. Across hosts, shard by shard in parallel (each rank's cross communicator holds one rank
  //    per host, all with the same shard).
  cross_->Allreduce({shard, counts[me], dtype, op});
  // 3. Within the host again: everyone gets every shard.
  shard_.assign(shard, shard + static_cast<size_t>(counts[me]) * element);
  GatherWithinHost(buffer, counts, element);
}

bool HierarchicalBackend::AllreduceBfloat16InFloat32(uint16_t* buffer, int64_t count, ReduceOp op, float prescale,
                                                     float postscale) {
  if (!state_->allreduce.load(std::memory_order_relaxed) || count == 0 || !local_) {
    return global().AllreduceBfloat16InFloat32(buffer, count, op, prescale, postscale);
  }
  state_->allreduces.fetch_add(1, std::memory_order_relaxed);
  float* wide = wide_.Widen(buffer, count, prescale);
  const std::vector<int64_t> counts = ShardCounts(count, local_size_);
  const int me = layout_.local_rank;
  // 1. Within the host, in float32.
  ReduceWithinHost(wide, count, counts, DataType::FLOAT32, op);
  // 2. Across hosts: the shard reduce-scattered in float32, this rank's block of it rounded once,
  //    the rounded blocks allgathered in bfloat16 into shard_, the input of step 3.
  float* shard = wide + ShardOffset(counts, me);
  const std::vector<int64_t> blocks = ShardCounts(counts[me], cross_->size());
  cross_->Reducescatter({shard, counts[me], blocks, DataType::FLOAT32, op});
  std::vector<uint16_t> mine(blocks[cross_->rank()]);
  NarrowToBfloat16(shard + ShardOffset(blocks, cross_->rank()), static_cast<int64_t>(mine.size()), postscale,
                   mine.data());
  std::vector<int64_t> block_bytes(blocks.size());
  for (size_t c = 0; c < blocks.size(); ++c) block_bytes[c] = blocks[c] * static_cast<int64_t>(sizeof(uint16_t));
  shard_.resize(static_cast<size_t>(counts[me]) * sizeof(uint16_t));
  cross_->Allgather({mine.data(), shard_.data(), std::move(block_bytes)});
  // 3. Within the host: every shard, in bfloat16.
  GatherWithinHost(buffer, counts, sizeof(uint16_t));
  return true;
}

void HierarchicalBackend::Allgather(const AllgatherOptions& options) {
  const void* input = options.input;
  const std::vector<int64_t>& bytes_per_rank = options.bytes_per_rank;
  if (!state_->allgather.load(std::memory_order_relaxed)) {
    global().Allgather(options);
    return;
  }
  state_->allgathers.fetch_add(1, std::memory_order_relaxed);
  // Where each global rank's block goes in the output.
  std::vector<int64_t> displacement(bytes_per_rank.size() + 1, 0);
  for (size_t r = 0; r < bytes_per_rank.size(); ++r) displacement[r + 1] = displacement[r] + bytes_per_rank[r];
  if (displacement.back() == 0) return;
  const int me = layout_.local_rank;
  // blocks_ holds, for each local rank l, the blocks of the members of cross group l in that
  // group's order.
  std::vector<int64_t> group_bytes(local_size_, 0);
  for (int l = 0; l < local_size_; ++l) {
    for (int r : cross_groups_[l]) group_bytes[l] += bytes_per_rank[r];
  }
  std::vector<int64_t> group_offset(local_size_ + 1, 0);
  for (int l = 0; l < local_size_; ++l) group_offset[l + 1] = group_offset[l] + group_bytes[l];
  blocks_.resize(static_cast<size_t>(group_offset.back()) + 1);
  // 1. Across hosts: this rank's block to (and from) the ranks with the same local rank.
  std::vector<int64_t> cross_bytes;
  for (int r : cross_groups_[me]) cross_bytes.push_back(bytes_per_rank[r]);
  if (!local_) {
    cross_->Allgather({input, blocks_.data(), std::move(cross_bytes)});
  } else {
    // The gathered group goes to a separate buffer first: step 2's input must not overlap its
    // output.
    group_.resize(static_cast<size_t>(group_bytes[me]) + 1);
    cross_->Allgather({input, group_.data(), std::move(cross_bytes)});
    // 2. Within the host: every local rank's group.
    local_->Allgather({group_.data(), blocks_.data(), group_bytes});
  }
  // 3. Global rank order.
  char* out = static_cast<char*>(options.output);
  for (int l = 0; l < local_size_; ++l) {
    int64_t cursor = group_offset[l];
    for (int r : cross_groups_[l]) {
      if (bytes_per_rank[r] > 0) std::memcpy(out + displacement[r], blocks_.data() + cursor, bytes_per_rank[r]);
      cursor += bytes_per_rank[r];
    }
  }
}

}  // namespace horovod
