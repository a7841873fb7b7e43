// Log lines with levels, and repeats collapsed into one line with a count per interval.
//
// Every program writes "2024-05-01T12:34:56.789Z message" lines to stderr (write()); a line
// below the level set with set_level() (--log-level) is dropped before it is formatted.
// RepeatLimiter is what keeps a flood of the same event (a thousand "refused ... too stale"
// lines) from drowning the log: per kind of line, the first `burst` lines of an interval go
// out as they are, the rest are counted and summed up in one line when the interval ends.
// Scripts never read these lines (they read port and stats files); people do.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace edgetrain::logging {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };
const char* level_name(Level level);                      // "error", "warn", "info", "debug"
std::optional<Level> parse_level(std::string_view name);  // the names above; nullopt otherwise

// The process-wide threshold (default kInfo). Any thread.
void set_level(Level level);
Level level();
inline bool enabled(Level l) { return static_cast<int>(l) <= static_cast<int>(level()); }

// One timestamped line on stderr, if `l` is enabled; lines from different threads never mix.
// Error and warning lines carry "ERROR: " / "WARNING: " unless the message already starts so.
void write(Level l, const std::string& message);

// Collapses repeats of the same kind of line. Not thread-safe: one per thread that logs
// (the server's CoAP thread). The clock is passed in, so tests drive it.
class RepeatLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::size_t burst = 10;  // lines of one kind shown per interval before counting starts
    Clock::duration interval = std::chrono::seconds(10);
    // Kinds remembered at once; a new kind beyond it first ends the oldest interval (its
    // summary line is returned then), so a flood of distinct kinds cannot grow memory.
    std::size_t max_kinds = 1024;
  };
  explicit RepeatLimiter(Options options);

  // What to write for one line of kind `kind`: the line itself while the kind is within its
  // burst; nothing while it is over it (counted); and before either, summary lines of
  // intervals that have ended (this kind's, or the oldest kind's when the table is full).
  std::vector<std::string> admit(std::string_view kind, const std::string& line,
                                 Clock::time_point now);
  // Summary lines of every interval that has ended by `now` (call it now and then, e.g.
  // once a second, so that a flood that stopped is still summed up).
  std::vector<std::string> flush(Clock::time_point now);
  // Summary lines of every kind, ended or not, and an empty table (before the program stops).
  std::vector<std::string> flush_all(Clock::time_point now);
  // Lines counted and not yet summed up, in all kinds.
  std::uint64_t suppressed() const;
  std::size_t kinds() const { return kinds_.size(); }

 private:
  struct Kind {
    Clock::time_point started;
    std::size_t shown = 0;
    std::uint64_t suppressed = 0;
    std::string last_suppressed;  // the last line counted, shown in the summary
  };
  // "LINE (1,435 more in the last 10 s)" for a kind with suppressed lines.
  std::string summary(const Kind& kind, Clock::time_point now) const;
  std::vector<std::string> flush_ended(Clock::time_point now, bool all);

  Options options_;
  std::map<std::string, Kind, std::less<>> kinds_;
};

// 1435 → "1,435".
std::string with_thousands(std::uint64_t value);

}  // namespace edgetrain::logging
