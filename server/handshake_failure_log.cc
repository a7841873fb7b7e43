#include "server/handshake_failure_log.h"

#include <utility>

#include "transport/untrusted_text.h"

namespace edgetrain::server {
namespace {

std::string describe(const transport::HandshakeFailure& failure) {
  return "DTLS handshake of known device '" + transport::escape_untrusted(failure.identity) +
         "' from " + transport::escape_untrusted(failure.peer_address) +
         " failed: " + failure.reason;
}

}  // namespace

HandshakeFailureLog::HandshakeFailureLog(std::function<void(const std::string&)> log,
                                         Clock::duration interval)
    : log_(std::move(log)), interval_(interval) {}

void HandshakeFailureLog::record(const transport::HandshakeFailure& failure,
                                 Clock::time_point now) {
  auto [it, fresh] = entries_.try_emplace(failure.identity);
  Entry& entry = it->second;
  if (!fresh && now - entry.last_line < interval_) {
    ++entry.held_back;
    entry.last = failure;
    return;
  }
  std::string line = describe(failure);
  if (entry.held_back > 0)
    line += "; " + std::to_string(entry.held_back) +
            " earlier failures of this device since its last line not logged";
  entry = Entry{now, 0, failure};
  if (log_) log_(line);
}

void HandshakeFailureLog::flush(Clock::time_point now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& entry = it->second;
    if (now - entry.last_line < interval_) {
      ++it;
      continue;
    }
    if (entry.held_back == 0) {
      it = entries_.erase(it);
      continue;
    }
    if (log_)
      log_("DTLS handshake of known device '" + transport::escape_untrusted(entry.last.identity) +
           "' failed " + std::to_string(entry.held_back) +
           " more times since its last line; the latest from " +
           transport::escape_untrusted(entry.last.peer_address) + ": " + entry.last.reason);
    entry = Entry{now, 0, entry.last};
    ++it;
  }
}

}  // namespace edgetrain::server
