// MD-GAN on the server (server/gan_coordinator.h) without a network: batches by slot, the
// barrier with its deadline, refusals that change nothing, discriminator swap cycles, and
// recovery after a crash: the newest checkpoint plus the logged steps give G bit for bit.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <set>

#include "server/gan_coordinator.h"
#include "tests/support/served_resources.h"
#include "transport/gan_codec.h"

namespace {

using namespace edgetrain;
using edgetrain::testing::TempDir;
using server::GanCoordinator;
using server::GanServerOptions;
using transport::CoapCode;

constexpr int kBatch = 4;

struct Clock {
  std::chrono::steady_clock::time_point now =
      std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
};

GanServerOptions options_for(const TempDir& dir, Clock& clock, std::uint32_t workers,
                             std::uint32_t k = 1) {
  GanServerOptions o;
  o.gan.batch = kBatch;
  o.gan.seed = 9;
  o.gan.backend = runtime::KernelBackend::kReference;
  o.workers = workers;
  o.k = k;
  o.deadline_seconds = 5;
  o.checkpoint_every = 3;
  o.directory = dir.path() / "gan";
  o.now = [&clock] { return clock.now; };
  return o;
}

transport::CoapRequest request(const std::string& identity,
                               std::span<const std::uint8_t> body = {}) {
  transport::CoapRequest r;
  r.method = body.empty() ? transport::Method::kGet : transport::Method::kPost;
  r.authentication = transport::PeerAuthentication::kPsk;
  r.identity = identity;
  r.payload = body;
  return r;
}

transport::GanBatches batches_for(GanCoordinator& gan, const std::string& identity) {
  const auto answer = gan.get_batches(request(identity));
  EXPECT_EQ(answer.code, CoapCode::kContent)
      << std::string(answer.payload.begin(), answer.payload.end());
  auto decoded = transport::decode_gan_batches(
      answer.payload, {.run_id = gan.run_id(), .batch = kBatch, .width = 784});
  EXPECT_TRUE(decoded) << decoded.error().message;
  return decoded ? decoded.value() : transport::GanBatches{};
}

// A feedback that depends on the iteration and the worker, so steps differ.
std::vector<std::uint8_t> feedback(const GanCoordinator& gan, std::uint64_t iteration, int worker) {
  transport::GanFeedback f{
      .run_id = gan.run_id(), .iteration = iteration, .batch = kBatch, .width = 784, .values = {}};
  for (int i = 0; i < kBatch * 784; i++)
    f.values.push_back(
        1e-3f * static_cast<float>((i * 7 + worker * 13 + static_cast<int>(iteration) * 5) % 17) -
        8e-3f);
  return transport::encode_gan_feedback(f, transport::ValueEncoding::kFp32).value();
}

// Every worker fetches and answers the open iteration.
void run_iteration(GanCoordinator& gan, const std::vector<std::string>& workers) {
  const std::uint64_t i = gan.iteration();
  for (std::size_t n = 0; n < workers.size(); n++) {
    batches_for(gan, workers[n]);
    const auto body = feedback(gan, i, static_cast<int>(n));
    EXPECT_EQ(gan.post_feedback(request(workers[n], body)).code, CoapCode::kChanged);
  }
}

nlohmann::json status(const GanCoordinator& gan) {
  return nlohmann::json::parse(gan.status_json());
}

TEST(GanCoordinator, AnIterationClosesWhenEveryWorkerAnsweredAndRefusalsChangeNothing) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  GanCoordinator gan(options_for(dir, clock, 2));
  const auto before = gan.generator().params;
  const auto a = batches_for(gan, "a");
  EXPECT_EQ(a.iteration, 0u);
  EXPECT_EQ(a.g_samples, a.d_samples);  // k = 1: both batches are X_1
  batches_for(gan, "b");
  EXPECT_EQ(gan.get_batches(request("c")).code, CoapCode::kForbidden);  // two slots

