// Federated rounds in the simulator (sim/simulator.h, SimMode::kRounds): a short FedAvg
// run on the real digits must learn; the round policies must drop stragglers or wait for
// them as the server does; a run must be reproducible from its seed; and the two
// aggregations of server::aggregate_deltas must agree on dense deltas and differ on
// sparse ones.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "model/model.h"
#include "model/trainer.h"
#include "server/evaluator.h"
#include "sim/simulator.h"
#include "tests/integration/sim_test_data.h"

namespace {

using namespace edgetrain;

using Mnist = edgetrain::testing::SimMnist;
const Mnist& mnist() { return edgetrain::testing::sim_mnist(); }

// The first `count` examples of `data`: the set an evaluation of eval_examples scores.
runtime::Dataset first_examples(const runtime::Dataset& data, std::size_t count) {
  runtime::Dataset head = data;
  head.pixels.resize(count * data.image_bytes());
  head.labels.resize(count);
  return head;
}

sim::SimConfig rounds_config() {
  sim::SimConfig c;
  c.mode = sim::SimMode::kRounds;
  c.model = "mlp";
  c.workers = 10;
  c.batch = 10;
  c.compressor.method = runtime::CompressionMethod::kNone;
  c.rounds.local_steps = 10;
  c.rounds.max_rounds = 8;
  c.eval_every = 1;
  c.eval_examples = 1000;
  c.seed = 3;
  return c;
}

TEST(SimulatorRounds, FedAvgLearnsAndCountsRoundsTimeAndBytes) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  const auto result = sim::run_simulation(rounds_config(), data.train, data.test, "FedAvg");
  ASSERT_EQ(result.curve.size(), 9u) << "an evaluation at the start and after each of the 8 rounds";
  EXPECT_EQ(result.updates_applied, 8u);
  EXPECT_LT(result.curve.front().accuracy, 0.3);
  EXPECT_GT(result.best_accuracy(), 0.85) << "8 rounds of 10 workers x 10 local steps";
  for (std::size_t i = 1; i < result.curve.size(); ++i) {
    EXPECT_EQ(result.curve[i].updates, i) << "updates counts the rounds closed";
    EXPECT_GT(result.curve[i].time, result.curve[i - 1].time);
    EXPECT_GT(result.curve[i].ingress_bytes, result.curve[i - 1].ingress_bytes);
  }
  // Every selected worker pulls the dense model once per round.
  EXPECT_EQ(result.pull_bytes, static_cast<std::uint64_t>(result.mean_pull_bytes) * 8 * 10);
  EXPECT_EQ(result.curve.back().pull_bytes, result.pull_bytes);
}

// With identical workers (no speed spread, no jitter) a round lasts exactly its local steps,
// in mean step times; with local epochs, a pass over an 800-example shard in batches of 10.
TEST(SimulatorRounds, ARoundLastsItsLocalStepsOfVirtualTime) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::SimConfig c = rounds_config();
  c.speed_spread = 0;
  c.step_jitter = 0;
  c.rounds.max_rounds = 3;
  c.rounds.policy = sim::RoundPolicy::kWaitAll;
  const auto steps = sim::run_simulation(c, data.train, data.test, "steps");
  EXPECT_DOUBLE_EQ(steps.virtual_time, 30.0);
  EXPECT_EQ(steps.round_stragglers, 0u);
  c.rounds.max_rounds = 1;
  c.rounds.local_epochs = 1;
  const auto epoch = sim::run_simulation(c, data.train, data.test, "epoch");
  EXPECT_DOUBLE_EQ(epoch.virtual_time, data.train.size() / 10 / 10.0);
}

// A deadline of exactly the local steps: every worker slower than the mean misses it.
// drop-stragglers closes there and leaves their deltas out (their bytes still reach the
// server); wait-all waits for them.
TEST(SimulatorRounds, DropStragglersDropsLateDeltasAndWaitAllWaits) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::SimConfig c = rounds_config();
  c.rounds.max_rounds = 5;
  c.rounds.deadline_steps = 10;
  c.eval_every = 5;
  c.rounds.policy = sim::RoundPolicy::kDropStragglers;
  const auto drop = sim::run_simulation(c, data.train, data.test, "drop");
  c.rounds.policy = sim::RoundPolicy::kWaitAll;
  const auto wait = sim::run_simulation(c, data.train, data.test, "wait");

  EXPECT_GT(drop.round_stragglers, 0u);
  EXPECT_LT(drop.mean_round_deltas, 10.0);
  EXPECT_DOUBLE_EQ(drop.virtual_time, 50.0) << "every round ends at its deadline";
  EXPECT_EQ(wait.round_stragglers, 0u);
  EXPECT_DOUBLE_EQ(wait.mean_round_deltas, 10.0);
  EXPECT_GT(wait.virtual_time, drop.virtual_time);
  // Dense deltas all have one size: ingress holds more than the aggregated deltas, the
  // stragglers' that arrived before the run ended.
  const double aggregated_bytes = drop.mean_round_deltas * 5 * drop.mean_update_bytes;
  EXPECT_GT(static_cast<double>(drop.ingress_bytes),
            aggregated_bytes + 0.5 * drop.mean_update_bytes);
  EXPECT_DOUBLE_EQ(static_cast<double>(wait.ingress_bytes), 50 * wait.mean_update_bytes);
}

