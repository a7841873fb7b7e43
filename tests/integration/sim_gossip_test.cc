// Gossip training in the simulator (sim/gossip_simulation.h): a small MLP fleet on a ring
// must learn with D-PSGD and AD-PSGD; Metropolis mixing must keep the peers' mean model
// where it was; compressed gossip must send far fewer bytes than dense; balancing must
// bring slow and fast peers' compute times together and shorten the run; accuracy-aware
// training must stop peers and save steps; a run must be reproducible from its seed; and a
// malicious peer's 1e30 bias must be refused by its honest neighbours (issue 37).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/model.h"
#include "model/trainer.h"
#include "sim/gossip_simulation.h"
#include "server/evaluator.h"
#include "tests/integration/sim_test_data.h"

namespace {

using namespace edgetrain;

const edgetrain::testing::SimMnist& mnist() { return edgetrain::testing::sim_mnist(); }

// The first `count` examples of `data`: the set an evaluation of eval_examples scores.
runtime::Dataset first_examples(const runtime::Dataset& data, std::size_t count) {
  runtime::Dataset head = data;
  head.pixels.resize(count * data.image_bytes());
  head.labels.resize(count);
  return head;
}

sim::GossipConfig ring_config() {
  sim::GossipConfig c;
  c.model = "mlp";
  c.peers = 6;
  c.batch = 10;
  c.learning_rate = 0.05f;
  c.topology_kind = runtime::TopologyKind::kRing;
  c.max_iterations = 100;
  c.eval_every = 50;
  c.eval_examples = 500;
  c.seed = 5;
  return c;
}

// 8 peers in the four speed classes of the experiments (peer i in class i mod 4).
sim::GossipConfig four_class_ring_config() {
  sim::GossipConfig c = ring_config();
  c.peers = 8;
  c.speed_classes = {0.12, 0.08, 0.05, 0.03};
  c.eval_every = 100;
  return c;
}

TEST(SimGossip, DpsgdRingLearns) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  const auto r = sim::run_gossip_simulation(ring_config(), data.train, data.test, "d-psgd");
  ASSERT_EQ(r.curve.size(), 3u) << "at the start, after 50 and after 100 iterations";
  EXPECT_LT(r.curve.front().mean_accuracy, 0.3);
  EXPECT_GT(r.curve.back().mean_accuracy, 0.8) << "100 iterations of 6 peers x batch 10";
  EXPECT_GT(r.curve.back().min_accuracy, 0.75);
  EXPECT_GT(r.curve.back().consensus_accuracy, 0.8);
  EXPECT_DOUBLE_EQ(r.mean_iterations, 100.0);
  EXPECT_EQ(r.local_steps, 600u);
  // No speed classes, jitter 0.1: a peer waits for the slower of its neighbours each
  // iteration, so 100 iterations take a little more than 100 step times.
  EXPECT_GT(r.virtual_time, 100.0);
  EXPECT_LT(r.virtual_time, 130.0);
  // Dense: every peer sends its model to both ring neighbours every iteration.
  EXPECT_EQ(r.exchanges, 6u * 2u * 100u);
  EXPECT_GT(r.bytes_per_peer, 0);
  EXPECT_DOUBLE_EQ(r.curve.back().bytes_per_peer, r.bytes_per_peer);
}

TEST(SimGossip, AdpsgdRingLearnsAndCountsDenseModelsBothWays) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = ring_config();
  c.algorithm = sim::GossipAlgorithm::kAdpsgd;
  c.speed_classes = {2, 1};  // half the peers twice as fast: no barrier holds them back
  const auto r = sim::run_gossip_simulation(c, data.train, data.test, "ad-psgd");
  EXPECT_GT(r.curve.back().mean_accuracy, 0.8);
  EXPECT_GT(r.curve.back().consensus_accuracy, 0.8);
  EXPECT_DOUBLE_EQ(r.mean_iterations, 100.0);
  EXPECT_EQ(r.local_steps, 600u);
  EXPECT_EQ(r.exchanges, 600u) << "one averaging per local step";
  // Each averaging sends the dense model both ways.
  const double dense = r.bytes_per_peer * 6 / (2.0 * 600);
  EXPECT_DOUBLE_EQ(dense, std::floor(dense));
  // The fast peers (class 0) do more of the steps in the same time: about twice as many.
  ASSERT_EQ(r.classes.size(), 2u);
  EXPECT_NEAR(r.classes[0].compute_per_step * 2, r.classes[1].compute_per_step, 0.2);
  // 600 steps at 3 peers x 1 + 3 peers x 1/2 steps per step time: about 133 step times.
  EXPECT_NEAR(r.virtual_time, 600 / 4.5, 15);
}

