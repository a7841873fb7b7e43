// edgetrain-fleet-eval: the test accuracy of a decentralised run (gossip peers' checkpoints,
// worker/gossip_peer.h): each peer's model, their mean, least and greatest, and the
// consensus model (the average of all peers' parameters), as JSON for scripts. With
// --shards, the checkpoints are a sharded server's (server/README.md, "Sharded server"),
// and the one model they make together is evaluated.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/atomic_file.h"
#include "common/settings.h"
#include "model/dataset.h"
#include "model/model.h"
#include "server/evaluator.h"
#include "server/run_end.h"

namespace {

struct FleetEvalSettings {
  std::string data = "mnist", model = "paper-cnn", out;
  std::vector<std::string> checkpoints;
  std::size_t examples = 0;
  bool shards = false;
};

// --shards: the model put together from the shards' checkpoints, in shard order.
int evaluate_shards(const FleetEvalSettings& s, const edgetrain::runtime::Dataset& test) {
  using namespace edgetrain;
  // A running shard replaces its checkpoint by renaming it to checkpoint.prev.safetensors
  // and the new one into place, so for a moment there is none: read again, for up to 2 s,
  // before calling a checkpoint missing.
  std::optional<server::ShardCheckpoints> assembled;
  for (int attempt = 1; !assembled; ++attempt) {
    try {
      assembled.emplace(
          server::read_shard_checkpoints({s.checkpoints.begin(), s.checkpoints.end()}, s.model));
    } catch (const std::exception& e) {
      if (attempt == 40) {
        std::fprintf(stderr, "edgetrain-fleet-eval: %s\n", e.what());
        return 2;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  const server::EvaluationResult r =
      server::evaluate_parameters(assembled->model, assembled->model.parameters(), test);
  std::uint64_t version = 0;
  for (std::uint64_t v : assembled->versions) version += v;
  const nlohmann::json j = {{"accuracy", r.accuracy},  {"loss", r.loss},
                            {"version", version},      {"shard_versions", assembled->versions},
                            {"shards", s.checkpoints}, {"test_examples", test.size()}};
  if (s.out.empty())
    std::cout << j.dump(2) << "\n";
  else
    common::write_file_atomically(s.out, j.dump(2) + "\n");
  std::fprintf(stderr,
               "edgetrain-fleet-eval: the model of %zu shards (versions sum to %llu): %.2f%%\n",
               s.checkpoints.size(), static_cast<unsigned long long>(version), 100 * r.accuracy);
  return 0;
}

int run(const FleetEvalSettings& s) {
  using namespace edgetrain;
  if (s.checkpoints.empty()) {
    std::fprintf(stderr,
                 "edgetrain-fleet-eval: give the peers' checkpoints (peer.safetensors files)\n");
    return 2;
  }
  runtime::Dataset test = runtime::load_named_dataset(s.data, runtime::DataSplit::kTest);
  if (s.examples > 0 && s.examples < test.size()) {
    std::vector<std::uint32_t> first(s.examples);
    for (std::uint32_t i = 0; i < first.size(); ++i) first[i] = i;
    test = runtime::subset(test, first);
  }
  if (s.shards) return evaluate_shards(s, test);
  runtime::Model model(runtime::model_spec_from_argument(s.model));
  std::vector<double> consensus(model.parameter_count(), 0.0);
  nlohmann::json peers = nlohmann::json::array();
  std::vector<double> accuracies;
  for (const std::string& path : s.checkpoints) {
    std::map<std::string, std::string> metadata;
    try {
      metadata = model.load_safetensors(path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "edgetrain-fleet-eval: %s\n", e.what());
      return 2;
    }
    const server::EvaluationResult r = server::evaluate_parameters(model, model.parameters(), test);
    for (std::size_t i = 0; i < consensus.size(); ++i) consensus[i] += model.parameters()[i];
    accuracies.push_back(r.accuracy);
    nlohmann::json peer = {{"file", path}, {"accuracy", r.accuracy}, {"loss", r.loss}};
    if (const auto it = metadata.find("edgetrain.gossip.iteration"); it != metadata.end())
      peer["iteration"] = std::stoull(it->second);
    if (const auto it = metadata.find("edgetrain.gossip.peer"); it != metadata.end())
      peer["peer"] = it->second;
    peers.push_back(peer);
  }
  std::vector<float> average(consensus.size());
  for (std::size_t i = 0; i < consensus.size(); ++i)
    average[i] = static_cast<float>(consensus[i] / s.checkpoints.size());
  const server::EvaluationResult c = server::evaluate_parameters(model, average, test);
  double mean = 0;
  for (double a : accuracies) mean += a;
  mean /= static_cast<double>(accuracies.size());
  const nlohmann::json j = {
      {"peers", peers},
      {"mean_accuracy", mean},
      {"min_accuracy", *std::min_element(accuracies.begin(), accuracies.end())},
      {"max_accuracy", *std::max_element(accuracies.begin(), accuracies.end())},
      {"consensus_accuracy", c.accuracy},
      {"consensus_loss", c.loss},
      {"test_examples", test.size()}};
  if (s.out.empty())
    std::cout << j.dump(2) << "\n";
  else
    common::write_file_atomically(s.out, j.dump(2) + "\n");
  std::fprintf(stderr,
               "edgetrain-fleet-eval: %zu peers: mean %.2f%% (min %.2f%%, max %.2f%%), consensus "
               "model %.2f%%\n",
               accuracies.size(), 100 * mean, 100 * j["min_accuracy"].get<double>(),
               100 * j["max_accuracy"].get<double>(), 100 * c.accuracy);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  FleetEvalSettings s;
  edgetrain::settings::Table t(
      "edgetrain-fleet-eval",
      "edgetrain-fleet-eval: test accuracy of every gossip peer's checkpoint, their spread, and "
      "of the consensus\nmodel (the peers' average), as JSON.");
  t.add("data", s.data,
        "mnist, mnist-small, fashion-mnist or a directory (its test split is used)");
  t.add("model", s.model,
        "the peers' model: paper-cnn, mlp, mobilenet-mini, resnet-8, resnet-8-32x32x3, ds-cnn, "
        "cnn1d or a spec");
  t.add("examples", s.examples, "evaluate on the first N test examples only (0: all)");
  t.add("out", s.out, "write the JSON here (default: standard output)");
  t.add("shards", s.shards,
        "the checkpoints are the shards of one sharded server, in shard order (each one's "
        "checkpoint.safetensors): evaluate the model they make together (JSON: accuracy, loss, "
        "version = the sum of the shards' versions, shard_versions)");
  t.positional("checkpoints", s.checkpoints,
               "the peers' peer.safetensors files (with --shards: the shards' checkpoints)");
  return t.run_program(argc, argv, [&] { return run(s); });
}
