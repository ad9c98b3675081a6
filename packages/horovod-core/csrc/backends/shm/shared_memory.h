// The shared-memory transport: collectives between ranks on one host through a POSIX shared
// memory segment, instead of loopback TCP (Gloo) or the MPI library.
//
// SharedMemoryBackend wraps the communicator the job was started with (its "inner" communicator),
// as a ForwardingCommunicator, and takes over the operations of the hot path: the response cache's
// bitwise AND, the coordinator's gather and broadcast, allreduce, allgather, broadcast and
// barrier. Everything else (alltoall, reducescatter, point-to-point for Adasum, creating the
// communicators of other process sets) is forwarded to the inner communicator, which also stays
// the job's identity (its name, its topology, its timeline activities).
//
// Large allreduces, where the kernel allows it, move data directly between the ranks' buffers
// with process_vm_readv and process_vm_writev (cross-memory attach, as MPI libraries do on one
// host): each rank reduces its share of the elements from every rank's buffer into its own, and
// writes the result into the others', moving each byte once instead of through the segment. A fused group of tensors takes the same
// path (AllreducePieces): the peers read each tensor where it lies, so the engine's fusion buffer
// and its copies in and out are not needed. Whether peers may read and write each other's memory
// (same user, no seccomp or Yama restriction) is probed when the segment is created; without it,
// and with `single_copy` false, large allreduces go through the segment like everything else.
//
// Every operation is a sequence of steps of the form "write into my slot, signal, wait until
// every rank has signalled, read the others' slots". Each rank owns a 64-bit step counter in its
// own cache line; signalling is one release store, and waiting spins briefly on the peers'
// counters and then sleeps on a shared futex, so a rank waiting for a slow peer uses no CPU and
// wakes as soon as the peer signals. Each operation alternates between two halves of the segment,
// so a rank writing the next operation's data never overwrites data a slower peer still reads.
// Reductions are identical on every rank: each element is reduced by one rank, in rank order.
//
// A wait that lasts longer than the backend's timeout, or whose peer process has exited, throws,
// naming the rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/communicator.h"

namespace horovod {

// Collective over `inner`: creates the segment (on inner's rank 0, named after `job_key`) and
// attaches every rank. `pids[r]` is the process id of rank r; every rank must be on this host.
// Returns nullptr on every rank, with the reason in *why, when any rank failed to attach (no
// /dev/shm, not enough space): the caller then keeps using `inner`. *single_copy: whether to try
// cross-memory attach for large allreduces; on return, whether every rank can use it.
std::unique_ptr<Communicator> MakeSharedMemoryBackend(std::unique_ptr<Communicator>& inner,
                                                      const std::vector<int64_t>& pids, const BackendOptions& options,
                                                      bool* single_copy, std::string* why);

}  // namespace horovod