  const auto good = feedback(gan, 0, 0);
  EXPECT_EQ(gan.post_feedback(request("a", feedback(gan, 1, 0))).code,
            CoapCode::kConflict);  // a future iteration
  std::vector<std::uint8_t> torn(good.begin(), good.end() - 1);
  EXPECT_EQ(gan.post_feedback(request("a", torn)).code, CoapCode::kBadRequest);
  transport::GanFeedback other_run{.run_id = gan.run_id() + 1,
                                   .iteration = 0,
                                   .batch = kBatch,
                                   .width = 784,
                                   .values = std::vector<float>(kBatch * 784, 0.0f)};
  EXPECT_EQ(
      gan
          .post_feedback(request(
              "a",
              transport::encode_gan_feedback(other_run, transport::ValueEncoding::kFp32).value()))
          .code,
      CoapCode::kBadRequest);
  EXPECT_EQ(gan.post_feedback(request("c", good)).code, CoapCode::kForbidden);
  EXPECT_EQ(gan.generator().params, before);

  EXPECT_EQ(gan.post_feedback(request("a", good)).code, CoapCode::kChanged);
  EXPECT_EQ(gan.post_feedback(request("a", good)).code, CoapCode::kChanged);  // counted once
  EXPECT_EQ(gan.get_batches(request("a")).code, 503);                         // a waits for b
  EXPECT_EQ(gan.iteration(), 0u);
  EXPECT_EQ(gan.generator().params, before);
  EXPECT_EQ(gan.post_feedback(request("b", feedback(gan, 0, 1))).code, CoapCode::kChanged);
  EXPECT_EQ(gan.iteration(), 1u);
  EXPECT_NE(gan.generator().params, before);
  EXPECT_EQ(gan.post_feedback(request("b", feedback(gan, 0, 1))).code,
            CoapCode::kConflict);  // closed
  const auto s = status(gan);
  EXPECT_EQ(s["feedbacks"], 2);
  EXPECT_EQ(s["duplicates"], 1);
  EXPECT_EQ(s["malformed_refused"], 2);
  EXPECT_EQ(s["late_refused"], 2);
  EXPECT_EQ(s["dropped"], 0);
  EXPECT_NE(batches_for(gan, "a").g_samples, a.g_samples);  // iteration 1's samples, from the new G
}

TEST(GanCoordinator, TheDeadlineDropsAWorkerThatMissedIt) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  GanCoordinator gan(options_for(dir, clock, 3));
  for (const char* w : {"a", "b", "c"}) batches_for(gan, w);
  clock.now += std::chrono::seconds(6);
  EXPECT_FALSE(gan.poll());  // nobody answered: the same iteration with a new deadline
  EXPECT_EQ(gan.iteration(), 0u);
  EXPECT_EQ(status(gan)["empty_deadlines"], 1);
  gan.post_feedback(request("a", feedback(gan, 0, 0)));
  gan.post_feedback(request("b", feedback(gan, 0, 1)));
  EXPECT_FALSE(gan.poll());
  clock.now += std::chrono::seconds(6);
  EXPECT_TRUE(gan.poll());
  EXPECT_EQ(gan.iteration(), 1u);
  EXPECT_EQ(status(gan)["dropped"], 1);
  EXPECT_EQ(gan.post_feedback(request("c", feedback(gan, 0, 2))).code, CoapCode::kConflict);
}

TEST(GanCoordinator, WithKBatchesEachWorkerGetsItsOwnPairAndSwapsFormOneCycle) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  auto o = options_for(dir, clock, 3, 3);
  o.swap_every = 2;
  GanCoordinator gan(o);
  const std::vector<std::string> names = {"a", "b", "c"};
  std::vector<transport::GanBatches> got;
  for (const auto& n : names) got.push_back(batches_for(gan, n));
  // Worker n: X_g = X_(n mod k), X_d = X_((n+1) mod k).
  for (int n = 0; n < 3; n++) {
    EXPECT_EQ(got[n].d_samples, got[(n + 1) % 3].g_samples);
    EXPECT_NE(got[n].g_samples, got[n].d_samples);
    EXPECT_EQ(got[n].swap_round, 0u);
  }
  run_iteration(gan, names);
  run_iteration(gan, names);
  ASSERT_EQ(gan.iteration(), 2u);
  std::set<std::string> receivers;
  std::string at = "a";
  for (int hop = 0; hop < 3; hop++) {  // following swap_to from a visits every worker once
    const auto b = batches_for(gan, at);
    EXPECT_EQ(b.swap_round, 1u);
    EXPECT_NE(b.swap_to, at);
    receivers.insert(b.swap_to);
    at = b.swap_to;
  }
  EXPECT_EQ(receivers.size(), 3u);
  EXPECT_EQ(at, "a");
}

