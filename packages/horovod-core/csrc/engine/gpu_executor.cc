// Execution of negotiated operations on GPU tensors, through the NCCL plugin (backends/nccl/gpu_ops.h). The
// negotiation, fusion and response cache are the CPU path's (engine.cc); only the data movement
// differs: the fusion buffer is device memory, copies in and out are one batched kernel launch,
// scaling is a kernel, and the collective is NCCL's, all on Horovod's stream of the device.
#include <algorithm>
#include <set>

#include "engine.h"

namespace horovod {

namespace {

// With batched copies (HOROVOD_BATCH_D2D_MEMCOPIES, default on) offsets of fused tensors in the
// device fusion buffer are rounded up to 16 bytes, so that the copy kernel moves 16 bytes per
// load (spec core.md §7); without, tensors lie back to back and each is one cudaMemcpyAsync.
constexpr size_t kGpuAlignment = 16;

}  // namespace

Communicator& Engine::GpuCommunicator(ProcessSet& set, int device) {
  if (set.gpu_communicator) {
    if (set.gpu_device != device) {
      throw GpuError("process set " + std::to_string(set.id) + " runs its GPU operations on device " +
                     std::to_string(set.gpu_device) + " of this rank, but a tensor is on device " +
                     std::to_string(device) + "; Horovod uses one GPU per process (pin it with "
                     "torch.cuda.set_device(hvd.local_rank()))");
    }
    return *set.gpu_communicator;
  }
  // Bootstrap through the control plane: the set's rank 0 makes the NCCL id and broadcasts it.
  std::vector<char> id;
  if (set.set_rank == 0) id = gpu_->UniqueId();
  set.backend->BroadcastBytes(id, 0);
  set.gpu_communicator = gpu_->CreateCommunicator(id, set.set_rank, static_cast<int>(set.ranks.size()), device);
  set.gpu_device = device;
  return *set.gpu_communicator;
}

void Engine::PerformGpu(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries,
                        std::vector<std::vector<std::shared_ptr<OutputBuffer>>>& outputs) {
  try {
    if (gpu_ == nullptr) {
      std::string why;
      gpu_ = LoadGpuOps(&why);
      if (gpu_ == nullptr) throw GpuError(why);
    }
    GpuOps& gpu = *gpu_;
    const bool batched = config_.batch_d2d_memcopies;
    auto align_up = [batched](size_t bytes) {
      return batched ? (bytes + kGpuAlignment - 1) / kGpuAlignment * kGpuAlignment : bytes;
    };
    auto copy = [&gpu, batched](int on, const std::vector<GpuCopy>& copies) {
      if (batched) {
        gpu.BatchedCopy(on, copies);
      } else {
        gpu.Copy(on, copies);
      }
    };
    // This rank's device: its tensors', or (a joined rank without tensors) its communicator's.
    int device = -1;
    for (auto* e : entries) {
      if (e == nullptr) continue;
      if (device >= 0 && e->input.device != device) {
        throw GpuError("tensors of one fused operation are on GPUs " + std::to_string(device) + " and " +
                       std::to_string(e->input.device) + " of this rank; Horovod uses one GPU per process");
      }
      device = e->input.device;
    }
    if (device < 0) {
      if (!set.gpu_communicator) throw GpuError("a joined rank has no GPU to contribute zeros from");
      device = set.gpu_device;
    }
    Communicator& comm = GpuCommunicator(set, device);
    for (auto* e : entries) {
      if (e != nullptr) gpu.WaitEvent(device, e->ready_event);
    }
    const int size = static_cast<int>(set.ranks.size());
    const int me = set.set_rank;
    const bool record = timeline_.recording();
    auto activity = [&](const char* name) {
      if (!record) return;
      for (const auto& n : response.names) {
        timeline_.ActivityEnd(n);
        timeline_.ActivityStart(n, name);
      }
    };
    if (record) {
      for (const auto& n : response.names) timeline_.ActivityStart(n, "WAIT_FOR_DATA");
    }

    switch (response.type) {
      case ResponseType::ALLREDUCE: {
        const DataType dtype = response.dtype;
        const size_t element = DataTypeSize(dtype);
        double postscale = response.postscale_factor;
        ReduceOp op = response.reduce_op;
        if (op == ReduceOp::AVERAGE) {
          postscale /= size;
          op = ReduceOp::SUM;
        }
        const bool direct = entries.size() == 1 && entries[0] != nullptr;
        void* buffer;
        int64_t count = 0;
        if (direct) {
          TensorTableEntry& e = *entries[0];
          count = e.input.num_elements();
          if (e.output.data != e.input.data) copy(device, {{e.input.data, e.output.data, e.input.num_bytes()}});
          buffer = e.output.data;
        } else {
          activity("MEMCPY_IN_FUSION_BUFFER");
          size_t total = 0;
          for (int64_t n : response.tensor_sizes) total += align_up(static_cast<size_t>(n) * element);
          buffer = gpu.FusionBuffer(device, std::max<size_t>(total, kGpuAlignment));
          std::vector<GpuCopy> copies;
          size_t offset = 0;
          for (size_t i = 0; i < entries.size(); ++i) {
            const size_t bytes = static_cast<size_t>(response.tensor_sizes[i]) * element;
            char* slot = static_cast<char*>(buffer) + offset;
            if (entries[i]) {
              copies.push_back({entries[i]->input.data, slot, bytes});
            } else {
              gpu.Zero(device, slot, bytes);
            }
            offset += align_up(bytes);
          }
          copy(device, copies);
          count = static_cast<int64_t>(total / element);
        }
        if (response.prescale_factor != 1.0) gpu.Scale(device, buffer, count, dtype, response.prescale_factor);
        activity("NCCL_ALLREDUCE");
        comm.Allreduce({buffer, count, dtype, op});
        if (postscale != 1.0) gpu.Scale(device, buffer, count, dtype, postscale);
        if (!direct) {
          activity("MEMCPY_OUT_FUSION_BUFFER");
          std::vector<GpuCopy> copies;
          size_t offset = 0;
          for (size_t i = 0; i < entries.size(); ++i) {
            const size_t bytes = static_cast<size_t>(response.tensor_sizes[i]) * element;
            if (entries[i]) copies.push_back({static_cast<char*>(buffer) + offset, entries[i]->output.data, bytes});
            offset += align_up(bytes);
          }
          copy(device, copies);
        }
        break;
      }
      case ResponseType::ALLGATHER: {
        activity("NCCL_ALLGATHER");
        for (size_t t = 0; t < entries.size(); ++t) {
          TensorTableEntry& e = *entries[t];
          const AllgatherLayout layout = MakeAllgatherLayout(response, t, e.input, size);
          auto output = std::make_shared<OutputBuffer>(e.input.dtype, layout.shape, device,
                                                       gpu.Allocate(device, static_cast<size_t>(layout.bytes)));
          comm.Allgather({e.input.data, output->data(), layout.bytes_per_rank});
          outputs[t].push_back(std::move(output));
        }
        break;
      }
      case ResponseType::BROADCAST: {
        activity("NCCL_BCAST");
        auto root_it = std::lower_bound(set.ranks.begin(), set.ranks.end(), response.root_rank);
        const int root = static_cast<int>(root_it - set.ranks.begin());
        for (auto* e : entries) {
          if (e->output.data != e->input.data && me == root) {
            copy(device, {{e->input.data, e->output.data, e->input.num_bytes()}});
          }
          comm.Broadcast({e->output.data, static_cast<int64_t>(e->output.num_bytes()), root});
        }
        break;
      }
      case ResponseType::ALLTOALL: {
        activity("NCCL_ALLTOALL");
        TensorTableEntry& e = *entries[0];
        // The received splits stay on the host, as the CPU path returns them.
        AlltoallLayout layout = MakeAlltoallLayout(response, e.input, size, me);
        auto output = std::make_shared<OutputBuffer>(e.input.dtype, layout.shape, device,
                                                     gpu.Allocate(device, static_cast<size_t>(layout.bytes)));
        comm.Alltoall({e.input.data, layout.send_bytes, output->data(), layout.recv_bytes});
        outputs[0].push_back(std::move(output));
        outputs[0].push_back(std::move(layout.received_splits));
        break;
      }
      case ResponseType::REDUCESCATTER: {
        double postscale = response.postscale_factor;
        ReduceOp op = response.reduce_op;
        if (op == ReduceOp::AVERAGE) {
          postscale /= size;
          op = ReduceOp::SUM;
        }
        for (size_t t = 0; t < entries.size(); ++t) {
          TensorTableEntry& e = *entries[t];
          const DataType dtype = e.input.dtype;
          const size_t element = DataTypeSize(dtype);
          const ReducescatterLayout layout = MakeReducescatterLayout(e.input, size, me);
          const std::vector<int64_t>& counts = layout.counts;
          const int64_t count = e.input.num_elements();
          activity("MEMCPY_IN_FUSION_BUFFER");
          void* buffer = gpu.FusionBuffer(device, std::max<size_t>(static_cast<size_t>(count) * element, kGpuAlignment));
          copy(device, {{e.input.data, buffer, static_cast<size_t>(count) * element}});
          if (response.prescale_factor != 1.0) gpu.Scale(device, buffer, count, dtype, response.prescale_factor);
          activity("NCCL_REDUCESCATTER");
          comm.Reducescatter({buffer, count, counts, dtype, op});
          char* mine = static_cast<char*>(buffer) + layout.offset * element;
          if (postscale != 1.0) gpu.Scale(device, mine, counts[me], dtype, postscale);
          const size_t out_bytes = static_cast<size_t>(counts[me]) * element;
          auto output = std::make_shared<OutputBuffer>(dtype, layout.shape, device, gpu.Allocate(device, out_bytes));
          activity("MEMCPY_OUT_FUSION_BUFFER");
          copy(device, {{mine, output->data(), out_bytes}});
          outputs[t].push_back(std::move(output));
        }
        break;
      }
      default:
        throw std::logic_error(std::string(ResponseTypeName(response.type)) + " is not supported on GPU tensors");
    }
    // The framework's streams wait (on the GPU) for Horovod's; this thread waits (on the CPU) too,
    // so that a failed kernel or collective fails the handle and the handle's completion means
    // the results are in place.
    std::set<intptr_t> streams;
    for (auto* e : entries) {
      if (e != nullptr) streams.insert(e->stream);
    }
    for (intptr_t stream : streams) gpu.SignalStream(device, stream);
    gpu.Synchronize(device);
    if (record) {
      for (const auto& n : response.names) timeline_.ActivityEnd(n);
    }
  } catch (const GpuError&) {
    throw;
  } catch (const std::logic_error&) {
    throw;
  } catch (const std::exception& e) {
    throw GpuError(e.what());
  }
}

}  // namespace horovod
