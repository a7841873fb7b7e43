// A CoapDtlsServer driven on a thread of its own for as long as this object lives, so a
// test can talk to it with blocking clients from the test's thread.
#pragma once

#include <atomic>
#include <thread>

#include "transport/coap_dtls.h"

namespace edgetrain::testing {

class ServerThread {
 public:
  explicit ServerThread(transport::CoapDtlsServer& server)
      : thread_([this, &server] {
          while (!stop_) server.run_once(10);
        }) {}
  ~ServerThread() {
    stop_ = true;
    thread_.join();
  }
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;

 private:
  std::atomic<bool> stop_ = false;
  std::thread thread_;
};

}  // namespace edgetrain::testing
