#include "logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace horovod {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::WARNING)};
std::atomic<bool> g_hide_time{false};

const char* LevelName(LogLevel level) {
  static const char* names[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
  return names[static_cast<int>(level)];
}
}  // namespace

void SetLogLevel(LogLevel level, bool hide_time) {
  g_level = static_cast<int>(level);
  g_hide_time = hide_time;
}

LogLevel CurrentLogLevel() { return static_cast<LogLevel>(g_level.load()); }

LogMessage::LogMessage(const char* file, int line, LogLevel level) : file_(file), line_(line), level_(level) {}

LogMessage::~LogMessage() {
  const char* base = std::strrchr(file_, '/');
  base = base ? base + 1 : file_;
  FILE* out = level_ >= LogLevel::WARNING ? stderr : stdout;
  if (g_hide_time) {
    std::fprintf(out, "[%s %s:%d] %s\n", LevelName(level_), base, line_, stream_.str().c_str());
  } else {
    auto now = std::chrono::system_clock::now();
    std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
    std::tm local{};
    localtime_r(&seconds, &local);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &local);
    std::fprintf(out, "[%s.%06lld: %s %s:%d] %s\n", stamp, static_cast<long long>(micros), LevelName(level_), base,
                 line_, stream_.str().c_str());
  }
  std::fflush(out);
}

}  // namespace horovod