TEST(SimulatorRounds, ClientFractionSelectsThatShareOfTheWorkers) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::SimConfig c = rounds_config();
  c.rounds.max_rounds = 4;
  c.rounds.client_fraction = 0.3;
  c.rounds.policy = sim::RoundPolicy::kWaitAll;
  c.eval_every = 4;
  const auto result = sim::run_simulation(c, data.train, data.test, "0.3");
  EXPECT_DOUBLE_EQ(result.mean_round_deltas, 3.0);
  EXPECT_EQ(result.pull_bytes, static_cast<std::uint64_t>(result.mean_pull_bytes) * 4 * 3);
  c.rounds.client_fraction = 0.01;  // rounds to none: still one worker
  EXPECT_DOUBLE_EQ(sim::run_simulation(c, data.train, data.test, "0.01").mean_round_deltas, 1.0);
}

TEST(SimulatorRounds, SameSeedSameRunDifferentSeedDifferentRun) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::SimConfig c = rounds_config();
  c.compressor = runtime::CompressorOptions{};  // AdaComp, with its per-worker state
  c.compressor.error_feedback = true;
  c.rounds.max_rounds = 6;
  c.rounds.client_fraction = 0.5;
  c.failure_probability = 0.02;
  c.eval_examples = 300;
  const auto a = sim::run_simulation(c, data.train, data.test, "a");
  const auto b = sim::run_simulation(c, data.train, data.test, "b");
  ASSERT_EQ(a.curve.size(), b.curve.size());
  for (std::size_t i = 0; i < a.curve.size(); i++) {
    EXPECT_EQ(a.curve[i].accuracy, b.curve[i].accuracy);
    EXPECT_EQ(a.curve[i].loss, b.curve[i].loss);
    EXPECT_EQ(a.curve[i].ingress_bytes, b.curve[i].ingress_bytes);
    EXPECT_EQ(a.curve[i].time, b.curve[i].time);
  }
  EXPECT_EQ(a.final_parameters, b.final_parameters);
  EXPECT_EQ(a.round_stragglers, b.round_stragglers);
  EXPECT_EQ(a.updates_lost, b.updates_lost);
  EXPECT_GT(a.updates_lost, 0u) << "failures were asked for";
  c.seed = 4;
  const auto d = sim::run_simulation(c, data.train, data.test, "d");
  EXPECT_NE(d.final_parameters, a.final_parameters);
}

// Dense deltas have every entry: the masked mean is the plain one, bit for bit. Top-k
// deltas share few entries: plain FedAvg divides each by every worker's weight, masked only
// by those that sent it, so the models part.
TEST(SimulatorRounds, MaskedAndFedAvgAgreeOnDenseDeltasAndDifferOnSparseOnes) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::SimConfig c = rounds_config();
  c.rounds.max_rounds = 3;
  c.eval_every = 3;
  c.rounds.aggregation = server::Aggregation::kMasked;
  const auto dense_masked = sim::run_simulation(c, data.train, data.test, "dense masked");
  c.rounds.aggregation = server::Aggregation::kFedAvg;
  const auto dense_fedavg = sim::run_simulation(c, data.train, data.test, "dense fedavg");
  EXPECT_EQ(dense_masked.final_parameters, dense_fedavg.final_parameters);

  c.compressor = runtime::CompressorOptions{};  // the paper's top-k, c = 0.01
  c.rounds.aggregation = server::Aggregation::kMasked;
  const auto sparse_masked = sim::run_simulation(c, data.train, data.test, "sparse masked");
  c.rounds.aggregation = server::Aggregation::kFedAvg;
  const auto sparse_fedavg = sim::run_simulation(c, data.train, data.test, "sparse fedavg");
  EXPECT_LT(sparse_masked.mean_update_bytes * 20, dense_masked.mean_update_bytes)
      << "top-k deltas are sparse";
  ASSERT_EQ(sparse_masked.final_parameters.size(), sparse_fedavg.final_parameters.size());
  EXPECT_NE(sparse_masked.final_parameters, sparse_fedavg.final_parameters);
  // How far each moved from the initial model: few entries are in more than one of the top-k
  // deltas, and plain FedAvg divides each entry's sum by every delta's weight where masked
  // divides by the weight of those that have it, so FedAvg's steps are far shorter.
  runtime::Model initial(runtime::model_spec_from_argument(c.model));
  initial.initialize(c.seed);
  double masked_moved = 0, fedavg_moved = 0;
  for (std::size_t i = 0; i < initial.parameters().size(); ++i) {
    masked_moved += std::abs(sparse_masked.final_parameters[i] - initial.parameters()[i]);
    fedavg_moved += std::abs(sparse_fedavg.final_parameters[i] - initial.parameters()[i]);
  }
  EXPECT_GT(fedavg_moved, 0);
  EXPECT_LT(fedavg_moved, 0.5 * masked_moved);
}

