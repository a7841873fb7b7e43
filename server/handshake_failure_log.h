// The log lines for failed DTLS handshakes of known devices (transport::HandshakeFailure):
// a known identity with a wrong key is either a misconfigured board or someone trying keys
// for a real device name, and libcoap 4.3.1 says nothing about it at its error level. One
// line per identity per interval at most, with the escaped source address; failures in
// between are counted and reported in the identity's next line, or by flush() once the
// interval is over. Only known identities reach it, so its table is as small as the keystore.
// Not thread-safe: used by the thread that drives the server.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "transport/coap_dtls.h"

namespace edgetrain::server {

class HandshakeFailureLog {
 public:
  using Clock = std::chrono::steady_clock;
  HandshakeFailureLog(std::function<void(const std::string&)> log,
                      Clock::duration interval = std::chrono::seconds(10));

  void record(const transport::HandshakeFailure& failure, Clock::time_point now);
  // Lines for identities whose later failures were held back and whose interval is over.
  void flush(Clock::time_point now);

 private:
  struct Entry {
    Clock::time_point last_line;
    std::uint64_t held_back = 0;
    transport::HandshakeFailure last;
  };
  std::function<void(const std::string&)> log_;
  Clock::duration interval_;
  std::map<std::string, Entry> entries_;
};

}  // namespace edgetrain::server