// Issue 37: peer 0 publishes its model with a 1e30 output bias. With the default bound its
// neighbours refuse every copy (2 per iteration on the ring) and the honest peers learn as
// without it; with no bound it spreads into their models. AD-PSGD: refused both ways.
TEST(SimGossip, AMaliciousPeersHugeBiasIsRefusedByItsHonestNeighbours) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = ring_config();
  c.malicious_peers = 1;
  c.attack = sim::parse_model_attack("bias:1e30");
  const auto defended = sim::run_gossip_simulation(c, data.train, data.test, "bound");
  EXPECT_EQ(defended.neighbour_models_refused, 2u * 100u);
  EXPECT_LT(defended.honest_max_abs_parameter, 10);
  EXPECT_GT(defended.curve.back().mean_accuracy, 0.8);
  EXPECT_GT(defended.curve.back().min_accuracy, 0.75);
  c.max_neighbour_magnitude = 0;
  const auto open = sim::run_gossip_simulation(c, data.train, data.test, "no bound");
  EXPECT_EQ(open.neighbour_models_refused, 0u);
  EXPECT_GT(open.honest_max_abs_parameter, 1e20);
  c.max_neighbour_magnitude = runtime::kDefaultMaxNeighbourMagnitude;
  c.algorithm = sim::GossipAlgorithm::kAdpsgd;
  const auto asynchronous = sim::run_gossip_simulation(c, data.train, data.test, "ad-psgd");
  EXPECT_GT(asynchronous.neighbour_models_refused, 0u);
  EXPECT_LT(asynchronous.honest_max_abs_parameter, 10);
  EXPECT_THROW(sim::parse_model_attack("bias"), std::invalid_argument);
  EXPECT_THROW(sim::parse_model_attack("flip:1"), std::invalid_argument);
  EXPECT_THROW(sim::parse_model_attack("bias:1e40"), std::invalid_argument);
}

// Metropolis weights are doubly stochastic: mixing moves the peers toward each other and
// keeps their mean. With lr 0, no training changes that, so after 30 iterations from
// different initial models the mean over the peers is the initial mean (float rounding
// aside) and the peers are much closer to it than at the start; from equal models nothing
// moves at all.
TEST(SimGossip, DenseMixingKeepsTheMeanOfThePeersModels) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = ring_config();
  c.learning_rate = 0;
  c.max_iterations = 30;
  c.eval_every = 30;
  c.eval_examples = 100;
  c.keep_final_models = true;
  const auto same = sim::run_gossip_simulation(c, data.train, data.test, "equal starts");
  ASSERT_EQ(same.final_models.size(), 6u);
  runtime::Model reference(runtime::model_spec_from_argument("mlp"));
  reference.initialize(c.seed);
  for (const auto& model : same.final_models)
    EXPECT_TRUE(std::equal(model.begin(), model.end(), reference.parameters().begin()))
        << "every peer kept the start";

  c.distinct_initialisation = true;
  c.max_iterations = 1;
  const auto one = sim::run_gossip_simulation(c, data.train, data.test, "one iteration");
  c.max_iterations = 30;
  const auto thirty = sim::run_gossip_simulation(c, data.train, data.test, "thirty iterations");
  std::vector<double> initial_mean(reference.parameter_count(), 0.0);
  double initial_spread = 0;
  std::vector<std::vector<float>> starts;
  for (int i = 0; i < c.peers; ++i) {
    runtime::Model m(runtime::model_spec_from_argument("mlp"));
    m.initialize(c.seed + static_cast<std::uint64_t>(i));
    starts.emplace_back(m.parameters().begin(), m.parameters().end());
    for (std::size_t k = 0; k < initial_mean.size(); ++k)
      initial_mean[k] += m.parameters()[k] / 6.0;
  }
  for (const auto& s : starts)
    for (std::size_t k = 0; k < initial_mean.size(); ++k)
      initial_spread += std::pow(s[k] - initial_mean[k], 2);
  for (const auto* r : {&one, &thirty}) {
    double max_drift = 0, spread = 0;
    for (std::size_t k = 0; k < initial_mean.size(); ++k) {
      double mean = 0;
      for (const auto& model : r->final_models) mean += model[k] / 6.0;
      max_drift = std::max(max_drift, std::fabs(mean - initial_mean[k]));
      for (const auto& model : r->final_models) spread += std::pow(model[k] - mean, 2);
    }
    EXPECT_LT(max_drift, 1e-6) << r->label << ": the mean over the peers moved";
    // On a 6-ring every Metropolis weight is 1/3, so the mixing matrix's second largest
    // eigenvalue is 1/3 + 2/3 cos(2π/6) = 2/3: each iteration shrinks the spread around
    // the mean at least by (2/3)².
    const double bound = std::pow(2.0 / 3.0, 2.0 * r->mean_iterations);
    EXPECT_LE(spread, bound * initial_spread) << r->label;
  }
  EXPECT_LT(thirty.consensus_distance, 1e-4);
}