TEST(GanCoordinator, RecoveryReplaysTheLoggedStepsBitForBit) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  const std::vector<std::string> names = {"a", "b"};
  std::vector<float> params, m;
  std::uint64_t run = 0;
  {
    GanCoordinator gan(options_for(dir, clock, 2));
    for (int i = 0; i < 7; i++)
      run_iteration(gan, names);  // a checkpoint at 3 and 6, one step logged after
    params = gan.generator().params;
    m = gan.generator().adam.m;
    run = gan.run_id();
  }  // no checkpoint at exit: as after kill -9
  {
    GanCoordinator gan(options_for(dir, clock, 2));
    EXPECT_EQ(gan.iteration(), 7u);
    EXPECT_EQ(gan.recovery().checkpoint_iteration, 6u);
    EXPECT_EQ(gan.recovery().replayed, 1u);
    EXPECT_EQ(gan.generator().params, params);
    EXPECT_EQ(gan.generator().adam.m, m);
    EXPECT_EQ(gan.generator().adam.steps, 7u);
    EXPECT_EQ(gan.run_id(), run);
    run_iteration(gan, names);  // and it goes on
    EXPECT_EQ(gan.iteration(), 8u);
  }
  // A torn last record (a crash inside the append) is cut off: iteration 8 is lost, 7 stays.
  {
    std::ofstream wal(dir.path() / "gan" / "gan.wal", std::ios::app | std::ios::binary);
    wal << "torn";
  }
  {
    GanCoordinator gan(options_for(dir, clock, 2));
    EXPECT_EQ(gan.iteration(), 8u);
  }
  // Other settings on the same state: refused, nothing overwritten.
  auto other = options_for(dir, clock, 2);
  other.gan.seed = 10;
  EXPECT_THROW(GanCoordinator{other}, server::GanStateError);
  EXPECT_EQ(GanCoordinator(options_for(dir, clock, 2)).iteration(), 8u);
}

// A record damaged in the middle of gan.wal: recovery refuses the log and changes nothing;
// `repair-wal --skip-damaged` (repair_wal with gan_wal_placeholder()) puts an iteration
// closed without a step in its place, and the server replays to the same iteration count.
TEST(GanCoordinator, ADamagedIterationIsSkippedByRepairAsOneWithoutAStep) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  auto options = options_for(dir, clock, 2);
  options.checkpoint_every = 100;  // every iteration stays in the log
  {
    GanCoordinator gan(options);
    for (int i = 0; i < 8; i++) run_iteration(gan, {"a", "b"});
  }
  const auto wal = dir.path() / "gan" / "gan.wal";
  const auto size = std::filesystem::file_size(wal);
  const std::uintmax_t record = (size - 32) / 8;  // eight step records of one size
  ASSERT_EQ(32 + 8 * record, size);
  {
    std::fstream f(wal, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(32 + 3 * record + record / 2));  // iteration 4's values
    f.put('\x5a');
  }
  try {
    GanCoordinator refused(options);
    ADD_FAILURE() << "a damaged gan.wal was replayed";
  } catch (const server::GanStateError& e) {
    EXPECT_NE(std::string(e.what()).find("repair-wal --state-dir"), std::string::npos) << e.what();
  }
  const auto listed = server::repair_wal(wal, server::WalRepairChoice::kListOnly, server::gan_wal_placeholder());
  EXPECT_TRUE(listed.damaged);
  EXPECT_FALSE(listed.changed);
  const auto repaired =
      server::repair_wal(wal, server::WalRepairChoice::kSkipDamaged, server::gan_wal_placeholder());
  ASSERT_TRUE(repaired.changed);
  EXPECT_NE(repaired.report.back().find("gan.wal.damaged"), std::string::npos) << repaired.report.back();
  bool said = false;
  for (const std::string& line : repaired.report)
    said = said || line.find("added 1 iterations closed without a step") != std::string::npos;
  EXPECT_TRUE(said);
  GanCoordinator gan(options);
  EXPECT_EQ(gan.iteration(), 8u);
  EXPECT_EQ(gan.recovery().replayed, 8u);
  EXPECT_EQ(gan.recovery().replayed_refused, 1u);
  EXPECT_EQ(gan.generator().adam.steps, 7u);
  run_iteration(gan, {"a", "b"});  // and it goes on
  EXPECT_EQ(gan.iteration(), 9u);
}

// ---- Bad feedback (issue 37) ----

