// The sockets under Gloo's TCP pairs, which the synchronous mesh polls itself: Gloo does not expose
// a pair's socket, whose local address it does expose, so they are found by that address among
// this process's file descriptors.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <map>
#include <string>

namespace horovod::gloo_backend {

// An IPv4 or IPv6 socket address as a key: family, port and address bytes ("" for others).
std::string AddressKey(const sockaddr_storage& address);

// This process's sockets by local address (AddressKey), from /proc/self/fd.
std::map<std::string, int> SocketsByAddress();

// Polls `ready` until it is readable or `spin` has passed, yielding the core between polls.
bool PollFor(pollfd& ready, std::chrono::microseconds spin);

}  // namespace horovod::gloo_backend
