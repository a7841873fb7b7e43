// Design space exploration for DISTREAL's filter dropout (issue 14 part 3): which per-layer
// drop-rate vectors are worth training with. Each vector of a grid is measured for
//   cost:        the real trainer's step time on this machine relative to the full model
//                (and, reported beside it, forward FLOPs relative to the full model);
//   convergence: test accuracy after a fixed budget of applied updates in the simulator,
//                every simulated worker training with that vector.
// The Pareto front (least relative time, most accuracy) goes to a small JSON file that a
// worker reads at start (see sim/README.md, "Dropout table").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/filter_dropout.h"
#include "runtime/model.h"

namespace edgetrain::sim {

constexpr int kDseFormatVersion = 1;

struct DsePoint {
  std::vector<float> drop_rates;  // one per conv layer
  double relative_time = 1;       // step time / full model's step time (this machine)
  double relative_flops = 1;      // forward multiply-accumulates / full model's
  double accuracy = 0;            // test accuracy after the DSE's update budget
};

struct DseTable {
  int format_version = kDseFormatVersion;
  std::string model_name;
  std::uint64_t layout_id = 0;
  runtime::DropoutRescale rescale = runtime::DropoutRescale::kInverted;
  std::vector<DsePoint> points;  // the Pareto front, by relative_time ascending
};

// Every vector with each conv layer's rate taken from `levels` (levels^layers vectors,
// the first layer's rate varying slowest).
std::vector<std::vector<float>> dropout_grid(int conv_layers, std::span<const float> levels);
// The points no other point dominates (one at most as slow and at least as accurate, and
// better in one), by relative_time ascending; of equal points the first is kept.
std::vector<DsePoint> pareto_front(const std::vector<DsePoint>& points);
double relative_flops(const runtime::Model& model, std::span<const float> rates);

// JSON, written through PATH.tmp and a rename. Throws std::runtime_error if it cannot.
void write_dse_table(const std::string& path, const DseTable& table);
// Reads and checks the file against `model` (format, version, layout id, one valid rate per
// conv layer, finite positive costs, accuracy in [0, 1]); throws std::invalid_argument
// naming the file and what is wrong.
DseTable read_dse_table(const std::string& path, const runtime::Model& model);

}  // namespace edgetrain::sim
