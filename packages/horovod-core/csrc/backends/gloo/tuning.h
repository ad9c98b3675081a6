// The Gloo backend's message sizes and crossovers, with the measurements that chose them. The
// transport (sync_mesh.*, shm_channel.*) and the algorithms (allreduce_*.*) read them from here.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace horovod::gloo_backend {

// Slot prefix of SendRecv's point-to-point messages (Adasum).
constexpr uint8_t kPeerSlotPrefix = 0x69;

// The largest message the synchronous mesh sends in one piece (the ring's, broadcasts' and framed
// messages'). A rank may have two such messages unread by a peer (see SyncMesh): every socket's
// send buffer holds 320 KiB (kSendBufferBytes, doubled by Linux), and the peer's receive buffer
// (128 KiB at least) holds more, so neither writer blocks on the other. 512 KiB would not fit:
// writers could block on each other.
constexpr size_t kSyncChunkBytes = 128 << 10;
// The first message of every pair (SyncMesh::SizeSendBuffers): Gloo sizes the socket's send
// buffer to it, and no later message is larger than half of it.
constexpr size_t kSendBufferBytes = 160 << 10;
// Allreduces up to this many bytes take one step (every rank sends its data to every other);
// larger ones a reduce-scatter, then an allgather. Between two ranks one step goes up to
// kPairExchangeBytes: on the test bed's 2 hosts x 1 rank a 64 KiB allreduce took 31-34 us in one
// step against 39-41 us in two.
constexpr size_t kSyncExchangeBytes = 32 << 10;
constexpr size_t kPairExchangeBytes = 64 << 10;
static_assert(kSyncExchangeBytes <= kPairExchangeBytes && kPairExchangeBytes <= kSyncChunkBytes,
              "the one-step allreduce sends a single message");
// The message size of recursive halving and doubling, where both ranks of a pair send at once.
// Measured on the test bed at 2 hosts x 1 rank: 128 KiB pieces took half the time of 32 KiB ones
// for 256 KiB to 16 MiB (1 MiB: 266 us against 500 us; 4 MiB: 1.05 ms against 2.0 ms); 256 KiB
// pieces were 2 times slower again, with 320 KiB or 2 MiB send buffers. Before SizeSendBuffers,
// pieces over 32 KiB stalled for milliseconds.
constexpr size_t kExchangePieceBytes = 128 << 10;
// Between ranks of one host that read each other's memory: how much of a peer's data is read at
// a time to be reduced (kept in cache while it is), and the probe that shows a peer's memory is
// readable ("HVDCROSS" xor the rank).
constexpr int64_t kCrossPieceBytes = 256 << 10;
constexpr uint64_t kCrossProbe = 0x48564443524f5353ull;
constexpr int kSyncSlot = 0x6a;
// Messages of at least this many bytes go between the caller's memory and the socket without the
// staging copy: the sender writes from the caller's data, the receiver reads into the caller's
// output (or, to reduce it, into a buffer of its own), through a Gloo buffer of slot kDirectSlot
// that lives for that one message. A Gloo buffer's destructor unregisters its pair's receive
// buffer of the same slot, so none stays registered on kDirectSlot: the receiving side registers
// it just before it reads the message, and the sending side's lives only while it writes.
constexpr size_t kDirectBytes = 4 << 10;
constexpr int kDirectSlot = 0x6b;
// When polling, a message larger than kWholeMessageBytes that has begun to arrive is waited for
// whole, for up to kRestSpin more (SyncMesh::AwaitReadable). At 2 hosts x 1 rank of the test bed,
// 64 KiB allreduces (one message each way) took 39-43 us (median) and 63-71 us (90th percentile)
// with 16 KiB here, against 41-50 us and 72-89 us with 64 KiB (fresh sessions; two runs of 24
// alternating with the previous build).
constexpr size_t kWholeMessageBytes = 16 << 10;
constexpr std::chrono::microseconds kRestSpin{50};

}  // namespace horovod::gloo_backend
