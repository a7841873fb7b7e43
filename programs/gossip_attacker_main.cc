// edgetrain-gossip-attacker: a hostile gossip peer, for experiments only (issue 37 part 4;
// host only, never packaged for a board: edgetrain-worker carries no attack code). It is
// `edgetrain-worker --mode gossip`, with the same settings table, training, protocol,
// certificates, checkpoints and stats file, except that every model it lets a neighbour see
// (its published copy; with ad-psgd the models it posts and answers) is rewritten by
// --attack (sim/model_attack.h: the simulator's malicious peers do the same), and it never
// mixes its neighbours' models into its own: it trains on its shard alone, and still pulls
// its neighbours (D-PSGD's barrier), so it keeps the fleet's pace. edgetrain-emulate
// --malicious-peers N runs it as peers 0..N-1 (emulation/README.md "Gossip runs").
#include <cstddef>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <utility>

#include "common/settings.h"
#include "model/model.h"
#include "sim/model_attack.h"
#include "worker/worker_exit_codes.h"
#include "worker/worker_program.h"

namespace {

constexpr const char* kProgram = "edgetrain-gossip-attacker";

int refuse(const std::string& why) {
  std::fprintf(stderr, "%s: %s\n", kProgram, why.c_str());
  return edgetrain::runtime::exit_status(edgetrain::runtime::WorkerExit::kBadSettings);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace edgetrain;
  runtime::WorkerSettings settings;
  settings.mode = "gossip";
  std::string attack = "bias:1e30";
  settings::Table table(
      kProgram,
      "edgetrain-gossip-attacker: an experiment's malicious gossip peer (host only). Takes "
      "edgetrain-worker's settings\n"
      "(--mode gossip only) and trains like it on its shard, but publishes, posts and answers a "
      "poisoned copy of its\n"
      "model (--attack) and never mixes its neighbours' models into its own.");
  runtime::declare_worker_settings(table, settings);
  table.group("Attack (ours, an experiment's knob: sim/README.md \"Malicious neighbours\")");
  table.add("attack", attack,
            "what the neighbours see of this peer's model: bias:V (the output layer's bias set to "
            "V) or scale:F (the model times F), as edgetrain-sim --attack");
  table.footer(runtime::worker_exit_codes_help());
  return table.run_program(argc, argv, [&] {
    if (settings.mode != "gossip")
      return refuse("only a gossip peer can be an attacker: --mode " + settings.mode +
                    " refused (use --mode gossip)");
    sim::ModelAttack parsed;
    std::pair<std::size_t, std::size_t> bias;  // the output layer's bias, for bias:V
    try {
      parsed = sim::parse_model_attack(attack);
      bias = sim::output_bias_range(
          runtime::Model(runtime::model_spec_from_argument(settings.config.model)));
    } catch (const std::exception& e) {
      return refuse(e.what());
    }
    settings.gossip.outgoing = [parsed, bias](std::span<float> parameters) {
      sim::apply_model_attack(parsed, parameters, bias);
    };
    settings.gossip.mix_neighbours = false;
    std::fprintf(stderr,
                 "%s: ATTACKER: this peer's neighbours get its model with --attack %s applied; "
                 "it never mixes theirs in\n",
                 kProgram, attack.c_str());
    return runtime::run_worker_program(settings, kProgram);
  });
}