// CHOCO-style compressed gossip: each iteration a peer's neighbours get the 1% of its
// published model that changed most (at least 32 entries per tensor), not the whole model:
// 72 times fewer bytes here.
TEST(SimGossipLongRun, CompressedGossipSendsFarFewerBytesAndStillLearns) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = ring_config();
  const auto dense = sim::run_gossip_simulation(c, data.train, data.test, "dense");
  c.publish_fraction = 0.01;
  const auto compressed = sim::run_gossip_simulation(c, data.train, data.test, "compressed");
  EXPECT_EQ(compressed.exchanges, dense.exchanges);
  EXPECT_LT(compressed.bytes_per_peer * 20, dense.bytes_per_peer)
      << compressed.bytes_per_peer << " against " << dense.bytes_per_peer;
  // With the default γ (0.1) compressed gossip stays within a few points of dense here.
  EXPECT_GT(compressed.curve.back().mean_accuracy, dense.curve.back().mean_accuracy - 0.04);
  EXPECT_GT(compressed.curve.back().min_accuracy, 0.8);
}

// Four speed classes 4:1 apart on a ring: without balancing every peer waits for its
// slowest neighbour; with a target of 2 step times each peer sizes its batch to its speed,
// so compute times per iteration come together and the same iterations take less time.
TEST(SimGossip, BalancingEvensOutIterationTimesAndShortensTheRun) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = four_class_ring_config();
  const auto plain = sim::run_gossip_simulation(c, data.train, data.test, "plain");
  c.balance_target = 2;
  const auto balanced = sim::run_gossip_simulation(c, data.train, data.test, "balanced");
  ASSERT_EQ(plain.classes.size(), 4u);
  ASSERT_EQ(balanced.classes.size(), 4u);
  const double plain_ratio = plain.classes[3].compute_per_step / plain.classes[0].compute_per_step;
  const double balanced_ratio =
      balanced.classes[3].compute_per_step / balanced.classes[0].compute_per_step;
  EXPECT_NEAR(plain_ratio, 4.0, 0.4);
  EXPECT_LT(balanced_ratio, 1.5) << "slowest over fastest class's compute per iteration";
  EXPECT_GT(balanced.classes[0].mean_batch, balanced.classes[3].mean_batch * 2.5);
  EXPECT_LT(balanced.virtual_time, 0.7 * plain.virtual_time);
  EXPECT_LT(balanced.classes[0].wait_per_iteration, plain.classes[0].wait_per_iteration / 2)
      << "the fast peers wait far less for the slow ones";
  EXPECT_GT(balanced.curve.back().mean_accuracy, 0.8);
}

// Training while waiting (wait_steps): the fast classes fill their wait at the barrier with
// local steps, the slowest class, which nobody keeps waiting, takes none, and the run's pace
// stays the slowest class's.
TEST(SimGossipLongRun, WaitStepsFillTheFastPeersWaitAndLeaveTheSlowestAlone) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = four_class_ring_config();
  c.publish_fraction = 0.05;
  const auto plain = sim::run_gossip_simulation(c, data.train, data.test, "plain");
  c.wait_steps = 8;
  const auto waiting =
      sim::run_gossip_simulation(c, data.train, data.test, "training while waiting");
  ASSERT_EQ(waiting.classes.size(), 4u);
  EXPECT_DOUBLE_EQ(plain.classes[0].steps_per_iteration, 1.0);
  EXPECT_GT(waiting.classes[0].steps_per_iteration, 2.5)
      << "a 4x faster peer waits ~3 of its steps per iteration";
  EXPECT_DOUBLE_EQ(waiting.classes[3].steps_per_iteration, 1.0);
  EXPECT_LT(waiting.classes[0].wait_per_iteration, plain.classes[0].wait_per_iteration / 2);
  EXPECT_LT(waiting.virtual_time, 1.2 * plain.virtual_time)
      << "the barrier's pace is still the slowest class's";
  EXPECT_GT(waiting.local_steps, plain.local_steps * 3 / 2);
  EXPECT_GT(waiting.curve.back().mean_accuracy, 0.8);
  // AD-PSGD has no barrier to wait at.
  c.algorithm = sim::GossipAlgorithm::kAdpsgd;
  c.publish_fraction = 1;
  EXPECT_THROW(sim::check_gossip_config(c), std::invalid_argument);
}