// A feedback of ±v (alternating signs), fp32: what the attacker of issue 37 posted.
std::vector<std::uint8_t> poisoned(const GanCoordinator& gan, std::uint64_t iteration, float v) {
  transport::GanFeedback f{
      .run_id = gan.run_id(), .iteration = iteration, .batch = kBatch, .width = 784, .values = {}};
  for (int i = 0; i < kBatch * 784; i++) f.values.push_back(i % 2 ? -v : v);
  return transport::encode_gan_feedback(f, transport::ValueEncoding::kFp32).value();
}

bool finite(const std::vector<float>& values) {
  for (const float v : values)
    if (!std::isfinite(v)) return false;
  return true;
}

void expect_finite_state(const GanCoordinator& gan) {
  EXPECT_TRUE(finite(gan.generator().params));
  EXPECT_TRUE(finite(gan.generator().adam.m));
  EXPECT_TRUE(finite(gan.generator().adam.v));
}

// Three iterations: a and b answer honestly, c (the attacker, a valid identity with a slot)
// posts `attack` for each; refused (`expected` 4.22), the iteration closes at its deadline
// without c; accepted (2.04), when b answers.
void attacked_iterations(GanCoordinator& gan, Clock& clock, float attack, int expected) {
  for (int n = 0; n < 3; n++) {
    const std::uint64_t i = gan.iteration();
    for (const char* w : {"a", "b", "c"}) batches_for(gan, w);
    const auto answer = gan.post_feedback(request("c", poisoned(gan, i, attack)));
    EXPECT_EQ(answer.code, expected) << std::string(answer.payload.begin(), answer.payload.end());
    gan.post_feedback(request("a", feedback(gan, i, 0)));
    gan.post_feedback(request("b", feedback(gan, i, 1)));
    if (expected != CoapCode::kChanged) {  // else all three answered
      clock.now += std::chrono::seconds(6);
      EXPECT_TRUE(gan.poll());
    }
    EXPECT_EQ(gan.iteration(), i + 1);
  }
}

// The same iterations with c silent: what an attacked run must equal, bit for bit.
void honest_iterations(GanCoordinator& gan, Clock& clock) {
  for (int n = 0; n < 3; n++) {
    const std::uint64_t i = gan.iteration();
    for (const char* w : {"a", "b", "c"}) batches_for(gan, w);
    gan.post_feedback(request("a", feedback(gan, i, 0)));
    gan.post_feedback(request("b", feedback(gan, i, 1)));
    clock.now += std::chrono::seconds(6);
    EXPECT_TRUE(gan.poll());
  }
}

// Issue 37: ±3.4e38 from one worker was acknowledged three times and made G and Adam NaN
// (and GET /gan/batches served NaN); ±1e30 made 721,168 of Adam's 721,680 second moments
// infinite. Both are now refused with 4.22 before they are counted: the generator goes on
// exactly as if the attacker had been silent, and its state stays finite.
TEST(GanBadFeedback, HugeValuesAreRefusedAndTheRunGoesOnAsWithoutThem) {
  for (const float attack : {3.4e38f, 1e30f}) {
    TempDir dir("edgetrain-gan"), reference_dir("edgetrain-gan");
    Clock clock, reference_clock;
    GanCoordinator gan(options_for(dir, clock, 3));
    GanCoordinator reference(options_for(reference_dir, reference_clock, 3));
    attacked_iterations(gan, clock, attack, CoapCode::kUnprocessableEntity);
    honest_iterations(reference, reference_clock);
    expect_finite_state(gan);
    EXPECT_EQ(gan.generator().params, reference.generator().params) << attack;
    EXPECT_EQ(gan.generator().adam.m, reference.generator().adam.m);
    EXPECT_EQ(gan.generator().adam.v, reference.generator().adam.v);
    const auto batches = batches_for(gan, "a");  // finite samples (the decoder insists)
    EXPECT_EQ(batches.g_samples.size(), std::size_t{kBatch} * 784);
    const auto s = status(gan);
    EXPECT_EQ(s["out_of_bounds_refused"], 3);
    EXPECT_EQ(s["feedbacks"], 6);
    EXPECT_EQ(s["steps_refused"], 0);
    EXPECT_EQ(s["devices_refused"]["c"]["out_of_bounds"], 3);
    EXPECT_EQ(s["devices_refused"]["c"]["consecutive_bad"], 3);
    EXPECT_EQ(s["devices_refused"]["c"]["reported"], true);
    EXPECT_FALSE(s["devices_refused"].contains("a"));
  }
}