TEST(SimulatorRounds, RefusesBadRoundSettings) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  auto refused = [&](auto change) {
    sim::SimConfig c = rounds_config();
    change(c);
    EXPECT_THROW(sim::check_sim_config(c), std::invalid_argument);
    EXPECT_THROW(sim::run_simulation(c, data.train, data.test, "x"), std::invalid_argument);
  };
  refused([](sim::SimConfig& c) { c.rounds.local_steps = 0; });
  refused([](sim::SimConfig& c) { c.rounds.local_epochs = 1001; });
  refused([](sim::SimConfig& c) { c.rounds.local_lr = 0; });
  refused([](sim::SimConfig& c) { c.rounds.server_lr = -1; });
  refused([](sim::SimConfig& c) { c.rounds.client_fraction = 0; });
  refused([](sim::SimConfig& c) { c.rounds.client_fraction = 1.5; });
  refused([](sim::SimConfig& c) { c.rounds.deadline_steps = -1; });
  refused([](sim::SimConfig& c) { c.rounds.max_rounds = 0; });
  refused([](sim::SimConfig& c) { c.delta_pulls = true; });
  EXPECT_THROW(sim::parse_sim_mode("sync"), std::invalid_argument);
  EXPECT_THROW(sim::parse_round_policy("wait-some"), std::invalid_argument);
  EXPECT_EQ(sim::parse_round_policy("wait-all"), sim::RoundPolicy::kWaitAll);
}

// Issue 37 in the simulator: one worker of 10 sends its delta times −4 (a sign flip within
// every bound). FedAvg follows it part of the way; the median does not, and learns as the
// honest fleet does. A bias of 1e30 is refused as the server refuses it (4.22).
TEST(SimulatorRounds, TheMedianHoldsOffAScaledDeltaAndHugeOnesAreRefused) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::SimConfig c = rounds_config();
  c.rounds.max_rounds = 4;
  c.eval_every = 4;
  c.rounds.malicious_workers = 1;
  c.rounds.attack = sim::parse_model_attack("scale:-4");
  c.rounds.aggregation = server::Aggregation::kMedian;
  const auto median = sim::run_simulation(c, data.train, data.test, "median");
  c.rounds.aggregation = server::Aggregation::kMasked;
  const auto mean = sim::run_simulation(c, data.train, data.test, "mean");
  EXPECT_GT(median.final_accuracy(), 0.8);
  EXPECT_GT(median.final_accuracy(), mean.final_accuracy() + 0.02)
      << "median " << median.final_accuracy() << " mean " << mean.final_accuracy();
  EXPECT_EQ(mean.round_deltas_refused, 0u);

  c.rounds.attack = sim::parse_model_attack("bias:1e30");
  const auto refused = sim::run_simulation(c, data.train, data.test, "refused");
  EXPECT_EQ(refused.round_deltas_refused, 4u) << "the attacker's delta, every round";
  EXPECT_GT(refused.final_accuracy(), 0.8);

  c.rounds.attack = sim::parse_model_attack("scale:-4");
  c.rounds.clip_norm = 0.5;
  const auto clipped = sim::run_simulation(c, data.train, data.test, "clipped");
  EXPECT_GT(clipped.round_deltas_clipped, 0u);
}

}  // namespace

