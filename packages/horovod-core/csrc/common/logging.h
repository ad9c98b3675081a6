// Log lines in upstream's format: "[YYYY-MM-DD HH:MM:SS.uuuuuu: LEVEL file:line] message"
// (without the time when HOROVOD_LOG_HIDE_TIME is set). INFO and below go to stdout, WARNING and
// above to stderr. The level is process-wide: it is set once per Engine::Init from the Config.
#pragma once

#include <sstream>

namespace horovod {

enum class LogLevel : int { TRACE = 0, DEBUG, INFO, WARNING, ERROR, FATAL };

void SetLogLevel(LogLevel level, bool hide_time);
LogLevel CurrentLogLevel();

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogLevel level);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace horovod

#define HVD_LOG(level)                                                        \
  if (::horovod::LogLevel::level < ::horovod::CurrentLogLevel()) {            \
  } else                                                                      \
    ::horovod::LogMessage(__FILE__, __LINE__, ::horovod::LogLevel::level).stream()