TEST(GanBadFeedback, TheRefusalSaysWhyAndNonFiniteValuesGet422Too) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  GanCoordinator gan(options_for(dir, clock, 2));
  batches_for(gan, "a");
  const auto before = gan.generator().params;
  auto answer = gan.post_feedback(request("a", poisoned(gan, 0, 1e30f)));
  EXPECT_EQ(answer.code, CoapCode::kUnprocessableEntity);
  const std::string why(answer.payload.begin(), answer.payload.end());
  EXPECT_NE(why.find("value 0 is 1e+30, beyond the bound of ±1000 (--gan-max-feedback)"),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
  // A NaN (fp32 bits patched in: the encoder would not write one): 4.22, not 4.00.
  auto nan = feedback(gan, 0, 0);
  const std::uint32_t bits = 0x7fc00000u;
  std::memcpy(nan.data() + nan.size() - 4, &bits, 4);
  answer = gan.post_feedback(request("a", nan));
  EXPECT_EQ(answer.code, CoapCode::kUnprocessableEntity);
  // fp16 clamps at 65504: still beyond a bound below it.
  auto o = options_for(dir, clock, 2);
  transport::GanFeedback half{.run_id = gan.run_id(),
                              .iteration = 0,
                              .batch = kBatch,
                              .width = 784,
                              .values = std::vector<float>(kBatch * 784, 3.4e38f)};
  answer = gan.post_feedback(
      request("a", transport::encode_gan_feedback(half, transport::ValueEncoding::kFp16).value()));
  EXPECT_EQ(answer.code, CoapCode::kUnprocessableEntity);
  // The largest honest-looking value passes; the refusals changed nothing and were not counted.
  EXPECT_EQ(gan.post_feedback(request("a", poisoned(gan, 0, 999.0f))).code, CoapCode::kChanged);
  EXPECT_EQ(gan.generator().params, before);
  const auto s = status(gan);
  EXPECT_EQ(s["out_of_bounds_refused"], 3);
  EXPECT_EQ(s["feedbacks"], 1);
  EXPECT_EQ(s["answered_this_iteration"], 1);
  EXPECT_EQ(s["devices_refused"]["a"]["consecutive_bad"], 0);  // the accepted one ended the run
  EXPECT_EQ(s["devices_refused"]["a"]["out_of_bounds"], 3);
}

// Nothing a refused feedback carried reaches gan.wal: a restart after the attacks of issue
// 37 replays to the same finite generator, bit for bit.
TEST(GanBadFeedback, ARestartAfterTheAttacksReplaysTheSameFiniteGenerator) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  std::vector<float> params, m, v;
  {
    auto o = options_for(dir, clock, 3);
    o.checkpoint_every = 100;  // everything in the log
    GanCoordinator gan(o);
    attacked_iterations(gan, clock, 3.4e38f, CoapCode::kUnprocessableEntity);
    attacked_iterations(gan, clock, 1e30f, CoapCode::kUnprocessableEntity);
    params = gan.generator().params;
    m = gan.generator().adam.m;
    v = gan.generator().adam.v;
  }  // no checkpoint at exit: as after kill -9
  auto o = options_for(dir, clock, 3);
  o.checkpoint_every = 100;
  GanCoordinator gan(o);
  EXPECT_EQ(gan.iteration(), 6u);
  EXPECT_EQ(gan.recovery().replayed, 6u);
  EXPECT_EQ(gan.recovery().replayed_refused, 0u);
  EXPECT_EQ(gan.generator().params, params);
  EXPECT_EQ(gan.generator().adam.m, m);
  EXPECT_EQ(gan.generator().adam.v, v);
  expect_finite_state(gan);
}

