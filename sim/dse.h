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

#include "model/dropout_table.h"
#include "model/filter_dropout.h"
#include "model/model.h"

namespace edgetrain::sim {

// The table's points and the table itself (model/dropout_table.h: the worker reads it).
using DsePoint = runtime::DropoutTablePoint;
using DseTable = runtime::DropoutTable;

// Every vector with each conv layer's rate taken from `levels` (levels^layers vectors,
// the first layer's rate varying slowest).
std::vector<std::vector<float>> dropout_grid(int conv_layers, std::span<const float> levels);
// The points no other point dominates (one at most as slow and at least as accurate, and
// better in one), by relative_time ascending; of equal points the first is kept.
std::vector<DsePoint> pareto_front(const std::vector<DsePoint>& points);
double relative_flops(const runtime::Model& model, std::span<const float> rates);

}  // namespace edgetrain::sim
