#include "common/liveness.h"

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace horovod {

bool ProcessGone(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

std::string DescribeLostRanks(const std::vector<std::pair<std::string, int64_t>>& peers, int me) {
  // A killed peer's sockets close while it exits; give it a moment to become a zombie.
  const std::string& my_host = peers[me].first;
  std::vector<int> gone;
  for (int attempt = 0; attempt < 40 && gone.empty(); ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
      if (r != me && peers[r].first == my_host && ProcessGone(peers[r].second)) gone.push_back(r);
    }
  }
  if (gone.empty()) return "another rank, which probably exited or was killed";
  std::ostringstream out;
  out << (gone.size() > 1 ? "ranks " : "rank ");
  for (size_t i = 0; i < gone.size(); ++i) {
    out << (i ? ", " : "") << gone[i] << " (pid " << peers[gone[i]].second << " on " << peers[gone[i]].first << ")";
  }
  out << (gone.size() > 1 ? ", whose processes have" : ", whose process has") << " exited";
  return out.str();
}

}  // namespace horovod
