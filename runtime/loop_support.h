// What the worker loops (worker.cc, round_worker.cc, gossip_peer.cc) share privately: the
// sleep a stop flag cuts short, the model's layout as the compressor and the codec want it,
// and a peer's diagnostic as a log line shows it. Not part of the library's interface.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/compressor.h"
#include "runtime/model.h"
#include "transport/untrusted_text.h"

namespace edgetrain::runtime::loop {

using Clock = std::chrono::steady_clock;

// Sleeps up to `duration`, returning within 20 ms once `stop` is set.
inline void sleep_unless_stopped(Clock::duration duration, const std::atomic<bool>& stop) {
  const auto until = Clock::now() + duration;
  while (!stop && Clock::now() < until)
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(20), until - Clock::now()));
}

// A peer's diagnostic, as a log line shows it: network text, so escaped
// (transport::escape_untrusted) and cut at 200 bytes.
inline std::string payload_text(const std::vector<std::uint8_t>& payload) {
  return transport::escape_untrusted(std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()),
                                     200);
}

inline std::vector<TensorSlice> layout_of(const Model& model) {
  std::vector<TensorSlice> layout;
  for (const auto& t : model.tensors()) layout.push_back({t.offset, static_cast<std::uint32_t>(t.size)});
  return layout;
}

inline std::vector<std::uint32_t> tensor_sizes_of(const Model& model) {
  std::vector<std::uint32_t> sizes;
  for (const auto& t : model.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
  return sizes;
}

}  // namespace edgetrain::runtime::loop
