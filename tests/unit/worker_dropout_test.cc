// runtime::WorkerDropout (worker/worker_dropout.h): a worker's static or run-time-chosen
// filter dropout. The static vector reaches the trainer; all zeros is the full model; bad
// settings and a table for another model are refused; the adaptive choice follows the
// measured step time both ways and a round's budget, and the trainer trains what it chose.
#include "worker/worker_dropout.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>
#include <unistd.h>

#include "model/dropout_table.h"
#include "model/model.h"
#include "model/trainer.h"

namespace {

using namespace edgetrain::runtime;
namespace fs = std::filesystem;

constexpr const char* kTinyConv =
    "input 28x28x1; conv 4 3x3 relu; maxpool 2; conv 8 3x3 relu; maxpool 2; fc 10";

struct WorkerDropoutTest : ::testing::Test {
  Model model{model_spec_from_argument(kTinyConv)};
  Trainer trainer{model, 4, KernelBackend::kReference, nullptr};
  fs::path table_path =
      fs::temp_directory_path() / ("worker_dropout_test_" + std::to_string(::getpid()) + ".json");
  ~WorkerDropoutTest() override { fs::remove(table_path); }

  // Thin (0.4 of the full step, less accurate) and full.
  void write_table(const Model& for_model) {
    DropoutTable table;
    table.model_name = for_model.spec().name;
    table.layout_id = for_model.layout_id();
    DropoutTablePoint thin, full;
    thin.drop_rates = {0.5f, 0.75f};
    thin.relative_time = 0.4;
    thin.accuracy = 0.8;
    full.drop_rates = {0.0f, 0.0f};
    full.accuracy = 0.9;
    table.points = {thin, full};
    write_dropout_table(table_path.string(), table);
  }
  WorkerDropoutSettings adaptive(double budget_seconds) {
    WorkerDropoutSettings s;
    s.table_path = table_path.string();
    s.step_budget_seconds = budget_seconds;
    return s;
  }
};

TEST_F(WorkerDropoutTest, StaticRatesReachTheTrainer) {
  WorkerDropoutSettings s;
  s.drop_rates = {0.5f, 0.25f};
  WorkerDropout dropout(s, model, trainer, 7, WorkerDropout::Pacing::kPerStep);
  ASSERT_NE(trainer.dropout(), nullptr);
  EXPECT_EQ(trainer.dropout()->config().conv_drop_rates, s.drop_rates);
  EXPECT_EQ(trainer.dropout()->kept_filters(0).size(), 2u);
  EXPECT_EQ(trainer.dropout()->kept_filters(1).size(), 6u);
  EXPECT_EQ(dropout.status().drop_rates, "0.5,0.25");
  EXPECT_FALSE(dropout.adaptive());
  EXPECT_FALSE(dropout.after_step(10.0)) << "a static vector never changes";
}

TEST_F(WorkerDropoutTest, AllZeroRatesRunTheFullModel) {
  WorkerDropoutSettings s;
  s.drop_rates = {0.0f, 0.0f};
  WorkerDropout dropout(s, model, trainer, 7, WorkerDropout::Pacing::kPerStep);
  EXPECT_EQ(trainer.dropout(), nullptr);
  EXPECT_EQ(dropout.status().drop_rates, "0,0");
  WorkerDropout none({}, model, trainer, 7, WorkerDropout::Pacing::kPerStep);
  EXPECT_EQ(none.status().drop_rates, "") << "no dropout configured";
}

TEST_F(WorkerDropoutTest, RefusesBadSettings) {
  write_table(model);
  WorkerDropoutSettings both = adaptive(0.01);
  both.drop_rates = {0.5f, 0.5f};
  EXPECT_THROW(WorkerDropout(both, model, trainer, 1, WorkerDropout::Pacing::kPerStep),
               std::invalid_argument);
  WorkerDropoutSettings wrong_count;
  wrong_count.drop_rates = {0.5f};
  EXPECT_THROW(WorkerDropout(wrong_count, model, trainer, 1, WorkerDropout::Pacing::kPerStep),
               std::invalid_argument);
  WorkerDropoutSettings out_of_range;
  out_of_range.drop_rates = {0.5f, 1.0f};
  EXPECT_THROW(WorkerDropout(out_of_range, model, trainer, 1, WorkerDropout::Pacing::kPerStep),
               std::invalid_argument);
  EXPECT_THROW(WorkerDropout(adaptive(0), model, trainer, 1, WorkerDropout::Pacing::kPerStep),
               std::invalid_argument)
      << "async needs a budget";
  EXPECT_NO_THROW(WorkerDropout(adaptive(0), model, trainer, 1, WorkerDropout::Pacing::kPerRound))
      << "rounds take it from the deadline";
  WorkerDropoutSettings budget_alone;
  budget_alone.step_budget_seconds = 0.01;
  EXPECT_THROW(WorkerDropout(budget_alone, model, trainer, 1, WorkerDropout::Pacing::kPerStep),
               std::invalid_argument);
  const Model other(model_spec_from_argument(
      "input 28x28x1; conv 6 3x3 relu; maxpool 2; conv 8 3x3 relu; maxpool 2; fc 10"));
  write_table(other);
  EXPECT_THROW(WorkerDropout(adaptive(0.01), model, trainer, 1, WorkerDropout::Pacing::kPerStep),
               std::invalid_argument)
      << "a table made for another model";
}

// A worker of any mode refuses DISTREAL's drop rates for a residual model before it loads its
// data (the program's exit status 2), quoting the statement at fault: async and rounds alike.
TEST(WorkerDropoutResidual, RefusedForAResidualModelNamingTheStatement) {
  const Model resnet(builtin_model_spec("resnet-8"));
  WorkerDropoutSettings rates;
  rates.drop_rates.assign(9, 0.25f);
  for (const auto pacing : {DropoutPacing::kPerStep, DropoutPacing::kPerRound}) {
    try {
      check_worker_dropout(rates, resnet, pacing);
      ADD_FAILURE() << "resnet-8 took drop rates";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'add s0 relu'"), std::string::npos) << e.what();
    }
  }
}

TEST_F(WorkerDropoutTest, AdaptiveChoiceFollowsTheMeasuredStepTimeBothWays) {
  write_table(model);
  WorkerDropout dropout(adaptive(0.010), model, trainer, 3, WorkerDropout::Pacing::kPerStep);
  ASSERT_TRUE(dropout.adaptive());
  EXPECT_EQ(dropout.status().drop_rates, "0,0") << "the most accurate point before any measurement";
  EXPECT_EQ(trainer.dropout(), nullptr);
  for (int i = 0; i < 10; i++) dropout.after_step(0.008);  // the full model fits 10 ms
  EXPECT_EQ(dropout.status().drop_rates, "0,0");
  // Less CPU: the full model now takes 20 ms; the thin point (0.4) takes 8 ms and fits.
  bool changed = false;
  for (int i = 0; i < 30; i++) {
    const double relative = dropout.status().drop_rates == "0,0" ? 1.0 : 0.4;
    changed |= dropout.after_step(0.020 * relative);
  }
  EXPECT_TRUE(changed);
  EXPECT_EQ(dropout.status().drop_rates, "0.5,0.75");
  ASSERT_NE(trainer.dropout(), nullptr) << "the trainer trains the chosen sub-network";
  EXPECT_EQ(trainer.dropout()->kept_filters(0).size(), 2u);
  EXPECT_NEAR(dropout.status().full_step_estimate_ms, 20.0, 2.0);
  // The CPU comes back.
  for (int i = 0; i < 40; i++) {
    const double relative = dropout.status().drop_rates == "0,0" ? 1.0 : 0.4;
    dropout.after_step(0.006 * relative);
  }
  EXPECT_EQ(dropout.status().drop_rates, "0,0");
  EXPECT_EQ(trainer.dropout(), nullptr);
  EXPECT_EQ(dropout.status().selections, 2u);
}

TEST_F(WorkerDropoutTest, ARoundBudgetChoosesAtOnce) {
  write_table(model);
  WorkerDropout dropout(adaptive(0), model, trainer, 3, WorkerDropout::Pacing::kPerRound);
  for (int i = 0; i < 5; i++) dropout.after_step(0.010);  // full model: 10 ms a step
  EXPECT_EQ(dropout.status().drop_rates, "0,0");
  EXPECT_TRUE(dropout.set_budget(0.005)) << "a tight deadline: 4 ms fits, 10 ms does not";
  EXPECT_EQ(dropout.status().drop_rates, "0.5,0.75");
  EXPECT_NEAR(dropout.status().budget_ms, 5.0, 1e-9);
  EXPECT_TRUE(dropout.set_budget(0.050));
  EXPECT_EQ(dropout.status().drop_rates, "0,0");
}

TEST_F(WorkerDropoutTest, PerRoundPacingChoosesFromTheLastRoundsMeanOnly) {
  write_table(model);
  WorkerDropout dropout(adaptive(0), model, trainer, 3, WorkerDropout::Pacing::kPerRound);
  ASSERT_FALSE(dropout.set_budget(0.012)) << "no measurement yet: the most accurate point";
  // A round under a CPU quota: steps either fit the period's quota (4 ms) or wait for the
  // next period (30 ms); mean 17 ms, over the budget. Within the round nothing changes
  // after the first estimate (its first 3 steps: 4, 30, 4 ms, mean 12.7 ms > 12 ms: thin).
  const double bursty[] = {0.004, 0.030, 0.004, 0.030, 0.004, 0.030, 0.004, 0.030};
  std::uint64_t changes = 0;
  for (double seconds : bursty) changes += dropout.after_step(seconds);
  EXPECT_EQ(changes, 1u);
  EXPECT_EQ(dropout.status().drop_rates, "0.5,0.75");
  EXPECT_FALSE(dropout.set_budget(0.012))
      << "the round's last 5 steps at 0.4: 49 ms full, still over";
  EXPECT_NEAR(dropout.status().full_step_estimate_ms, 98.0 / 5 / 0.4, 1e-6);
  // The CPU comes back; the next round's choice comes from this round's mean.
  for (int i = 0; i < 10; i++) dropout.after_step(0.002);  // 2 ms at 0.4: 5 ms full
  EXPECT_EQ(dropout.status().drop_rates, "0.5,0.75") << "no change mid-round";
  EXPECT_TRUE(dropout.set_budget(0.012));
  EXPECT_EQ(dropout.status().drop_rates, "0,0");
  EXPECT_NEAR(dropout.status().full_step_estimate_ms, 5.0, 1e-6);
}

}  // namespace
