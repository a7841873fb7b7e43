#include "worker/link_adaptation.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "worker/compressor.h"

namespace edgetrain::runtime {
namespace {

// The pacing aims below the budget's average rate, so that estimates a little off do not
// run into the hard limit (ours).
constexpr double kBudgetPacing = 0.9;

double median_of(std::vector<double>& values, std::size_t n) {
  auto middle = values.begin() + static_cast<std::ptrdiff_t>(n / 2);
  std::nth_element(values.begin(), middle, values.begin() + static_cast<std::ptrdiff_t>(n));
  return *middle;
}

}  // namespace

ByteBudget parse_byte_budget(const std::string& text) {
  if (text.empty()) return {};
  const auto fail = [&](const std::string& why) {
    return std::invalid_argument("byte budget '" + text + "': " + why +
                                 " (expected BYTES/PERIOD, e.g. 50MB/day, 5MB/hour, 200kB/10min)");
  };
  const auto slash = text.find('/');
  if (slash == std::string::npos) throw fail("no '/' between the size and the period");
  // A number and a unit, e.g. "50MB", "1.5GiB", "10min".
  const auto split = [&](const std::string& part, double& number, std::string& unit,
                         bool number_optional) {
    std::size_t end = 0;
    while (end < part.size() &&
           (std::isdigit(static_cast<unsigned char>(part[end])) || part[end] == '.'))
      end++;
    if (end == 0) {
      if (!number_optional) throw fail("'" + part + "' does not start with a number");
      number = 1;
    } else {
      try {
        std::size_t used = 0;
        number = std::stod(part.substr(0, end), &used);
        if (used != end) throw std::invalid_argument("");
      } catch (const std::exception&) {
        throw fail("'" + part.substr(0, end) + "' is not a number");
      }
    }
    unit = part.substr(end);
    while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  };
  double amount = 0, periods = 0;
  std::string size_unit, period_unit;
  split(text.substr(0, slash), amount, size_unit, false);
  split(text.substr(slash + 1), periods, period_unit, true);
  double unit_bytes = 0;
  if (size_unit == "B")
    unit_bytes = 1;
  else if (size_unit == "kB" || size_unit == "KB")
    unit_bytes = 1e3;
  else if (size_unit == "MB")
    unit_bytes = 1e6;
  else if (size_unit == "GB")
    unit_bytes = 1e9;
  else if (size_unit == "KiB")
    unit_bytes = 1024.0;
  else if (size_unit == "MiB")
    unit_bytes = 1024.0 * 1024;
  else if (size_unit == "GiB")
    unit_bytes = 1024.0 * 1024 * 1024;
  else
    throw fail("unknown size unit '" + size_unit + "' (B, kB, MB, GB, KiB, MiB, GiB)");
  double unit_seconds = 0;
  if (period_unit == "s" || period_unit == "second")
    unit_seconds = 1;
  else if (period_unit == "min" || period_unit == "minute")
    unit_seconds = 60;
  else if (period_unit == "h" || period_unit == "hour")
    unit_seconds = 3600;
  else if (period_unit == "d" || period_unit == "day")
    unit_seconds = 86400;
  else if (period_unit == "week")
    unit_seconds = 7 * 86400;
  else
    throw fail("unknown period '" + period_unit + "' (s, min, h or hour, day, week)");
  const double bytes = amount * unit_bytes;
  const double seconds = periods * unit_seconds;
  if (!(bytes >= 1 && bytes < 1e18)) throw fail("the size must be at least 1 byte");
  if (!(seconds >= 1 && seconds <= 366 * 86400.0)) throw fail("the period must be 1 s to a year");
  return {static_cast<std::uint64_t>(bytes), seconds};
}

std::string byte_budget_text(const ByteBudget& budget) {
  if (!budget.enabled()) return "none";
  return std::to_string(budget.bytes) + " bytes per " +
         std::to_string(static_cast<std::uint64_t>(budget.period_seconds)) + " s";
}

std::size_t estimated_wire_bytes(std::size_t payload_bytes) {
  const std::size_t blocks = payload_bytes / 1024 + 1;
  return payload_bytes + blocks * kWireBytesPerBlock;
}

void UplinkEstimate::add(std::size_t bytes, double seconds) {
  if (bytes == 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  bytes_[next_] = static_cast<double>(bytes);
  seconds_[next_] = seconds;
  next_ = (next_ + 1) % kSamples;
  count_ = std::min(count_ + 1, kSamples);
  fit();
}

void UplinkEstimate::fit() {
  const std::size_t n = count_;
  std::size_t slopes = 0;
  for (std::size_t i = 0; i < n; i++) {
    for (std::size_t j = i + 1; j < n; j++) {
      const double db = bytes_[j] - bytes_[i];
      // Sizes within 5% of each other say more about the noise than about the slope.
      if (std::fabs(db) < 0.05 * std::max(bytes_[i], bytes_[j])) continue;
      scratch_[slopes++] = (seconds_[j] - seconds_[i]) / db;
    }
  }
  if (slopes >= 3) {
    seconds_per_byte_ = std::max(median_of(scratch_, slopes), 0.0);
    for (std::size_t i = 0; i < n; i++) scratch_[i] = seconds_[i] - seconds_per_byte_ * bytes_[i];
    fixed_seconds_ = std::max(median_of(scratch_, n), 0.0);
    if (seconds_per_byte_ > 0 || fixed_seconds_ > 0) return;
  }
  for (std::size_t i = 0; i < n; i++) scratch_[i] = seconds_[i] / bytes_[i];
  seconds_per_byte_ = median_of(scratch_, n);
  fixed_seconds_ = 0;
}

ByteWindow::ByteWindow(double period_seconds) : bucket_seconds_(period_seconds / kBuckets) {
  if (!(period_seconds > 0)) throw std::invalid_argument("byte window: the period must be > 0");
}

void ByteWindow::advance(double now) {
  const auto bucket = static_cast<std::int64_t>(std::floor(std::max(now, 0.0) / bucket_seconds_));
  if (newest_ < 0) {
    newest_ = bucket;
    return;
  }
  // Buckets that fall out of the window as time moves on are emptied for reuse.
  const auto ring = static_cast<std::int64_t>(buckets_.size());
  for (std::int64_t b = newest_ + 1; b <= bucket && b <= newest_ + ring; b++)
    buckets_[static_cast<std::size_t>(b % ring)] = 0;
  newest_ = std::max(newest_, bucket);
}

void ByteWindow::add(double now, std::uint64_t bytes) {
  advance(now);
  buckets_[static_cast<std::size_t>(newest_ % static_cast<std::int64_t>(buckets_.size()))] += bytes;
}

std::uint64_t ByteWindow::spent(double now) {
  advance(now);
  std::uint64_t sum = 0;
  for (std::uint64_t b : buckets_) sum += b;
  return sum;
}

double ByteWindow::seconds_until_room(double now, std::uint64_t bytes, std::uint64_t budget) {
  advance(now);
  const double period = bucket_seconds_ * kBuckets;
  if (bytes > budget) return period;
  std::uint64_t sum = 0;
  for (std::uint64_t b : buckets_) sum += b;
  if (sum + bytes <= budget) return 0;
  // The oldest buckets leave first: bucket `newest_ − kBuckets + i` no longer overlaps the
  // window once it reaches bucket `newest_ + 1 + i`.
  const auto ring = static_cast<std::int64_t>(buckets_.size());
  const double into_bucket = std::max(now, 0.0) / bucket_seconds_ - static_cast<double>(newest_);
  for (std::int64_t i = 0; i < ring; i++) {
    const std::int64_t leaving = newest_ - static_cast<std::int64_t>(kBuckets) + i;
    if (leaving >= 0) sum -= buckets_[static_cast<std::size_t>(leaving % ring)];
    if (sum + bytes <= budget) return (static_cast<double>(i + 1) - into_bucket) * bucket_seconds_;
  }
  return period;
}

RateChooser::RateChooser(LinkAdaptationSettings settings, std::vector<std::uint32_t> tensor_sizes)
    : settings_(settings), tensor_sizes_(std::move(tensor_sizes)) {
  if (!(settings_.min_rate > 0 && settings_.min_rate <= settings_.max_rate &&
        settings_.max_rate <= 1))
    throw std::invalid_argument(
        "link adaptation: the compression rates must satisfy 0 < min <= max <= 1 (got min " +
        std::to_string(settings_.min_rate) + ", max " + std::to_string(settings_.max_rate) + ")");
  if (!(settings_.send_share >= 0 && settings_.send_share < 1))
    throw std::invalid_argument("link adaptation: the send share must lie in [0, 1)");
}

std::uint64_t RateChooser::entries(double rate) const {
  std::uint64_t sum = 0;
  for (std::uint32_t n : tensor_sizes_) sum += Compressor::top_k_count(n, rate);
  return sum;
}

double RateChooser::predicted_payload_bytes(double rate, double payload_bytes_per_entry) const {
  return static_cast<double>(entries(rate)) * payload_bytes_per_entry;
}

double RateChooser::payload_limit(const UplinkEstimate& uplink, const RateInputs& in) const {
  double limit = std::numeric_limits<double>::infinity();
  if (!uplink.ready()) return limit;
  const double per_byte = uplink.seconds_per_byte(), fixed = uplink.fixed_seconds();
  if (settings_.send_share > 0 && per_byte > 0) {
    // send ≤ F·(rest + send)  ⇔  send ≤ F/(1 − F)·rest.
    const double allowed =
        settings_.send_share / (1 - settings_.send_share) * in.rest_of_step_seconds;
    limit = std::min(limit, std::max(0.0, (allowed - fixed) / per_byte));
  }
  if (settings_.budget.enabled()) {
    // Wire bytes per update ≈ a·B + b; updates come every rest + fixed + per_byte·B
    // seconds; the budget's rate R must cover them: a·B + b ≤ R·(rest + fixed + per_byte·B).
    const double rate = kBudgetPacing * static_cast<double>(settings_.budget.bytes) /
                        settings_.budget.period_seconds;
    const double a = 1 + static_cast<double>(kWireBytesPerBlock) / 1024;
    const double b = static_cast<double>(kWireBytesPerBlock) +
                     (settings_.budget_counts_pulls ? in.pull_wire_bytes : 0.0);
    const double slope = a - rate * per_byte;
    if (slope > 0)
      limit =
          std::min(limit, std::max(0.0, (rate * (in.rest_of_step_seconds + fixed) - b) / slope));
  }
  return limit;
}

double RateChooser::choose(const UplinkEstimate& uplink, const RateInputs& in) const {
  const double limit = payload_limit(uplink, in);
  const double per_entry = std::max(in.payload_bytes_per_entry, 1e-3);
  if (!std::isfinite(limit) || predicted_payload_bytes(settings_.max_rate, per_entry) <= limit)
    return settings_.max_rate;
  if (predicted_payload_bytes(settings_.min_rate, per_entry) > limit) return settings_.min_rate;
  // The entry count grows with c: bisect on a log scale (the range spans decades).
  double lo = std::log(settings_.min_rate), hi = std::log(settings_.max_rate);
  for (int i = 0; i < 40; i++) {
    const double mid = 0.5 * (lo + hi);
    if (predicted_payload_bytes(std::exp(mid), per_entry) <= limit)
      lo = mid;
    else
      hi = mid;
  }
  return std::exp(lo);
}

double rate_dither(std::uint64_t update_number) {
  static constexpr double kFactors[] = {1.0, 0.8, 1.25};
  return kFactors[update_number % 3];
}

}  // namespace edgetrain::runtime
