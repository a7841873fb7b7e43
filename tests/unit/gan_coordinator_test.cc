// MD-GAN on the server (server/gan_coordinator.h) without a network: batches by slot, the
// barrier with its deadline, refusals that change nothing, discriminator swap cycles, and
// recovery after a crash: the newest checkpoint plus the logged steps give G bit for bit.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
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

}  // namespace
