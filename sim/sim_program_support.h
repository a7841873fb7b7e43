// What edgetrain-sim's modes (sim/sim_mode_*.cc) share besides the reports
// (sim/sim_reports.h): the progress line, the kernels setting, --save-model. Private to the
// sim program's library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/trainer.h"
#include "sim/sim_program.h"

namespace edgetrain::sim {

// One progress line per run on stderr: rewritten in place on a terminal, otherwise printed
// every tenth of the run (and at its end), so logs stay short.
class ProgressLine {
 public:
  explicit ProgressLine(bool quiet);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  void show(const char* line, double done, double total);

 private:
  bool quiet_, tty_, shown_ = false;
  double last_printed_ = 0;
};

// "88.10%" (the first five characters of the percentage), or "  -  " before the first
// evaluation (a negative accuracy).
std::string accuracy_text(double accuracy);

// --kernels.
runtime::KernelBackend kernel_backend(const SimSettings& settings);

// Writes `parameters` to --save-model in the server's checkpoint format (sealed, with its
// model keys): `edgetrain-server evaluate`, --init-from and server/checkpoint_to_torch.py
// take the file as it is. Prints the file and the accuracy on stdout.
void save_model(const SimSettings& settings, const std::vector<float>& parameters,
                std::uint64_t version, const std::string& label, double final_accuracy);

}  // namespace edgetrain::sim
