// The MPI backend, built as a plugin (horovod/common/_mpi_backend.so) that the engine loads only
// when MPI is asked for, so that the core itself never depends on an MPI library being installed.
//
// Collectives map one to one onto MPI's (float16/bfloat16 sums through a user-defined MPI_Op that
// combines in float32); the control plane is MPI_Gatherv / MPI_Bcast; process sets are
// MPI_Comm_split of the parent communicator. Every call happens on the engine's background thread.
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/communicator.h"
#include "common/reduction.h"

namespace horovod {
namespace {

bool g_initialized_here = false;
int g_thread_level = MPI_THREAD_SINGLE;

// An MPI handle from its integer value (mpi4py's comm.handle): a pointer in Open MPI, an int in MPICH.
template <typename Handle>
Handle HandleFromInteger(intptr_t value) {
  if constexpr (std::is_pointer_v<Handle>) {
    return reinterpret_cast<Handle>(value);
  } else {
    return static_cast<Handle>(value);
  }
}

void Check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string(what) + " failed: " + std::string(text, length));
}

// Waits for a non-blocking control-plane operation, testing it in a loop that sleeps after the
// first spins. Open MPI's blocking calls busy-wait, and the negotiation round of every cycle is
// where a rank waits for the others: spinning there takes a core from the training threads when
// ranks share cores (measured: 12% of a 2-rank job's throughput on 2 cores).
// It spins for the first 100 us (a peer that is about to arrive costs no sleep granularity), then
// sleeps 50 us between tests.
void Wait(MPI_Request* request, const char* what) {
  int done = 0;
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
  while (true) {
    Check(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    if (std::chrono::steady_clock::now() > spin_until) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// MPI datatypes and ops for the engine's; half types go through user ops on 16-bit units.
MPI_Op g_half_ops[2][6] = {};  // [float16, bfloat16][ReduceOp]

template <DataType D, ReduceOp O>
void HalfReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  Reduce(inout, inout, in, *len, D, O);
}

template <DataType D>
void CreateHalfOps(int index) {
  MPI_Op_create(&HalfReduce<D, ReduceOp::SUM>, 1, &g_half_ops[index][static_cast<int>(ReduceOp::SUM)]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::MIN>, 1, &g_half_ops[index][static_cast<int>(ReduceOp::MIN)]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::MAX>, 1, &g_half_ops[index][static_cast<int>(ReduceOp::MAX)]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::PRODUCT>, 1, &g_half_ops[index][static_cast<int>(ReduceOp::PRODUCT)]);
}

MPI_Datatype ToMpi(DataType dtype) {
  switch (dtype) {
    case DataType::UINT8: return MPI_UINT8_T;
    case DataType::INT8: return MPI_INT8_T;
    case DataType::UINT16: return MPI_UINT16_T;
    case DataType::INT16: return MPI_INT16_T;
    case DataType::INT32: return MPI_INT32_T;
    case DataType::INT64: return MPI_INT64_T;
    case DataType::FLOAT32: return MPI_FLOAT;
    case DataType::FLOAT64: return MPI_DOUBLE;
    case DataType::BOOL: return MPI_C_BOOL;
    case DataType::FLOAT16:
    case DataType::BFLOAT16: return MPI_UINT16_T;
  }
  throw std::logic_error("unknown dtype");
}

MPI_Op ToMpi(DataType dtype, ReduceOp op) {
  if (dtype == DataType::FLOAT16 || dtype == DataType::BFLOAT16) {
    return g_half_ops[dtype == DataType::FLOAT16 ? 0 : 1][static_cast<int>(op)];
  }
  if (dtype == DataType::BOOL) {
    return (op == ReduceOp::SUM || op == ReduceOp::MAX) ? MPI_LOR : MPI_LAND;
  }
  switch (op) {
    case ReduceOp::SUM: return MPI_SUM;
    case ReduceOp::MIN: return MPI_MIN;
    case ReduceOp::MAX: return MPI_MAX;
    case ReduceOp::PRODUCT: return MPI_PROD;
    default: throw std::logic_error("MPI backend: reduce op must be Sum, Min, Max or Product");
  }
}

std::vector<int> IntCounts(const std::vector<int64_t>& counts, std::vector<int>* displacements) {
  std::vector<int> out(counts.size());
  displacements->assign(counts.size(), 0);
  int64_t offset = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > INT32_MAX || offset > INT32_MAX) {
      throw std::runtime_error("MPI backend: message larger than 2 GiB");
    }
    out[i] = static_cast<int>(counts[i]);
    (*displacements)[i] = static_cast<int>(offset);
    offset += counts[i];
  }
  return out;
}

