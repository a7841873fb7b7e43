// The MD-GAN worker (worker/gan_worker.h) against the real server side
// (server/gan_coordinator.h) in one process: channels that call the coordinator and the peers'
// handlers directly stand in for CoAP/DTLS. Three workers train and swap discriminators along
// the server's cycles; a discriminator that is not a peer's or not of this architecture is
// refused and changes nothing.
#include "worker/gan_worker.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <mutex>
#include <thread>

#include "server/gan_coordinator.h"
#include "tests/support/served_resources.h"
#include "transport/codec.h"

namespace {

using namespace edgetrain;
using transport::CoapCode;
using transport::CoapRequest;
using transport::CoapResponse;

constexpr int kBatch = 4;

// Random grey digits of 10 classes: enough for the discriminator's steps to run.
runtime::Dataset noise_digits() {
  runtime::Dataset d;
  d.height = d.width = 28;
  d.channels = 1;
  d.num_classes = 10;
  runtime::SplitMix64 bits{5};
  for (int i = 0; i < 120; i++) {
    d.labels.push_back(i % 10);
    for (int p = 0; p < 784; p++) d.pixels.push_back(static_cast<std::uint8_t>(bits.next() & 0xff));
  }
  return d;
}

// The server's handlers behind a lock, as the serving thread would call them.
class CoordinatorChannel : public runtime::ServerChannel {
 public:
  CoordinatorChannel(server::GanCoordinator& gan, std::mutex& mutex, std::string identity)
      : gan_(gan), mutex_(mutex), identity_(std::move(identity)) {}
  CoapResponse get_model(const std::string&) override { return {CoapCode::kNotFound}; }
  CoapResponse post_update(std::span<const std::uint8_t>) override { return {CoapCode::kNotFound}; }
  CoapResponse request(transport::Method method, const std::string& path,
                       std::span<const std::uint8_t> body) override {
    std::lock_guard lock(mutex_);
    CoapRequest r;
    r.method = method;
    r.identity = identity_;
    r.authentication = transport::PeerAuthentication::kCertificate;
    r.payload = body;
    if (path == "gan/batches") return gan_.get_batches(r);
    if (path == "gan/feedback") return gan_.post_feedback(r);
    return {CoapCode::kNotFound};
  }

 private:
  server::GanCoordinator& gan_;
  std::mutex& mutex_;
  std::string identity_;
};

// A peer's POST reaches the other worker's handler with this peer's identity.
class PeerRouter : public runtime::PeerChannel {
 public:
  PeerRouter(std::vector<std::unique_ptr<runtime::GanWorker>>& workers, std::string self)
      : workers_(workers), self_(std::move(self)) {}
  CoapResponse request(std::uint32_t neighbour, transport::Method method, const std::string&,
                       std::span<const std::uint8_t> body) override {
    CoapRequest r;
    r.method = method;
    r.identity = self_;
    r.authentication = transport::PeerAuthentication::kCertificate;
    r.payload = body;
    return workers_.at(neighbour)->post_discriminator(r);
  }

