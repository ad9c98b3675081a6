// Liveness: which peers are gone, for the error every pending operation fails with when a
// transport reports a lost connection.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace horovod {

// Whether process `pid` on this host has exited (gone, or a zombie not yet reaped).
bool ProcessGone(int64_t pid);

// Names the ranks whose processes have exited, among `peers` (host name and pid of every global
// rank) on this rank's host (`me`), waiting up to 2 seconds for a killed peer to become a zombie:
// "rank 1 (pid 123 on hostA), whose process has exited", or a generic text when none is found
// (peers on other hosts cannot be checked from here).
std::string DescribeLostRanks(const std::vector<std::pair<std::string, int64_t>>& peers, int me);

}  // namespace horovod
