// Compression that follows the link (worker/link_adaptation.h): the byte budget's text, the
// uplink estimate against the transfer times it was fed (one slow transfer among them),
// the byte window against a brute-force sliding window, and the rate chooser's choice
// against the limits it must keep.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "worker/compressor.h"
#include "worker/link_adaptation.h"

namespace {

using namespace edgetrain::runtime;

TEST(ByteBudget, ParsesSizesAndPeriods) {
  EXPECT_FALSE(parse_byte_budget("").enabled());
  ByteBudget b = parse_byte_budget("50MB/day");
  EXPECT_EQ(b.bytes, 50'000'000u);
  EXPECT_EQ(b.period_seconds, 86400);
  b = parse_byte_budget("5MB/hour");
  EXPECT_EQ(b.bytes, 5'000'000u);
  EXPECT_EQ(b.period_seconds, 3600);
  b = parse_byte_budget("200kB/10min");
  EXPECT_EQ(b.bytes, 200'000u);
  EXPECT_EQ(b.period_seconds, 600);
  b = parse_byte_budget("1.5GiB/week");
  EXPECT_EQ(b.bytes, 1'610'612'736u);
  EXPECT_EQ(b.period_seconds, 7 * 86400);
  EXPECT_EQ(parse_byte_budget("300KiB/6h").period_seconds, 6 * 3600);
}

TEST(ByteBudget, RefusesWithTheTextAndTheProblem) {
  const std::pair<const char*, const char*> bad[] = {{"50MB", "no '/'"},
                                                     {"MB/day", "does not start with a number"},
                                                     {"50XB/day", "size unit"},
                                                     {"50MB/fortnight", "unknown period"},
                                                     {"0MB/day", "at least 1"},
                                                     {"5MB/0h", "1 s to a year"},
                                                     {"1.2.3MB/day", "not a number"}};
  for (const auto& [text, why] : bad) {
    try {
      parse_byte_budget(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(text), std::string::npos) << message;
      EXPECT_NE(message.find(why), std::string::npos) << message;
    }
  }
}

TEST(UplinkEstimate, FitsTheFixedTimeAndTheRateDespiteOneSlowTransfer) {
  const double fixed = 0.04, per_byte = 1.0 / 50e3;  // 40 ms of round trips, 50 kB/s
  UplinkEstimate uplink;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> noise(0.98, 1.02);
  for (std::uint64_t i = 0; i < UplinkEstimate::kSamples; i++) {
    const std::size_t bytes = static_cast<std::size_t>(20000 * rate_dither(i));
    double seconds = (fixed + per_byte * static_cast<double>(bytes)) * noise(rng);
    if (i == 7) seconds *= 10;  // one transfer stuck behind something else
    uplink.add(bytes, seconds);
  }
  ASSERT_TRUE(uplink.ready());
  EXPECT_NEAR(uplink.bytes_per_second(), 50e3, 50e3 * 0.1);
  EXPECT_NEAR(uplink.fixed_seconds(), fixed, 0.02);
  EXPECT_NEAR(uplink.predicted_seconds(20000), fixed + 0.4, 0.4 * 0.05);
}

TEST(UplinkEstimate, TransfersOfOneSizeGiveAnUpperBound) {
  UplinkEstimate uplink;
  for (double seconds : {0.50, 0.52, 0.48, 5.0}) uplink.add(10000, seconds);
  EXPECT_EQ(uplink.fixed_seconds(), 0);
  EXPECT_NEAR(uplink.predicted_seconds(10000), 0.51, 0.011);  // the median, not the 5 s one
}

// The window's spent() against every transfer of the last period kept one by one.
TEST(ByteWindow, NeverCountsLessThanTheLastPeriodCarried) {
  const double period = 100;
  ByteWindow window(period);
  const double bucket = period / ByteWindow::kBuckets;
  std::deque<std::pair<double, std::uint64_t>> kept;  // the last period and one bucket
  std::mt19937 rng(5);
  std::exponential_distribution<double> gap(0.5);
  std::uniform_int_distribution<std::uint64_t> size(1, 5000);
  double now = 0;
  for (int i = 0; i < 5000; i++) {
    now += gap(rng);
    const std::uint64_t bytes = size(rng);
    window.add(now, bytes);
    kept.emplace_back(now, bytes);
    while (kept.front().first < now - period - bucket) kept.pop_front();
    std::uint64_t sliding = 0, with_one_bucket_more = 0;
    for (const auto& [t, b] : kept) {
      with_one_bucket_more += b;
      if (t >= now - period) sliding += b;
    }
    const std::uint64_t counted = window.spent(now);
    ASSERT_GE(counted, sliding) << "at t=" << now;
    ASSERT_LE(counted, with_one_bucket_more) << "at t=" << now;
  }
  EXPECT_EQ(window.spent(now + period * 1.1), 0u);
}

TEST(ByteWindow, SaysWhenThereIsRoomAgain) {
  ByteWindow window(64);  // one bucket per second
  window.add(0.5, 900);
  window.add(10.5, 100);
  EXPECT_EQ(window.seconds_until_room(10.5, 0, 1000), 0);
  // 500 more fit once the 900 of second 0 have left every window: at t = 65.
  const double wait = window.seconds_until_room(10.5, 500, 1000);
  EXPECT_NEAR(wait, 65 - 10.5, 1e-9);
  EXPECT_GT(window.seconds_until_room(10.5 + wait - 0.01, 500, 1000), 0);
  EXPECT_EQ(window.seconds_until_room(10.5 + wait, 500, 1000), 0);
  EXPECT_EQ(window.seconds_until_room(10.5, 2000, 1000), 64);  // never fits
}

const std::vector<std::uint32_t> kPaperCnnSizes = {800, 32, 51200, 64, 401408, 128, 1280, 10};

UplinkEstimate measured(double bytes_per_second, double fixed) {
  UplinkEstimate uplink;
  for (std::uint64_t i = 0; i < 9; i++) {
    const std::size_t bytes = static_cast<std::size_t>(10000 * rate_dither(i));
    uplink.add(bytes, fixed + static_cast<double>(bytes) / bytes_per_second);
  }
  return uplink;
}

TEST(RateChooser, KeepsTheSendWithinItsShareOfTheStep) {
  LinkAdaptationSettings settings;
  settings.send_share = 0.2;
  settings.min_rate = 1e-4;
  settings.max_rate = 0.2;
  const RateChooser chooser(settings, kPaperCnnSizes);
  RateInputs inputs;
  inputs.step_seconds = 0.3;
  inputs.rest_of_step_seconds = 0.5;  // compute 0.3 s and pull 0.2 s
  inputs.payload_bytes_per_entry = 6;
  double previous = 1;
  for (double bandwidth : {1e6, 300e3, 100e3, 30e3, 10e3}) {
    const UplinkEstimate uplink = measured(bandwidth, 0.01);
    const double c = chooser.choose(uplink, inputs);
    const double send =
        uplink.predicted_seconds(static_cast<std::size_t>(chooser.predicted_payload_bytes(c, 6)));
    EXPECT_LE(send, 0.2 / 0.8 * 0.5 + 1e-9) << bandwidth;
    if (c < settings.max_rate) {  // the largest that fits: 2% more does not
      const double more = uplink.predicted_seconds(
          static_cast<std::size_t>(chooser.predicted_payload_bytes(c * 1.02, 6)));
      EXPECT_GT(more, 0.2 / 0.8 * 0.5) << bandwidth;
    }
    EXPECT_LE(c, previous) << "a slower link got a larger c";
    previous = c;
  }
  EXPECT_LT(previous, 0.01);
  // Not measured yet: no limit known.
  EXPECT_EQ(chooser.choose(UplinkEstimate{}, inputs), settings.max_rate);
  // A link whose fixed time alone is past the share: the smallest c.
  EXPECT_EQ(chooser.choose(measured(1e6, 1.0), inputs), settings.min_rate);
}

TEST(RateChooser, PacesTheByteBudget) {
  LinkAdaptationSettings settings;
  settings.budget = parse_byte_budget("36MB/hour");  // 10 kB/s
  settings.min_rate = 1e-4;
  settings.max_rate = 0.5;
  for (bool pulls : {false, true}) {
    settings.budget_counts_pulls = pulls;
    const RateChooser chooser(settings, kPaperCnnSizes);
    RateInputs inputs;
    inputs.rest_of_step_seconds = 0.2;
    inputs.pull_wire_bytes = 600;
    inputs.payload_bytes_per_entry = 6;
    const UplinkEstimate uplink = measured(1e6, 0.005);
    const double c = chooser.choose(uplink, inputs);
    const double payload = chooser.predicted_payload_bytes(c, 6);
    const double wire =
        static_cast<double>(estimated_wire_bytes(static_cast<std::size_t>(payload))) +
        (pulls ? inputs.pull_wire_bytes : 0);
    const double seconds =
        inputs.rest_of_step_seconds + uplink.predicted_seconds(static_cast<std::size_t>(payload));
    EXPECT_LE(wire / seconds, 0.9 * 10e3 * 1.001) << "pulls counted: " << pulls;
    EXPECT_GT(wire / seconds, 0.9 * 10e3 * 0.9) << "the budget is left unused; pulls: " << pulls;
  }
}

TEST(RateChooser, RefusesBoundsOutOfOrder) {
  LinkAdaptationSettings settings;
  settings.min_rate = 0.2;
  settings.max_rate = 0.1;
  EXPECT_THROW(RateChooser(settings, kPaperCnnSizes), std::invalid_argument);
}

TEST(Compressor, SendsTheRateSetBetweenCalls) {
  std::vector<TensorSlice> layout = {{0, 1000}, {1000, 100}};
  Compressor compressor(layout, {});
  std::vector<float> gradient(1100);
  for (std::size_t i = 0; i < gradient.size(); i++) gradient[i] = static_cast<float>(i % 97) - 48;
  edgetrain::transport::SparseUpdate update;
  compressor.compress(gradient, update);
  EXPECT_EQ(update.tensors[0].indices.size(), 10u);
  compressor.set_compression_rate(0.05);
  compressor.compress(gradient, update);
  EXPECT_EQ(update.tensors[0].indices.size(), 50u);
  EXPECT_EQ(update.tensors[1].indices.size(), 5u);
  EXPECT_THROW(compressor.set_compression_rate(0), std::invalid_argument);
}

}  // namespace
