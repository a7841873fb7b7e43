// The dropout table of DISTREAL (issue 14 parts 3 and 4): the Pareto-optimal per-layer
// drop-rate vectors of one model, each with its cost (step time relative to the full model,
// and forward FLOPs) and its convergence (the accuracy the design space exploration
// measured). edgetrain-dse (sim/dse.h) writes it; a worker reads it at start
// (--dropout-table) and picks a point at run time (model/dropout_selector.h). The format is
// documented in sim/README.md, "Dropout table".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/dropout_selector.h"
#include "model/filter_dropout.h"
#include "model/model.h"

namespace edgetrain::runtime {

constexpr int kDropoutTableFormatVersion = 1;

struct DropoutTablePoint {
  std::vector<float> drop_rates;  // one per conv layer
  double relative_time = 1;       // step time / full model's step time (the DSE's machine)
  double relative_flops = 1;      // forward multiply-accumulates / full model's
  double accuracy = 0;            // test accuracy after the DSE's update budget
};

struct DropoutTable {
  int format_version = kDropoutTableFormatVersion;
  std::string model_name;
  std::uint64_t layout_id = 0;
  DropoutRescale rescale = DropoutRescale::kInverted;
  std::vector<DropoutTablePoint> points;  // the Pareto front, by relative_time ascending
};

// JSON, written through PATH.tmp and a rename. Throws std::runtime_error if it cannot.
void write_dropout_table(const std::string& path, const DropoutTable& table);
// Reads and checks the file against `model` (format, version, layout id, one valid rate per
// conv layer, finite positive costs, accuracy in [0, 1]); throws std::invalid_argument
// naming the file and what is wrong.
DropoutTable read_dropout_table(const std::string& path, const Model& model);
// The table's points as the selector's choices.
std::vector<DropoutChoice> dropout_choices(const DropoutTable& table);

}  // namespace edgetrain::runtime