class MpiBackend : public Communicator {
 public:
  // Takes ownership of `comm` (a duplicate made for Horovod).
  MpiBackend(const BackendOptions& options, MPI_Comm comm) : Communicator(options.rank, options.size), comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  const char* name() const override { return "mpi"; }

  bool Topology(int* local_rank, int* local_size, int* cross_rank, int* cross_size) override {
    MPI_Comm local, cross;
    Check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
    MPI_Comm_rank(local, local_rank);
    MPI_Comm_size(local, local_size);
    Check(MPI_Comm_split(comm_, *local_rank, rank_, &cross), "MPI_Comm_split");
    MPI_Comm_rank(cross, cross_rank);
    MPI_Comm_size(cross, cross_size);
    MPI_Comm_free(&local);
    MPI_Comm_free(&cross);
    return true;
  }

  bool threads_supported() const override { return g_thread_level == MPI_THREAD_MULTIPLE; }
  bool any_thread() const override { return g_thread_level >= MPI_THREAD_SERIALIZED; }

  std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root) override {
    int mine = static_cast<int>(data.size());
    std::vector<int> sizes(rank_ == root ? size_ : 0);
    MPI_Request request;
    Check(MPI_Igather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, comm_, &request), "MPI_Igather");
    Wait(&request, "MPI_Igather");
    std::vector<std::vector<char>> result;
    std::vector<char> all;
    std::vector<int> displacements(size_, 0);
    if (rank_ == root) {
      int total = 0;
      for (int r = 0; r < size_; ++r) {
        displacements[r] = total;
        total += sizes[r];
      }
      all.resize(total);
    }
    Check(MPI_Igatherv(data.data(), mine, MPI_BYTE, all.data(), sizes.data(), displacements.data(), MPI_BYTE, root,
                       comm_, &request),
          "MPI_Igatherv");
    Wait(&request, "MPI_Igatherv");
    if (rank_ == root) {
      result.resize(size_);
      for (int r = 0; r < size_; ++r) {
        result[r].assign(all.begin() + displacements[r], all.begin() + displacements[r] + sizes[r]);
      }
    }
    return result;
  }

  void BroadcastBytes(std::vector<char>& data, int root) override {
    int64_t n = static_cast<int64_t>(data.size());
    MPI_Request request;
    Check(MPI_Ibcast(&n, 1, MPI_INT64_T, root, comm_, &request), "MPI_Ibcast");
    Wait(&request, "MPI_Ibcast");
    data.resize(n);
    if (n > 0 && size_ > 1) {
      Check(MPI_Ibcast(data.data(), static_cast<int>(n), MPI_BYTE, root, comm_, &request), "MPI_Ibcast");
      Wait(&request, "MPI_Ibcast");
    }
  }

  void AllreduceBitsAnd(std::vector<uint64_t>& words) override {
    if (size_ == 1 || words.empty()) return;
    MPI_Request request;
    Check(MPI_Iallreduce(MPI_IN_PLACE, words.data(), static_cast<int>(words.size()), MPI_UINT64_T, MPI_BAND, comm_,
                         &request),
          "MPI_Iallreduce");
    Wait(&request, "MPI_Iallreduce");
  }

  std::unique_ptr<Communicator> Split(const std::vector<int>& ranks, const BackendOptions& options) override {
    bool member = false;
    for (int r : ranks) member = member || r == rank_;
    MPI_Comm sub;
    Check(MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, rank_, &sub), "MPI_Comm_split");
    if (!member) return nullptr;
    return std::make_unique<MpiBackend>(options, sub);
  }

  void Allreduce(const AllreduceOptions& options) override {
    const int64_t count = options.count;
    if (size_ == 1 || count == 0) return;
    if (count > INT32_MAX) throw std::runtime_error("MPI backend: allreduce of more than 2^31 elements");
    Check(MPI_Allreduce(MPI_IN_PLACE, options.buffer, static_cast<int>(count), ToMpi(options.dtype),
                        ToMpi(options.dtype, options.op), comm_),
          "MPI_Allreduce");
  }

  void Allgather(const AllgatherOptions& options) override {
    std::vector<int> displacements;
    std::vector<int> counts = IntCounts(options.bytes_per_rank, &displacements);
    Check(MPI_Allgatherv(options.input, counts[rank_], MPI_BYTE, options.output, counts.data(), displacements.data(),
                         MPI_BYTE, comm_),
          "MPI_Allgatherv");
  }

  void Broadcast(const BroadcastOptions& options) override {
    const int64_t num_bytes = options.bytes;
    if (size_ == 1 || num_bytes == 0) return;
    if (num_bytes > INT32_MAX) throw std::runtime_error("MPI backend: broadcast larger than 2 GiB");
    Check(MPI_Bcast(options.buffer, static_cast<int>(num_bytes), MPI_BYTE, options.root, comm_), "MPI_Bcast");
  }

  void Alltoall(const AlltoallOptions& options) override {
    std::vector<int> send_displacements, recv_displacements;
    std::vector<int> send_counts = IntCounts(options.send_bytes, &send_displacements);
    std::vector<int> recv_counts = IntCounts(options.recv_bytes, &recv_displacements);
    Check(MPI_Alltoallv(options.input, send_counts.data(), send_displacements.data(), MPI_BYTE, options.output,
                        recv_counts.data(), recv_displacements.data(), MPI_BYTE, comm_),
          "MPI_Alltoallv");
  }

  void Reducescatter(const ReducescatterOptions& options) override {
    void* buffer = options.buffer;
    const std::vector<int64_t>& counts = options.counts;
    const DataType dtype = options.dtype;
    const ReduceOp op = options.op;
    if (size_ == 1 || options.count == 0) return;
    std::vector<int> displacements;
    std::vector<int> int_counts = IntCounts(counts, &displacements);
    const size_t element = DataTypeSize(dtype);
    std::vector<char> mine(static_cast<size_t>(counts[rank_]) * element + 1);
    Check(MPI_Reduce_scatter(buffer, mine.data(), int_counts.data(), ToMpi(dtype), ToMpi(dtype, op), comm_),
          "MPI_Reduce_scatter");
    std::memcpy(static_cast<char*>(buffer) + static_cast<size_t>(displacements[rank_]) * element, mine.data(),
                static_cast<size_t>(counts[rank_]) * element);
  }

  void Barrier() override { Check(MPI_Barrier(comm_), "MPI_Barrier"); }

  void SendRecv(const SendRecvOptions& options) override {
    Check(MPI_Sendrecv(options.send, static_cast<int>(options.send_bytes), MPI_BYTE, options.peer, 0x68, options.recv,
                       static_cast<int>(options.recv_bytes), MPI_BYTE, options.peer, 0x68, comm_, MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
  }

 private:
  MPI_Comm comm_;
};

}  // namespace
}  // namespace horovod