// Issue 35 part 5: the built-in residual model in federated rounds. Its He-initialized
// residual sums start overconfident (test loss 2.74 with this seed, above ln 10), and four
// short rounds take the loss down by 0.45 (asserted: 0.25); the aggregate is resnet-8's
// arena, finite, and has moved.
TEST(SimulatorRounds, TrainsTheBuiltInResidualModel) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::SimConfig c = rounds_config();
  c.model = "resnet-8";
  c.workers = 4;
  c.rounds.local_steps = 5;
  c.rounds.max_rounds = 4;
  c.eval_every = 4;
  c.eval_examples = 300;
  const auto result = sim::run_simulation(c, data.train, data.test, "resnet-8");
  ASSERT_EQ(result.curve.size(), 2u) << "at the start and after round 4";
  EXPECT_EQ(result.updates_applied, 4u);
  EXPECT_LT(result.curve.back().loss, result.curve.front().loss - 0.25)
      << "from " << result.curve.front().loss;
  runtime::Model initial(runtime::model_spec_from_argument(c.model));
  initial.initialize(c.seed);
  ASSERT_EQ(result.final_parameters.size(), initial.parameter_count());
  double moved = 0;
  for (std::size_t i = 0; i < initial.parameters().size(); ++i) {
    ASSERT_TRUE(std::isfinite(result.final_parameters[i])) << "parameter " << i;
    moved += std::abs(result.final_parameters[i] - initial.parameters()[i]);
  }
  EXPECT_GT(moved, 0);
}

// A residual block with batch norm in rounds (model/README.md, "Normalization state"): the
// running statistics are not in the arena, so no delta carries them; the round's score is a
// function of the aggregated parameters alone: the server's evaluator, which never saw a
// worker and calibrates on the scored examples, reproduces it exactly, and an evaluation
// that skips the calibration (running mean 0, variance 1) scores otherwise.
constexpr const char* kResidualBatchNormSpec =
    "input 28x28x1; init he; conv 8 3x3 stride 2 same; batchnorm relu; name s0; "
    "conv 8 3x3 same; batchnorm relu; conv 8 3x3 same; batchnorm; add s0 relu; "
    "globalavgpool; fc 10";

TEST(SimulatorRounds, BatchNormStatisticsNeverTravelAndTheEvaluatorRecalibrates) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::SimConfig c = rounds_config();
  c.model = kResidualBatchNormSpec;
  c.workers = 4;
  c.rounds.local_steps = 5;
  c.rounds.max_rounds = 3;
  c.eval_every = 3;
  c.eval_examples = 300;
  const auto result = sim::run_simulation(c, data.train, data.test, "residual batchnorm");
  ASSERT_EQ(result.curve.size(), 2u);
  EXPECT_LT(result.curve.back().loss, result.curve.front().loss) << "three rounds lower the loss";

  runtime::Model model(runtime::model_spec_from_argument(c.model));
  ASSERT_EQ(result.final_parameters.size(), model.parameter_count());
  runtime::Trainer trainer(model, 10);
  EXPECT_EQ(trainer.normalization_state().size(), 2u * (8 + 8 + 8))
      << "mean and variance per channel of 3 batchnorm layers, kept beside the arena";
  for (const runtime::TensorInfo& tensor : model.tensors())
    EXPECT_EQ(tensor.name.find("running"), std::string::npos) << tensor.name << " is in the arena";

  // What the real rounds server's evaluator makes of the aggregate (batches of 100, as the
  // simulator's): the same score to the last bit.
  const runtime::Dataset scored = first_examples(data.test, c.eval_examples);
  const server::EvaluationResult recalibrated =
      server::evaluate_parameters(model, result.final_parameters, scored);
  EXPECT_DOUBLE_EQ(recalibrated.loss, result.curve.back().loss);
  EXPECT_DOUBLE_EQ(recalibrated.accuracy, result.curve.back().accuracy);

  runtime::Trainer uncalibrated(model, 100);
  uncalibrated.set_input_format(scored.format);
  double loss = 0;
  for (std::size_t start = 0; start < scored.size(); start += 100)
    loss += uncalibrated
                .evaluate(result.final_parameters,
                          scored.pixels.data() + start * scored.image_bytes(),
                          scored.labels.data() + start, 100)
                .loss /
            3;
  EXPECT_GT(std::abs(loss - recalibrated.loss), 1e-3)
      << "the score does not depend on the calibration: is batch norm evaluated at all?";
}

// DISTREAL's filter dropout in rounds takes plain conv stacks only: with a residual model it
// is refused before any round, naming the statement at fault (model/filter_dropout.h).
TEST(SimulatorRounds, FilterDropoutRefusesAResidualModelNamingTheStatement) {
  const Mnist& data = mnist();
  ASSERT_GT(data.train.size(), 0u);
  sim::SimConfig c = rounds_config();
  c.model = "resnet-8";
  c.conv_drop_rates.assign(9, 0.25f);  // resnet-8's 9 convolutions
  try {
    sim::run_simulation(c, data.train, data.test, "resnet-8 dropout");
    ADD_FAILURE() << "filter dropout took resnet-8";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'add s0 relu'"), std::string::npos) << e.what();
  }
}
