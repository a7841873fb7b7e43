// The filter-dropout design space exploration (sim/dse.h): the grid, the Pareto front, the
// table file written and read back, the reader's refusals (wrong model, version, rates,
// fields), and the simulator training with a dropout vector.
#include "sim/dse.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/simulator.h"
#include "tests/support/test_data.h"

namespace {

using namespace edgetrain;
namespace fs = std::filesystem;

constexpr const char* kTinyConv =
    "input 28x28x1; conv 4 3x3 relu; maxpool 2; conv 4 3x3 relu; maxpool 2; fc 10";

TEST(Dse, GridHasEveryCombination) {
  const std::vector<float> levels{0.0f, 0.25f, 0.5f, 0.75f};
  const auto grid = sim::dropout_grid(2, levels);
  ASSERT_EQ(grid.size(), 16u);
  EXPECT_EQ(grid.front(), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_EQ(grid[1], (std::vector<float>{0.0f, 0.25f}));
  EXPECT_EQ(grid.back(), (std::vector<float>{0.75f, 0.75f}));
  EXPECT_THROW(sim::dropout_grid(0, levels), std::invalid_argument);
}

TEST(Dse, ParetoFrontKeepsOnlyUndominatedPoints) {
  auto point = [](float rate, double time, double accuracy) {
    sim::DsePoint p;
    p.drop_rates = {rate};
    p.relative_time = time;
    p.accuracy = accuracy;
    return p;
  };
  const std::vector<sim::DsePoint> points{point(0, 1.0, 0.90), point(0.25, 0.8, 0.91),
                                          point(0.5, 0.5, 0.85), point(0.75, 0.6, 0.80),
                                          point(0.1, 0.5, 0.84)};
  const auto front = sim::pareto_front(points);
  ASSERT_EQ(front.size(), 2u);  // 0.5 (fastest) and 0.25 (more accurate than the full model here)
  EXPECT_EQ(front[0].drop_rates[0], 0.5f);
  EXPECT_EQ(front[1].drop_rates[0], 0.25f);
}

struct TableFile {
  fs::path path = fs::temp_directory_path() / ("dse_test_" + std::to_string(::getpid()) + ".json");
  ~TableFile() { fs::remove(path); }
  void write(const nlohmann::json& doc) const { std::ofstream(path) << doc.dump(); }
  nlohmann::json read() const { return nlohmann::json::parse(std::ifstream(path)); }
};

sim::DseTable sample_table(const runtime::Model& model) {
  sim::DseTable table;
  table.model_name = model.spec().name;
  table.layout_id = model.layout_id();
  sim::DsePoint full, thin;
  full.drop_rates = {0.0f, 0.0f};
  full.accuracy = 0.9;
  thin.drop_rates = {0.5f, 0.75f};
  thin.relative_time = 0.4;
  thin.relative_flops = sim::relative_flops(model, thin.drop_rates);
  thin.accuracy = 0.8;
  table.points = {thin, full};
  return table;
}

TEST(Dse, TableRoundTrips) {
  runtime::Model model(runtime::parse_model_spec(kTinyConv, "tiny-conv"));
  TableFile file;
  runtime::write_dropout_table(file.path.string(), sample_table(model));
  const nlohmann::json doc = file.read();
  EXPECT_EQ(doc.at("format_version"), runtime::kDropoutTableFormatVersion);
  EXPECT_EQ(doc.at("model").at("name"), "tiny-conv");
  const sim::DseTable back = runtime::read_dropout_table(file.path.string(), model);
  ASSERT_EQ(back.points.size(), 2u);
  EXPECT_EQ(back.points[0].drop_rates, (std::vector<float>{0.5f, 0.75f}));
  EXPECT_DOUBLE_EQ(back.points[0].relative_time, 0.4);
  EXPECT_LT(back.points[0].relative_flops, 0.5);
  EXPECT_EQ(back.rescale, runtime::DropoutRescale::kInverted);
}

void expect_refused(const TableFile& file, const runtime::Model& model, const std::string& words) {
  try {
    runtime::read_dropout_table(file.path.string(), model);
    ADD_FAILURE() << "accepted; expected an error with '" << words << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(Dse, ReaderRefusesTablesThatDoNotFit) {
  runtime::Model model(runtime::parse_model_spec(kTinyConv, "tiny-conv"));
  runtime::Model other(runtime::builtin_model_spec("paper-cnn"));
  TableFile file;
  runtime::write_dropout_table(file.path.string(), sample_table(model));
  const nlohmann::json good = file.read();
  expect_refused(file, other, "not for model 'paper-cnn'");
  auto edited = [&](auto&& edit) {
    nlohmann::json doc = good;
    edit(doc);
    file.write(doc);
  };
  edited([](nlohmann::json& d) { d["format_version"] = 2; });
  expect_refused(file, model, "format version 2");
  edited([](nlohmann::json& d) { d["points"][0]["drop_rates"] = {0.5}; });
  expect_refused(file, model, "1 drop rate(s) given");
  edited([](nlohmann::json& d) { d["points"][1]["drop_rates"] = {1.0, 0.0}; });
  expect_refused(file, model, "outside [0, 1)");
  edited([](nlohmann::json& d) { d["points"][0]["accuracy"] = 1.5; });
  expect_refused(file, model, "accuracy outside");
  edited([](nlohmann::json& d) { d["points"][0].erase("relative_time"); });
  expect_refused(file, model, "missing or mistyped");
  edited([](nlohmann::json& d) { d["points"] = nlohmann::json::array(); });
  expect_refused(file, model, "no points");
  std::ofstream(file.path) << "{ not json";
  expect_refused(file, model, "not valid JSON");
  fs::remove(file.path);
  expect_refused(file, model, "cannot open");
}

TEST(Dse, SimulatorTrainsWithADropoutVector) {
  const std::string dir = edgetrain::testing::mnist_small_dir().string() + "/";
  if (!fs::exists(dir + "train-images-idx3-ubyte")) GTEST_SKIP() << "no MNIST subset in " << dir;
  const auto train =
      runtime::load_dataset(dir + "train-images-idx3-ubyte", dir + "train-labels-idx1-ubyte");
  const auto test =
      runtime::load_dataset(dir + "t10k-images-idx3-ubyte", dir + "t10k-labels-idx1-ubyte");
  sim::SimConfig c;
  c.model = kTinyConv;
  c.max_updates = 200;
  c.eval_every = 200;
  c.eval_examples = 500;
  c.conv_drop_rates = {0.5f, 0.5f};
  const auto result = sim::run_simulation(c, train, test, "dropout");
  EXPECT_EQ(result.updates_applied, 200u);
  EXPECT_GT(result.final_accuracy(), 0.3);  // learns (chance: 0.1)
  c.conv_drop_rates = {0.5f};
  EXPECT_THROW(sim::run_simulation(c, train, test, "bad"), std::invalid_argument);
}

}  // namespace
