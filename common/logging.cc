#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace edgetrain::logging {
namespace {

std::atomic<int> g_level = static_cast<int>(Level::kInfo);
std::mutex g_write_mutex;

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

}  // namespace

const char* level_name(Level level) {
  switch (level) {
    case Level::kError:
      return "error";
    case Level::kWarn:
      return "warn";
    case Level::kInfo:
      return "info";
    case Level::kDebug:
      return "debug";
  }
  return "info";
}

std::optional<Level> parse_level(std::string_view name) {
  for (Level l : {Level::kError, Level::kWarn, Level::kInfo, Level::kDebug})
    if (name == level_name(l)) return l;
  return std::nullopt;
}

void set_level(Level l) { g_level.store(static_cast<int>(l), std::memory_order_relaxed); }
Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }

void write(Level l, const std::string& message) {
  if (!enabled(l)) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  const char* tag = "";
  if (l == Level::kError && !starts_with(message, "ERROR") && !starts_with(message, "error"))
    tag = "ERROR: ";
  if (l == Level::kWarn && !starts_with(message, "WARNING")) tag = "WARNING: ";
  std::lock_guard lock(g_write_mutex);
  std::fprintf(stderr, "%s.%03dZ %s%s\n", stamp, static_cast<int>(millis), tag, message.c_str());
}

std::string with_thousands(std::uint64_t value) {
  std::string digits = std::to_string(value);
  for (int at = static_cast<int>(digits.size()) - 3; at > 0; at -= 3)
    digits.insert(static_cast<std::size_t>(at), ",");
  return digits;
}

RepeatLimiter::RepeatLimiter(Options options) : options_(options) {
  if (options_.max_kinds == 0) options_.max_kinds = 1;
}

std::string RepeatLimiter::summary(const Kind& kind, Clock::time_point now) const {
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(now - kind.started).count();
  return kind.last_suppressed + " (" + with_thousands(kind.suppressed) + " more in the last " +
         std::to_string(seconds < 1 ? 1 : seconds) + " s)";
}

std::vector<std::string> RepeatLimiter::admit(std::string_view kind, const std::string& line,
                                              Clock::time_point now) {
  std::vector<std::string> out;
  auto it = kinds_.find(kind);
  if (it != kinds_.end() && now - it->second.started >= options_.interval) {
    if (it->second.suppressed > 0) out.push_back(summary(it->second, now));
    it->second = Kind{};
    it->second.started = now;
  }
  if (it == kinds_.end()) {
    if (kinds_.size() >= options_.max_kinds) {
      auto oldest = kinds_.begin();
      for (auto k = kinds_.begin(); k != kinds_.end(); ++k)
        if (k->second.started < oldest->second.started) oldest = k;
      if (oldest->second.suppressed > 0) out.push_back(summary(oldest->second, now));
      kinds_.erase(oldest);
    }
    it = kinds_.emplace(std::string(kind), Kind{}).first;
    it->second.started = now;
  }
  Kind& k = it->second;
  if (k.shown < options_.burst) {
    ++k.shown;
    out.push_back(line);
  } else {
    ++k.suppressed;
    k.last_suppressed = line;
  }
  return out;
}

std::vector<std::string> RepeatLimiter::flush(Clock::time_point now) {
  return flush_ended(now, false);
}

std::vector<std::string> RepeatLimiter::flush_all(Clock::time_point now) {
  return flush_ended(now, true);
}

std::vector<std::string> RepeatLimiter::flush_ended(Clock::time_point now, bool all) {
  std::vector<std::string> out;
  for (auto it = kinds_.begin(); it != kinds_.end();) {
    if (!all && now - it->second.started < options_.interval) {
      ++it;
      continue;
    }
    if (it->second.suppressed > 0) out.push_back(summary(it->second, now));
    it = kinds_.erase(it);  // an idle kind is forgotten: the next line of it starts afresh
  }
  return out;
}

std::uint64_t RepeatLimiter::suppressed() const {
  std::uint64_t total = 0;
  for (const auto& [name, kind] : kinds_) total += kind.suppressed;
  return total;
}

}  // namespace edgetrain::logging
