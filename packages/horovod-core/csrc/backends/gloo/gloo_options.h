// The options only the Gloo backend reads (BackendOptions::gloo).
#pragma once

#include <chrono>
#include <string>

namespace horovod {

struct GlooOptions {
  std::string iface;     // network interface for the data transport ("" = by hostname)
  std::string hostname;  // address to listen on when no interface is given
  // How a rank waits for a peer's message: polling the socket the whole time (busy_poll), or
  // polling for up to `spin` and then sleeping until the data arrives.
  bool busy_poll = false;
  std::chrono::microseconds spin{0};
  // Whether ranks of one host (same hostname) that may access each other's memory move the large
  // exchanges of allreduce with process_vm_readv and process_vm_writev instead of TCP.
  bool cross_memory = false;
  // Whether ranks of one host (same hostname) exchange the messages of allreduce, broadcast and
  // the control plane through a shared-memory segment per pair instead of TCP.
  bool local_channel = false;
};

}  // namespace horovod