// A speed schedule changes a class's budget from its time on: class 0 at half its budget
// from virtual time 20 takes twice as long per step from then on; the balancer follows it
// with smaller batches.
TEST(SimGossip, ASpeedScheduleSlowsItsClassFromItsTimeOn) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = ring_config();
  c.peers = 4;
  c.max_iterations = 60;
  c.eval_every = 60;
  c.eval_examples = 100;
  c.step_jitter = 0;
  c.speed_classes = {1, 1};
  const auto steady = sim::run_gossip_simulation(c, data.train, data.test, "steady");
  EXPECT_DOUBLE_EQ(steady.classes[0].compute_per_step, 1.0);
  EXPECT_DOUBLE_EQ(steady.virtual_time, 60.0);
  c.speed_schedule = sim::parse_speed_schedule("20:0:0.5");
  const auto slowed = sim::run_gossip_simulation(c, data.train, data.test, "slowed");
  // 20 iterations at 1, then 40 at 2 (the barrier holds class 1 back as well).
  EXPECT_DOUBLE_EQ(slowed.classes[0].compute_per_step, (20 + 40 * 2) / 60.0);
  EXPECT_DOUBLE_EQ(slowed.classes[1].compute_per_step, 1.0);
  EXPECT_DOUBLE_EQ(slowed.virtual_time, 20 + 40 * 2);
  c.balance_target = 1;
  const auto balanced = sim::run_gossip_simulation(c, data.train, data.test, "balanced");
  EXPECT_LT(balanced.classes[0].mean_batch, 8.0) << "batches of about 5 after the slow-down";
  EXPECT_LT(balanced.virtual_time, 70.0);
}

void expect_same_curves(const sim::GossipResult& a, const sim::GossipResult& b) {
  ASSERT_EQ(a.curve.size(), b.curve.size());
  for (std::size_t i = 0; i < a.curve.size(); ++i) {
    EXPECT_EQ(a.curve[i].time, b.curve[i].time);
    EXPECT_EQ(a.curve[i].mean_accuracy, b.curve[i].mean_accuracy);
    EXPECT_EQ(a.curve[i].consensus_accuracy, b.curve[i].consensus_accuracy);
    EXPECT_EQ(a.curve[i].mean_loss, b.curve[i].mean_loss);
    EXPECT_EQ(a.curve[i].bytes_per_peer, b.curve[i].bytes_per_peer);
  }
  EXPECT_EQ(a.consensus_parameters, b.consensus_parameters);
}

// Accuracy-aware training: with a short patience on each peer's small validation split,
// the plateau rule halves the learning rate, then stops peers, which keep mixing; the run
// takes fewer local steps than iterations and still learns.
TEST(SimGossip, AccuracyAwareTrainingStopsPeersAndSavesSteps) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = ring_config();
  c.max_iterations = 300;
  c.eval_every = 100;
  c.plateau_patience = 2;
  c.validate_every = 10;
  c.plateau_max_decays = 1;
  const auto r = sim::run_gossip_simulation(c, data.train, data.test, "accuracy-aware");
  EXPECT_EQ(r.validations, r.local_steps / 10)
      << "a validation every 10 iterations while a peer trains";
  EXPECT_GT(r.lr_decays, 0);
  EXPECT_GT(r.peers_stopped, 0);
  EXPECT_GT(r.skipped_steps, 0u);
  EXPECT_EQ(r.local_steps + r.skipped_steps, 6u * static_cast<std::uint64_t>(r.mean_iterations));
  EXPECT_GT(r.curve.back().mean_accuracy, 0.8);
}

TEST(SimGossipLongRun, SameSeedSameRun) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = ring_config();
  c.max_iterations = 40;
  c.eval_every = 20;
  c.speed_classes = {1, 0.5};
  c.algorithm = sim::GossipAlgorithm::kAdpsgd;
  expect_same_curves(sim::run_gossip_simulation(c, data.train, data.test, "a"),
                     sim::run_gossip_simulation(c, data.train, data.test, "b"));
  c.algorithm = sim::GossipAlgorithm::kDpsgd;
  c.balance_target = 1.5;
  c.publish_fraction = 0.05;
  const auto first = sim::run_gossip_simulation(c, data.train, data.test, "a");
  expect_same_curves(first, sim::run_gossip_simulation(c, data.train, data.test, "b"));
  c.seed = 6;
  EXPECT_NE(first.consensus_parameters,
            sim::run_gossip_simulation(c, data.train, data.test, "c").consensus_parameters);
}

}  // namespace

