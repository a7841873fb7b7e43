// edgetrain-dse: the design space exploration of DISTREAL's filter dropout (sim/dse.h).
// See sim/README.md and `edgetrain-dse --help`; its settings are one table
// (common/settings.h). Progress on stderr; the Pareto front to --out (JSON).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

#include "common/settings.h"
#include "model/dataset.h"
#include "model/thread_pool.h"
#include "model/trainer.h"
#include "sim/dse.h"
#include "sim/simulator.h"

namespace {

using namespace edgetrain;

struct DseSettings {
  sim::SimConfig sim;
  std::string data = "mnist-small", levels = "0,0.25,0.5,0.75", rescale = "inverted",
              out = "dropout-table.json";
  int time_steps = 20;
};

void declare_settings(settings::Table& t, DseSettings& s) {
  sim::SimConfig& c = s.sim;
  c.max_updates = 1000;
  c.eval_every = 1000;
  c.eval_examples = 2000;
  t.group("Model and grid");
  t.add("model", c.model,
        "paper-cnn, or a spec with conv layers such as 'input 28x28x1; conv 4 3x3 relu; maxpool 2; "
        "fc 10'");
  t.add("levels", s.levels,
        "drop rates tried for every conv layer (the grid is levels^conv-layers vectors)");
  t.add("dropout-rescale", s.rescale, "inverted (ours: kept outputs times 1/keep) or none")
      .choices({"inverted", "none"});
  t.group("Cost (step time of the real trainer on this machine)");
  t.add("time-steps", s.time_steps,
        "timed training steps per vector (the fastest counts; after 3 untimed)")
      .range(1, 100000);
  t.add("threads", c.threads, "compute threads, for timing and simulation").range(1, 64);
  t.group("Convergence (simulator)");
  t.add("data", s.data,
        "mnist, mnist-small, fashion-mnist or a directory (as edgetrain-sim: IDX files or "
        "edgetrain-data.toml)");
  t.add("updates", c.max_updates,
        "budget: applied updates per vector; accuracy is measured after it")
      .unit("updates");
  t.add("eval-examples", c.eval_examples, "test examples for the accuracy (0: all)");
  t.add("workers", c.workers, "simulated workers").range(1, 10000);
  t.add("batch", c.batch, "minibatch per step (also for timing)").range(1, 4096);
  t.add("lr", c.learning_rate, "server learning rate");
  t.add("seed", c.seed, "same seed, same accuracies");
  t.group("Output");
  t.add("out", s.out, "the Pareto front, JSON (format in sim/README.md)");
}

// Fastest of the timed training steps of the real trainer (XNNPACK) with `rates` (all zero: no
// dropout).
double step_seconds(const runtime::Model& model, const std::vector<float>& rates,
                    const DseSettings& s, pthreadpool_t pool) {
  runtime::Trainer trainer(model, s.sim.batch, runtime::KernelBackend::kXnnpack, pool);
  if (std::any_of(rates.begin(), rates.end(), [](float r) { return r > 0; })) {
    runtime::DropoutConfig dropout;
    dropout.conv_drop_rates = rates;
    dropout.rescale = runtime::parse_dropout_rescale(s.rescale);
    trainer.set_dropout(dropout);
  }
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(s.sim.batch) *
                                   model.input_shape().size());
  std::vector<std::int32_t> labels(s.sim.batch);
  std::mt19937 rng(1);
  for (auto& p : pixels) p = static_cast<std::uint8_t>(rng() % 256);
  for (auto& l : labels) l = static_cast<std::int32_t>(rng() % model.num_classes());
  std::vector<float> grad(model.parameter_count());
  std::vector<double> times;
  for (int i = 0; i < 3 + s.time_steps; i++) {
    const auto start = std::chrono::steady_clock::now();
    trainer.compute_gradient(model.parameters(), pixels.data(), labels.data(), s.sim.batch, grad);
    if (i >= 3)
      times.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  // The fastest step, not the median: on a shared machine a step is often cut into
  // scheduler slices, which quantizes medians; the fastest is the step's own cost.
  return *std::min_element(times.begin(), times.end());
}

double accuracy_after_budget(const std::vector<float>& rates, const DseSettings& s,
                             const runtime::Dataset& train, const runtime::Dataset& test) {
  sim::SimConfig c = s.sim;
  if (std::any_of(rates.begin(), rates.end(), [](float r) { return r > 0; }))
    c.conv_drop_rates = rates;
  c.dropout_rescale = runtime::parse_dropout_rescale(s.rescale);
  c.eval_every = c.max_updates;  // one evaluation, at the end of the budget
  const sim::SimResult result = sim::run_simulation(c, train, test, "dse");
  if (result.stalled) {
    // A diverged vector: the simulator stopped once the server refused every update for a
    // while; its accuracy at that point is what the table gets (it is rarely on the front).
    std::fprintf(
        stderr,
        "edgetrain-dse: %s stalled after %llu of %llu updates (every update refused: diverged); "
        "accuracy there %.4f\n",
        runtime::format_drop_rates(rates).c_str(),
        static_cast<unsigned long long>(result.updates_applied),
        static_cast<unsigned long long>(c.max_updates), result.final_accuracy());
  }
  return result.final_accuracy();
}

int run(const DseSettings& s) {
  runtime::Model model(runtime::model_spec_from_argument(s.sim.model));
  model.initialize(s.sim.seed);
  const std::vector<float> levels = runtime::parse_drop_rates(s.levels);
  for (float level : levels)
    if (!(level >= 0 && level < 1))
      throw std::invalid_argument("--levels: every rate must be in [0, 1)");
  const auto grid = sim::dropout_grid(runtime::conv_layer_count(model), levels);
  // Any --data, the user's own too: the accuracies come from the simulator, whose trainers take
  // the data's input format; step_seconds times the model on uint8 input, whose conversion
  // costs next to nothing beside the step.
  const runtime::Dataset train = runtime::load_named_dataset(s.data, runtime::DataSplit::kTrain);
  const runtime::Dataset test = runtime::load_named_dataset(s.data, runtime::DataSplit::kTest);
  runtime::ThreadPool pool(s.sim.threads);
  const std::vector<float> full(grid.front().size(), 0.0f);
  step_seconds(model, full, s, pool.get());  // warms caches and the allocator before the baseline
  const double full_seconds = step_seconds(model, full, s, pool.get());
  std::fprintf(stderr,
               "edgetrain-dse: model %s, %zu vectors, full-model step %.3f ms (batch %d), %llu "
               "updates each\n",
               model.spec().name.c_str(), grid.size(), full_seconds * 1e3, s.sim.batch,
               static_cast<unsigned long long>(s.sim.max_updates));
  std::vector<sim::DsePoint> points;
  for (std::size_t i = 0; i < grid.size(); i++) {
    sim::DsePoint p;
    p.drop_rates = grid[i];
    const bool full_model =
        std::all_of(grid[i].begin(), grid[i].end(), [](float r) { return r == 0; });
    // The full model is timed again right before each vector: on a shared machine the load
    // changes by the minute, and a ratio of neighbouring measurements follows it less.
    p.relative_time = full_model ? 1.0
                                 : step_seconds(model, grid[i], s, pool.get()) /
                                       step_seconds(model, full, s, pool.get());
    p.relative_flops = sim::relative_flops(model, grid[i]);
    p.accuracy = accuracy_after_budget(grid[i], s, train, test);
    std::fprintf(stderr, "[%zu/%zu] rates %-20s time %.3f  flops %.3f  accuracy %.4f\n", i + 1,
                 grid.size(), runtime::format_drop_rates(p.drop_rates).c_str(), p.relative_time,
                 p.relative_flops, p.accuracy);
    points.push_back(std::move(p));
  }
  sim::DseTable table;
  table.model_name = model.spec().name;
  table.layout_id = model.layout_id();
  table.rescale = runtime::parse_dropout_rescale(s.rescale);
  table.points = sim::pareto_front(points);
  runtime::write_dropout_table(s.out, table);
  std::fprintf(stderr, "edgetrain-dse: %zu Pareto points of %zu written to %s\n",
               table.points.size(), points.size(), s.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  DseSettings settings;
  settings::Table table("edgetrain-dse",
                        "edgetrain-dse: design space exploration for DISTREAL's filter dropout. "
                        "For every vector of per-conv-layer\n"
                        "drop rates in a grid, measures the real trainer's step time on this "
                        "machine and the forward FLOPs (both\n"
                        "relative to the full model) and the test accuracy after a fixed update "
                        "budget in the simulator; writes\n"
                        "the Pareto front (least time, most accuracy) to --out, the table a "
                        "worker's --dropout-table reads.");
  declare_settings(table, settings);
  return table.run_program(argc, argv, [&] { return run(settings); });
}
