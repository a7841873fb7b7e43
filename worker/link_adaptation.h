// Compression that follows the link (issue 38 part 2; worker/README.md, "A metered or slow
// link"): the asynchronous worker measures its uplink from its own update POSTs and picks
// the AdaComp rate c of each update so that sending takes at most a share of its step time
// (--send-share), or so that a byte budget per period (--byte-budget 50MB/day) is never
// exceeded, within [--min-compression-rate, --max-compression-rate]. Ours: the AdaComp
// paper uses one fixed c for every worker.
//
// The pieces are plain values and functions so they are tested without a network
// (tests/unit/link_adaptation_test.cc); Worker (worker.cc) feeds them its transfers and
// asks for c before each update. Nothing here allocates after construction. Not
// thread-safe: the worker's loop thread only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace edgetrain::runtime {

// A byte budget: at most `bytes` in any window of `period_seconds`.
struct ByteBudget {
  std::uint64_t bytes = 0;
  double period_seconds = 0;
  bool enabled() const { return bytes > 0; }
};

// "50MB/day", "5MB/hour", "200kB/10min", "1GiB/week", "" (off). Sizes: B, kB (or KB), MB,
// GB (powers of 1000), KiB, MiB, GiB (powers of 1024); periods: s, min, h (hour), day (d),
// week, with an optional count before the unit ("10min", "6h"). Throws
// std::invalid_argument naming the text and what is wrong with it.
ByteBudget parse_byte_budget(const std::string& text);
std::string byte_budget_text(const ByteBudget& budget);

// What one update or pull costs on the wire beyond its payload, estimated (the worker sees
// only payloads): per CoAP block of 1,024 bytes, the block's DTLS record and CoAP header
// and the answer's (kWireBytesPerBlock, both directions), and a full DTLS handshake per new
// session (kWireBytesPerHandshake). Ours, set above what edgetrain-link-impairer counted on
// loopback (worker/README.md); retransmissions on a lossy link are not seen.
inline constexpr std::size_t kWireBytesPerBlock = 160;
inline constexpr std::size_t kWireBytesPerHandshake = 2500;
std::size_t estimated_wire_bytes(std::size_t payload_bytes);

// The uplink from the worker's own POSTs: a transfer of B bytes is taken to last
// fixed + B·per_byte seconds (the round trips of the exchange, then the bytes through the
// bottleneck). Both are fitted over the last kSamples transfers by Theil–Sen (the median of
// the pairwise slopes, then the median intercept): one slow transfer among them moves
// neither. Needs transfers of different sizes: the worker varies c a little around its
// choice (rate_dither()). Until then, or with all sizes alike, per_byte is the median of
// seconds/bytes and fixed is 0 (an upper bound on the cost of an update of that size).
class UplinkEstimate {
 public:
  static constexpr std::size_t kSamples = 16;
  void add(std::size_t bytes, double seconds);
  std::size_t samples() const { return count_; }
  bool ready() const { return count_ >= 3; }
  double fixed_seconds() const { return fixed_seconds_; }
  double seconds_per_byte() const { return seconds_per_byte_; }
  // bytes/s through the bottleneck (0 before ready()).
  double bytes_per_second() const { return seconds_per_byte_ > 0 ? 1.0 / seconds_per_byte_ : 0.0; }
  double predicted_seconds(std::size_t bytes) const {
    return fixed_seconds_ + seconds_per_byte_ * static_cast<double>(bytes);
  }

 private:
  void fit();
  std::array<double, kSamples> bytes_{}, seconds_{};
  std::size_t count_ = 0, next_ = 0;
  double fixed_seconds_ = 0, seconds_per_byte_ = 0;
  std::vector<double> scratch_ = std::vector<double>(kSamples * kSamples);
};

// Bytes counted over a sliding period in buckets of period/kBuckets each (kBuckets + 1 of
// them: [now − period, now] overlaps that many). spent() sums every bucket that overlaps
// [now − period, now], so it is never below what the period ending now carried (it may
// count up to one bucket more): holding
// spent() + next ≤ budget before each transfer keeps every window of the period within it.
class ByteWindow {
 public:
  static constexpr std::size_t kBuckets = 64;
  explicit ByteWindow(double period_seconds = 3600);
  // `now`: seconds from any fixed origin, never decreasing.
  void add(double now, std::uint64_t bytes);
  std::uint64_t spent(double now);
  // How long until spent() + bytes ≤ budget (0: now); a request larger than the budget
  // itself never fits (returns the whole period: the caller then waits and asks again).
  double seconds_until_room(double now, std::uint64_t bytes, std::uint64_t budget);

 private:
  void advance(double now);
  double bucket_seconds_;
  std::array<std::uint64_t, kBuckets + 1> buckets_{};
  std::int64_t newest_ = -1;  // index of the bucket of the last advance(), counted from 0
};

struct LinkAdaptationSettings {
  // F in (0, 1): the send at most F of the loop's turn (pull, compute and send), i.e. at
  // most F/(1 − F) times the pull and compute. 0: off.
  double send_share = 0;
  ByteBudget budget;
  bool budget_counts_pulls = true;  // both directions (default) or the updates only
  double min_rate = 0.001, max_rate = 0.1;
  bool enabled() const { return send_share > 0 || budget.enabled(); }
};

// What the choice was made from, for the stats file and tests.
struct RateInputs {
  double step_seconds = 0;             // a step's compute (and slowdown)
  double rest_of_step_seconds = 0;     // compute, slowdown and pull: a turn without its send
  double pull_wire_bytes = 0;          // a pull's expected wire bytes (counted or not)
  double payload_bytes_per_entry = 8;  // from the last update
};

// The largest c in [min_rate, max_rate] whose update fits both limits (min_rate when none
// does; max_rate when there is no limit or the uplink is not measured yet). `entries(c)` is
// the update's entry count at c (Σ top_k_count over the tensors).
class RateChooser {
 public:
  RateChooser(LinkAdaptationSettings settings, std::vector<std::uint32_t> tensor_sizes);
  double choose(const UplinkEstimate& uplink, const RateInputs& inputs) const;
  // The payload bytes an update at `rate` is expected to take.
  double predicted_payload_bytes(double rate, double payload_bytes_per_entry) const;
  std::uint64_t entries(double rate) const;
  // The largest payload the limits allow (infinity when none applies).
  double payload_limit(const UplinkEstimate& uplink, const RateInputs& inputs) const;
  const LinkAdaptationSettings& settings() const { return settings_; }

 private:
  LinkAdaptationSettings settings_;
  std::vector<std::uint32_t> tensor_sizes_;
};

// c may grow by at most this factor from one update's choice to the next (ours): at a small
// c the transfers are short and their sizes alike, the fitted rate is mostly noise, and a
// jump to the largest c on it would cost a long send before the fit corrects it.
inline constexpr double kMaxRateGrowth = 1.5;

// The factor the worker applies to its chosen c on update n: 1, 0.8, 1.25 in turn, so the
// uplink estimate sees transfers of different sizes (ours).
double rate_dither(std::uint64_t update_number);

}  // namespace edgetrain::runtime