 private:
  std::vector<std::unique_ptr<runtime::GanWorker>>& workers_;
  std::string self_;
};

struct Fleet {
  explicit Fleet(const edgetrain::testing::TempDir& dir, std::uint32_t swap_every,
                 float max_feedback = server::kDefaultMaxGanFeedbackMagnitude) {
    server::GanServerOptions o;
    o.max_feedback_magnitude = max_feedback;
    o.gan.batch = kBatch;
    o.gan.backend = runtime::KernelBackend::kReference;
    o.workers = 3;
    o.deadline_seconds = 30;
    o.swap_every = swap_every;
    o.directory = dir.path() / "gan";
    gan = std::make_unique<server::GanCoordinator>(o);
    topology = runtime::make_topology(runtime::TopologyKind::kFull, 3, 2, 1, "gan-");
    for (std::uint32_t n = 0; n < 3; n++) {
      const std::string name = "gan-" + std::to_string(n);
      servers.push_back(std::make_unique<CoordinatorChannel>(*gan, mutex, name));
      peers.push_back(std::make_unique<PeerRouter>(workers, name));
      runtime::GanWorkerConfig c;
      c.worker.worker_id = n;
      c.worker.worker_count = 3;
      c.worker.backoff_initial = std::chrono::milliseconds(1);
      c.worker.backoff_max = std::chrono::milliseconds(5);
      c.gan.batch = kBatch;
      c.gan.backend = runtime::KernelBackend::kReference;
      c.poll_seconds = 0.001;
      c.swap_wait_seconds = 20;
      workers.push_back(std::make_unique<runtime::GanWorker>(c, data, *servers[n], peers[n].get(),
                                                             &topology, stop));
    }
  }
  runtime::Dataset data = noise_digits();
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::unique_ptr<server::GanCoordinator> gan;
  runtime::GossipTopology topology;
  std::vector<std::unique_ptr<CoordinatorChannel>> servers;
  std::vector<std::unique_ptr<PeerRouter>> peers;
  std::vector<std::unique_ptr<runtime::GanWorker>> workers;
};

TEST(GanWorker, ThreeWorkersTrainTheServersGeneratorAndSwapDiscriminatorsAlongItsCycles) {
  edgetrain::testing::TempDir dir("edgetrain-gan-worker");
  Fleet fleet(dir, 3);
  const auto g_before = fleet.gan->generator().params;
  std::vector<std::vector<float>> d_before;
  for (auto& w : fleet.workers) d_before.push_back(w->discriminator().params);
  std::vector<std::thread> threads;
  for (auto& w : fleet.workers)
    threads.emplace_back([&w] {
      while (w->stats().iterations < 7) w->run_once();
    });
  for (auto& t : threads) t.join();
  EXPECT_GE(fleet.gan->iteration(), 7u);
  EXPECT_NE(fleet.gan->generator().params, g_before);
  for (std::size_t n = 0; n < 3; n++) {
    const auto s = fleet.workers[n]->stats();
    EXPECT_EQ(s.iterations, 7u);
    EXPECT_EQ(s.swaps_sent, 2u) << "worker " << n;  // swap rounds at iterations 3 and 6
    EXPECT_EQ(s.swaps_received, 2u) << "worker " << n;
    EXPECT_EQ(s.swaps_missed, 0u);
    EXPECT_EQ(s.peer_requests_refused, 0u);
    EXPECT_EQ(s.peer_bytes_sent, s.peer_bytes_received);
    EXPECT_EQ(s.bytes_sent,
              7u * (32 + kBatch * 784 * 4));  // the feedback: header and b·d fp32 values
    EXPECT_NE(fleet.workers[n]->discriminator().params, d_before[n]);
  }
}

TEST(GanWorker, ADiscriminatorNotFromAPeerOrOfAnotherArchitectureIsRefusedAndChangesNothing) {
  edgetrain::testing::TempDir dir("edgetrain-gan-worker");
  Fleet fleet(dir, 0);
  runtime::GanWorker& w = *fleet.workers[0];
  const auto before = w.discriminator().params;
  const auto& model = w.discriminator().model();
  std::vector<std::uint32_t> sizes;
  for (const auto& t : model.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
  const auto good = transport::encode_dense_model(model.layout_id(), 1, sizes, before).value();
  auto post = [&](const std::string& identity, std::span<const std::uint8_t> body) {
    CoapRequest r;
    r.method = transport::Method::kPost;
    r.identity = identity;
    r.authentication = transport::PeerAuthentication::kCertificate;
    r.payload = body;
    return w.post_discriminator(r).code;
  };
  EXPECT_EQ(post("stranger", good), CoapCode::kForbidden);
  std::vector<std::uint32_t> other_sizes = sizes;
  other_sizes.back() += 1;
  std::vector<float> other_values(before.size() + 1, 0.0f);
  EXPECT_EQ(post("gan-1",
                 transport::encode_dense_model(model.layout_id() + 1, 1, other_sizes, other_values)
                     .value()),
            CoapCode::kBadRequest);
  EXPECT_EQ(post("gan-1", std::span(good).first(good.size() - 3)), CoapCode::kBadRequest);
  EXPECT_EQ(
      post("gan-1", transport::encode_dense_model(model.layout_id(), 0, sizes, before).value()),
      CoapCode::kBadRequest);  // round 0 is no swap round
  EXPECT_EQ(w.stats().peer_requests_refused, 4u);
  EXPECT_EQ(w.stats().peer_bytes_received, 0u);
  EXPECT_EQ(w.discriminator().params, before);
  EXPECT_EQ(post("gan-1", good),
            CoapCode::kChanged);  // a peer's, of this architecture: kept for round 1
  EXPECT_EQ(w.stats().peer_bytes_received, good.size());
}

// Issue 37: a feedback the server refuses as out of bounds (4.22) is not retried for that
// iteration and does not end the worker; it is counted and the worker waits for the next.
TEST(GanWorker, AFeedbackRefusedAsOutOfBoundsIsCountedAndTheWorkerWaitsForTheNextIteration) {
  edgetrain::testing::TempDir dir("edgetrain-gan-worker");
  Fleet fleet(dir, 0, 1e-12f);  // a bound no real feedback stays within
  runtime::GanWorker& w = *fleet.workers[0];
  EXPECT_FALSE(w.run_once());
  auto s = w.stats();
  EXPECT_EQ(s.feedbacks_out_of_bounds, 1u);
  EXPECT_EQ(s.iterations, 0u);
  EXPECT_EQ(s.retries, 0u);
  EXPECT_FALSE(w.run_once());  // the same iteration again: not trained on or sent twice
  s = w.stats();
  EXPECT_EQ(s.feedbacks_out_of_bounds, 1u);
  EXPECT_EQ(s.bytes_sent, 32u + kBatch * 784 * 4);
  EXPECT_EQ(nlohmann::json::parse(fleet.gan->status_json())["out_of_bounds_refused"], 1);
}

}  // namespace