// The plugin's C entry points, looked up by the engine with dlsym.
extern "C" {

// Initialises MPI if nobody has (MPI_THREAD_MULTIPLE unless options->mpi.threads_disable), and
// creates the backend over a duplicate of the communicator: `options->mpi.comm` when non-zero (an
// mpi4py handle), the group of `options->mpi.ranks` of MPI_COMM_WORLD when given, else
// MPI_COMM_WORLD. Returns nullptr and sets *error on failure.
__attribute__((visibility("default"))) horovod::Communicator* horovod_mpi_create_backend(
    const horovod::BackendOptions* options, std::string* error) {
  using namespace horovod;
  try {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int required = options->mpi.threads_disable ? MPI_THREAD_SINGLE : MPI_THREAD_MULTIPLE;
      Check(MPI_Init_thread(nullptr, nullptr, required, &g_thread_level), "MPI_Init_thread");
      g_initialized_here = true;
    } else {
      MPI_Query_thread(&g_thread_level);
    }
    static bool half_ops_created = false;  // once per process; re-inits reuse them
    if (!half_ops_created) {
      CreateHalfOps<DataType::FLOAT16>(0);
      CreateHalfOps<DataType::BFLOAT16>(1);
      half_ops_created = true;
    }
    MPI_Comm parent = MPI_COMM_WORLD;
    if (options->mpi.comm != 0) parent = HandleFromInteger<MPI_Comm>(options->mpi.comm);
    MPI_Comm comm;
    if (!options->mpi.ranks.empty()) {
      MPI_Group world, group;
      MPI_Comm_group(MPI_COMM_WORLD, &world);
      Check(MPI_Group_incl(world, static_cast<int>(options->mpi.ranks.size()), options->mpi.ranks.data(), &group),
            "MPI_Group_incl");
      Check(MPI_Comm_create_group(MPI_COMM_WORLD, group, 0x68, &comm), "MPI_Comm_create_group");
      MPI_Group_free(&group);
      MPI_Group_free(&world);
    } else {
      Check(MPI_Comm_dup(parent, &comm), "MPI_Comm_dup");
    }
    return new MpiBackend(*options, comm);
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}

// Finalizes MPI at process exit when the plugin initialised it.
__attribute__((visibility("default"))) void horovod_mpi_finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (horovod::g_initialized_here && !finalized) MPI_Finalize();
}

}  // extern "C"