// Issue 35 part 5: the built-in residual model in both gossip algorithms: the peers train
// and mix resnet-8's graph. 12 iterations of 3 peers (few: ~10 s per algorithm under the
// sanitizers) take the peers' mean test loss down from the He-initialized model's, far above
// ln 10 (overconfident residual sums), and leave every peer's model finite; learning above
// chance is e2e_residual_model_rounds_gossip's.
TEST(SimGossip, DpsgdAndAdpsgdTrainTheBuiltInResidualModel) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  for (const auto algorithm : {sim::GossipAlgorithm::kDpsgd, sim::GossipAlgorithm::kAdpsgd}) {
    sim::GossipConfig c = ring_config();
    c.model = "resnet-8";
    c.algorithm = algorithm;
    c.peers = 3;
    c.learning_rate = 0.1f;
    c.max_iterations = 12;
    c.eval_every = 12;
    c.eval_examples = 200;
    c.keep_final_models = true;
    const auto r = sim::run_gossip_simulation(c, data.train, data.test, "resnet-8");
    ASSERT_EQ(r.curve.size(), 2u) << "at the start and after 12 iterations";
    EXPECT_LT(r.curve.back().mean_loss, r.curve.front().mean_loss - 0.25)
        << "from " << r.curve.front().mean_loss;
    EXPECT_LT(r.curve.back().mean_loss, 2.5) << "not far from ln 10 after 12 iterations";
    EXPECT_GT(r.exchanges, 0u);
    ASSERT_EQ(r.final_models.size(), 3u);
    const std::size_t arena = runtime::Model(runtime::builtin_model_spec("resnet-8")).parameter_count();
    for (const auto& peer : r.final_models) {
      ASSERT_EQ(peer.size(), arena);
      for (const float value : peer) ASSERT_TRUE(std::isfinite(value));
    }
  }
}

// A residual block with batch norm in gossip (model/README.md, "Normalization state"): the
// peers exchange their arenas, which hold no running statistics, and every score is the
// parameters' alone: the server's evaluator (edgetrain-fleet-eval's too), calibrating on the
// scored examples, reproduces the peers' mean and the consensus model's test loss exactly.
TEST(SimGossip, BatchNormResidualPeersAreScoredByRecalibration) {
  const auto& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::GossipConfig c = ring_config();
  c.model =
      "input 28x28x1; init he; conv 8 3x3 stride 2 same; batchnorm relu; name s0; "
      "conv 8 3x3 same; batchnorm relu; conv 8 3x3 same; batchnorm; add s0 relu; "
      "globalavgpool; fc 10";
  c.peers = 4;
  c.max_iterations = 20;
  c.eval_every = 20;
  c.eval_examples = 300;
  c.keep_final_models = true;
  const auto r = sim::run_gossip_simulation(c, data.train, data.test, "residual batchnorm");
  ASSERT_EQ(r.curve.size(), 2u);
  EXPECT_LT(r.curve.back().mean_loss, r.curve.front().mean_loss) << "20 iterations lower the loss";
  runtime::Model model(runtime::model_spec_from_argument(c.model));
  ASSERT_TRUE(runtime::Trainer(model, 1).has_batch_norm());
  // The server's (and edgetrain-fleet-eval's) evaluator, batches of 100 as the simulator's.
  const runtime::Dataset scored = first_examples(data.test, c.eval_examples);
  ASSERT_EQ(r.final_models.size(), 4u);
  double mean_loss = 0;
  std::vector<double> sum(model.parameter_count(), 0.0);
  for (const auto& peer : r.final_models) {
    ASSERT_EQ(peer.size(), model.parameter_count()) << "a peer's model is its arena alone";
    mean_loss += server::evaluate_parameters(model, peer, scored).loss / 4.0;
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += peer[k];
  }
  EXPECT_DOUBLE_EQ(mean_loss, r.curve.back().mean_loss);
  std::vector<float> consensus(sum.size());
  for (std::size_t k = 0; k < sum.size(); ++k) consensus[k] = static_cast<float>(sum[k] / 4.0);
  EXPECT_DOUBLE_EQ(server::evaluate_parameters(model, consensus, scored).loss,
                   r.curve.back().consensus_loss);
}