// The step check behind the value check: with the bound raised out of the way, the same
// feedbacks reach the step, which would leave G or Adam non-finite; the step is refused as a
// whole (G and Adam unchanged), the iteration closes without it, the log says so and replay
// does the same. The honest workers are not stalled: the next iteration opens.
TEST(GanBadFeedback, AStepThatWouldBeNonFiniteIsRefusedAndReplayedAsRefused) {
  for (const float attack : {3.4e38f, 1e30f}) {
    TempDir dir("edgetrain-gan");
    Clock clock;
    auto o = options_for(dir, clock, 3);
    o.max_feedback_magnitude = std::numeric_limits<float>::max();
    o.checkpoint_every = 100;
    std::vector<float> params, m, v;
    {
      GanCoordinator gan(o);
      run_iteration(gan, {"a", "b", "c"});
      const auto before = gan.generator().params;
      const auto steps = gan.generator().adam.steps;
      attacked_iterations(gan, clock, attack, CoapCode::kChanged);  // accepted, then refused
      EXPECT_EQ(gan.iteration(), 4u);
      EXPECT_EQ(gan.generator().params, before) << attack;
      EXPECT_EQ(gan.generator().adam.steps, steps);
      expect_finite_state(gan);
      EXPECT_EQ(status(gan)["steps_refused"], 3);
      run_iteration(gan, {"a", "b", "c"});  // honest again: a step
      EXPECT_EQ(gan.iteration(), 5u);
      EXPECT_NE(gan.generator().params, before);
      params = gan.generator().params;
      m = gan.generator().adam.m;
      v = gan.generator().adam.v;
    }
    GanCoordinator gan(o);
    EXPECT_EQ(gan.iteration(), 5u);
    EXPECT_EQ(gan.recovery().replayed, 5u);
    EXPECT_EQ(gan.recovery().replayed_refused, 3u);
    EXPECT_EQ(gan.generator().params, params);
    EXPECT_EQ(gan.generator().adam.m, m);
    EXPECT_EQ(gan.generator().adam.v, v);
  }
}

// A log written before these checks (main's: the poisoned step logged as #gan-step) no
// longer replays into NaN: that step is replayed as an iteration without a step.
TEST(GanBadFeedback, APoisonedStepInAnOlderLogIsReplayedWithoutItsStep) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  std::vector<float> fresh;
  std::uint64_t run = 0;
  {
    GanCoordinator gan(options_for(dir, clock, 1));
    fresh = gan.generator().params;
    run = gan.run_id();
  }
  std::vector<float> averaged(kBatch * 784);
  for (std::size_t i = 0; i < averaged.size(); i++) averaged[i] = i % 2 ? -3.4e38f : 3.4e38f;
  std::vector<std::uint8_t> body(averaged.size() * 4);
  std::memcpy(body.data(), averaged.data(), body.size());
  server::WalWriter::replace(
      dir.path() / "gan" / "gan.wal", server::WalHeader{.model_id = run},
      std::vector<server::WalRecord>{
          {.version = 1, .identity = server::kGanStepIdentity, .sequence = 1, .update = body, .entry_delays = {}}});
  GanCoordinator gan(options_for(dir, clock, 1));
  EXPECT_EQ(gan.iteration(), 1u);
  EXPECT_EQ(gan.recovery().replayed_refused, 1u);
  EXPECT_EQ(gan.generator().params, fresh);
  expect_finite_state(gan);
  batches_for(gan, "a");  // finite batches
}

// Quarantine (the server's --quarantine-after / --quarantine-seconds): after 2 bad feedbacks
// in a row the device gets 4.03 on both resources, and the iteration no longer waits for it.
TEST(GanBadFeedback, ADeviceIsQuarantinedAndNotWaitedFor) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  auto o = options_for(dir, clock, 3);
  o.quarantine_after = 2;
  o.quarantine_seconds = 30;
  GanCoordinator gan(o);
  for (const char* w : {"a", "b", "c"}) batches_for(gan, w);
  EXPECT_EQ(gan.post_feedback(request("c", poisoned(gan, 0, 1e30f))).code,
            CoapCode::kUnprocessableEntity);
  const auto second = gan.post_feedback(request("c", poisoned(gan, 0, 1e30f)));
  EXPECT_EQ(second.code, CoapCode::kUnprocessableEntity);
  EXPECT_NE(std::string(second.payload.begin(), second.payload.end()).find("QUARANTINED for 30 s"),
            std::string::npos);
  const auto third = gan.post_feedback(request("c", feedback(gan, 0, 2)));
  EXPECT_EQ(third.code, CoapCode::kForbidden);
  EXPECT_NE(std::string(third.payload.begin(), third.payload.end()).find("quarantined"),
            std::string::npos);
  EXPECT_EQ(gan.get_batches(request("c")).code, CoapCode::kForbidden);
  gan.post_feedback(request("a", feedback(gan, 0, 0)));
  EXPECT_EQ(gan.post_feedback(request("b", feedback(gan, 0, 1))).code, CoapCode::kChanged);
  EXPECT_EQ(gan.iteration(), 1u);  // closed at once, not at the deadline
  auto s = status(gan);
  EXPECT_EQ(s["quarantine_refused"], 2);
  EXPECT_EQ(s["devices_refused"]["c"]["quarantined"], true);
  EXPECT_EQ(s["devices_refused"]["c"]["quarantines"], 1);
  EXPECT_EQ(s["dropped"], 1);
  clock.now += std::chrono::seconds(31);  // the quarantine ends
  batches_for(gan, "c");
  EXPECT_EQ(gan.post_feedback(request("c", feedback(gan, 1, 2))).code, CoapCode::kChanged);
  s = status(gan);
  EXPECT_EQ(s["devices_refused"]["c"]["quarantined"], false);
  EXPECT_EQ(s["devices_refused"]["c"]["consecutive_bad"], 0);
}

// A generator that is non-finite anyway (a bug; a state from before the checks) is never
// served: GET /gan/batches answers 5.00 with the reason, and the step that follows is refused.
TEST(GanBadFeedback, NonFiniteSamplesAreNotSent) {
  TempDir dir("edgetrain-gan");
  Clock clock;
  GanCoordinator gan(options_for(dir, clock, 1));
  batches_for(gan, "a");
  std::fill(gan.generator().params.begin(), gan.generator().params.end(),
            std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(gan.post_feedback(request("a", feedback(gan, 0, 0))).code, CoapCode::kChanged);
  EXPECT_EQ(gan.iteration(), 1u);
  const auto answer = gan.get_batches(request("a"));
  EXPECT_EQ(answer.code, CoapCode::kInternalServerError);
  const std::string why(answer.payload.begin(), answer.payload.end());
  EXPECT_NE(why.find("not finite"), std::string::npos) << why;
  const auto s = status(gan);
  EXPECT_EQ(s["steps_refused"], 1);
  EXPECT_EQ(s["batches_not_encodable"], 1);
}

}  // namespace

namespace {

// Per-device norm clipping (--gan-clip-feedback, issue 37): a feedback within the value bound
// but of a large norm is scaled to the norm before it is summed; the generator then goes on
// exactly as if the device had sent the clipped feedback, and a restart replays it bit for
// bit without the option (the log holds the averaged, clipped feedback).
TEST(GanBadFeedback, ClippedFeedbackActsAsTheClippedValuesAndReplaysWithoutTheOption) {
  TempDir dir("edgetrain-gan"), reference_dir("edgetrain-gan");
  Clock clock, reference_clock;
  auto o = options_for(dir, clock, 3);
  o.clip_feedback_norm = 1.0;
  o.checkpoint_every = 100;  // everything in the log
  // What clipping makes of ±999: the same arithmetic as the server's (double, then float).
  double squares = 0;
  for (int i = 0; i < kBatch * 784; i++) squares += 999.0 * 999.0;
  const auto clipped = static_cast<float>(999.0 * (1.0 / std::sqrt(squares)));
  std::vector<float> params;
  {
    GanCoordinator gan(o);
    GanCoordinator reference(options_for(reference_dir, reference_clock, 3));
    attacked_iterations(gan, clock, 999.0f, CoapCode::kChanged);
    attacked_iterations(reference, reference_clock, clipped, CoapCode::kChanged);
    EXPECT_EQ(gan.generator().params, reference.generator().params);
    EXPECT_EQ(gan.generator().adam.v, reference.generator().adam.v);
    const auto s = status(gan);
    EXPECT_EQ(s["feedbacks_clipped"], 3) << "the honest feedbacks are below the norm";
    EXPECT_EQ(s["devices_refused"]["c"]["clipped"], 3);
    EXPECT_EQ(s["devices_refused"]["c"]["out_of_bounds"], 0);
    params = gan.generator().params;
  }
  auto restarted = options_for(dir, clock, 3);
  restarted.checkpoint_every = 100;  // no clipping now
  GanCoordinator gan(restarted);
  EXPECT_EQ(gan.recovery().replayed, 3u);
  EXPECT_EQ(gan.generator().params, params);
  EXPECT_THROW(
      [&] {
        auto bad = options_for(dir, clock, 3);
        bad.clip_feedback_norm = -1;
        server::check_gan_server_options(bad);
      }(),
      std::invalid_argument);
}

}  // namespace
