#include "server/run_end.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "model/model_shards.h"
#include "server/checkpoint_file.h"
#include "server/durable_file.h"

namespace edgetrain::server {
namespace {

std::string fixed(double value, int digits) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

std::vector<std::uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open the checkpoint " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The __metadata__ strings of a safetensors file, read before the model is known.
std::map<std::string, std::string> header_metadata(std::span<const std::uint8_t> bytes,
                                                   const std::string& name) {
  std::uint64_t length = 0;
  if (bytes.size() >= 8) std::memcpy(&length, bytes.data(), 8);
  if (bytes.size() < 8 || length > bytes.size() - 8)
    throw std::runtime_error(name + " is not a safetensors file");
  std::map<std::string, std::string> metadata;
  const auto header = nlohmann::json::parse(
      bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(length), nullptr, false);
  if (header.is_discarded() || !header.is_object())
    throw std::runtime_error(name + ": the safetensors header is not JSON");
  if (auto it = header.find("__metadata__"); it != header.end() && it->is_object())
    for (auto m = it->begin(); m != it->end(); ++m)
      if (m->is_string()) metadata[m.key()] = m->get<std::string>();
  return metadata;
}

std::uint64_t number_in(const std::map<std::string, std::string>& metadata,
                        const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return 0;
  try {
    return std::stoull(it->second);
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

void StopConditions::note_evaluation(const EvaluationResult& result) {
  if (settings_.at_accuracy <= 0 || result.accuracy < settings_.at_accuracy) return;
  std::lock_guard lock(mutex_);
  if (!reached_) {
    reached_ = result;
    reached_->parameters.clear();
  }
}

std::optional<StopReason> StopConditions::check(std::uint64_t version,
                                                double seconds_running) const {
  {
    std::lock_guard lock(mutex_);
    if (reached_)
      return StopReason{"accuracy", "test accuracy " + fixed(reached_->accuracy, 4) +
                                        " at version " + std::to_string(reached_->version) +
                                        " reached --stop-at-accuracy " +
                                        fixed(settings_.at_accuracy, 4)};
  }
  if (settings_.after_updates > 0 && version >= settings_.after_updates)
    return StopReason{"updates", "version " + std::to_string(version) +
                                     " reached --stop-after-updates " +
                                     std::to_string(settings_.after_updates)};
  if (settings_.after_seconds > 0 && seconds_running >= settings_.after_seconds)
    return StopReason{"seconds", fixed(seconds_running, 1) + " s reached --stop-after-seconds " +
                                     fixed(settings_.after_seconds, 1)};
  return std::nullopt;
}

std::string StopConditions::describe() const {
  std::string text;
  auto add = [&](const std::string& part) { text += (text.empty() ? "" : ", ") + part; };
  if (settings_.at_accuracy > 0) add("at test accuracy " + fixed(settings_.at_accuracy, 4));
  if (settings_.after_updates > 0)
    add("after " + std::to_string(settings_.after_updates) + " updates");
  if (settings_.after_seconds > 0) add("after " + fixed(settings_.after_seconds, 1) + " s");
  return text.empty() ? "none (runs until SIGTERM)" : "stop " + text;
}

namespace {

// A sealed checkpoint's bytes into `model`, which must be the model its metadata names.
CheckpointFile read_checkpoint_bytes(const std::filesystem::path& path,
                                     const std::vector<std::uint8_t>& bytes,
                                     const std::map<std::string, std::string>& header,
                                     runtime::Model model, const std::string& model_name) {
  if (header.count("edgetrain.model_id") &&
      number_in(header, "edgetrain.model_id") != model.layout_id())
    throw std::runtime_error(path.string() + " holds another model than '" + model_name + "'" +
                             (header.count("edgetrain.model")
                                  ? " (its metadata says '" + header.at("edgetrain.model") + "')"
                                  : std::string()));
  try {
    std::map<std::string, std::string> metadata =
        model.load_safetensors_bytes(bytes, path.string());
    const std::uint64_t version = number_in(metadata, "edgetrain.version");
    return {std::move(model), std::move(metadata), version};
  } catch (const runtime::ModelError& e) {
    throw std::runtime_error(std::string(e.what()) + " (is it a checkpoint of model '" +
                             model_name + "'?)");
  }
}

// A checkpoint's bytes, their seal already checked, into the model its metadata (or
// `model_argument`) names.
CheckpointFile checkpoint_of_bytes(const std::filesystem::path& path,
                                   const std::vector<std::uint8_t>& bytes,
                                   const std::string& model_argument) {
  const std::map<std::string, std::string> header = header_metadata(bytes, path.string());
  std::string model_name = model_argument;
  if (model_name.empty()) {
    auto it = header.find("edgetrain.model");
    if (it == header.end())
      throw std::runtime_error(path.string() + " does not name its model: give --model");
    model_name = it->second;
  }
  return read_checkpoint_bytes(path, bytes, header,
                               runtime::Model(runtime::model_spec_from_argument(model_name)),
                               model_name);
}

// `unsealed` null: a file without edgetrain's seal is damaged; else one with no checksum key
// at all is read and *unsealed set.
CheckpointFile read_named_checkpoint(const std::filesystem::path& path,
                                     const std::string& model_argument, bool* unsealed) {
  if (!std::filesystem::is_regular_file(path))
    throw std::runtime_error("no checkpoint file at " + path.string());
  const std::vector<std::uint8_t> bytes = read_bytes(path);
  const CheckpointCheck check = check_checkpoint_seal(bytes);
  const bool without_checksum = check.seal == CheckpointSeal::kDamaged && unsealed &&
                                !header_metadata(bytes, path.string()).count(kCheckpointChecksumKey);
  if (unsealed) *unsealed = without_checksum;
  if (check.seal == CheckpointSeal::kDamaged && !without_checksum)
    throw std::runtime_error("the checkpoint " + path.string() + " is damaged: " + check.problem);
  return checkpoint_of_bytes(path, bytes, model_argument);
}

}  // namespace

CheckpointFile read_start_file(const std::filesystem::path& path, const std::string& model_argument,
                               bool& unsealed) {
  return read_named_checkpoint(path, model_argument, &unsealed);
}

CheckpointFile read_checkpoint_file(const std::filesystem::path& path,
                                    const std::string& model_argument) {
  return read_named_checkpoint(path, model_argument, nullptr);
}

CheckpointFile read_checkpoint_file(const std::filesystem::path& path, runtime::Model model) {
  if (!std::filesystem::is_regular_file(path))
    throw std::runtime_error("no checkpoint file at " + path.string());
  const std::vector<std::uint8_t> bytes = read_bytes(path);
  const CheckpointCheck check = check_checkpoint_seal(bytes);
  if (check.seal == CheckpointSeal::kDamaged)
    throw std::runtime_error("the checkpoint " + path.string() + " is damaged: " + check.problem);
  const std::string name = model.spec().name;
  return read_checkpoint_bytes(path, bytes, header_metadata(bytes, path.string()), std::move(model),
                               name);
}

ShardCheckpoints read_shard_checkpoints(const std::vector<std::filesystem::path>& paths,
                                        const std::string& model_argument) {
  if (paths.empty()) throw std::runtime_error("no shard checkpoints given");
  runtime::Model full(runtime::model_spec_from_argument(model_argument));
  if (paths.size() > full.parameter_count())
    throw std::runtime_error("more shards than parameters");
  const auto count = static_cast<std::uint32_t>(paths.size());
  std::vector<std::uint64_t> versions;
  for (std::uint32_t i = 0; i < count; ++i) {
    const runtime::ShardId shard{i, count};
    CheckpointFile file = read_checkpoint_file(paths[i], runtime::shard_model(full, shard));
    const std::uint64_t first = runtime::shard_range(full.parameter_count(), shard).first;
    const std::span<const float> slice = file.model.parameters();
    std::copy(slice.begin(), slice.end(),
              full.parameters().begin() + static_cast<std::ptrdiff_t>(first));
    versions.push_back(file.version);
  }
  return {std::move(full), std::move(versions)};
}

std::map<std::string, std::string> checkpoint_metadata(const std::filesystem::path& path) {
  return header_metadata(read_bytes(path), path.string());
}

BestCheckpoint::BestCheckpoint(std::filesystem::path state_dir, runtime::Model model,
                               std::string eval_data, Log log)
    : path_(std::move(state_dir) / kBestCheckpointName),
      model_(std::move(model)),
      eval_data_(std::move(eval_data)),
      log_(std::move(log)) {
  if (!std::filesystem::exists(path_)) return;
  try {
    const std::vector<std::uint8_t> bytes = read_bytes(path_);
    const CheckpointCheck check = check_checkpoint_seal(bytes);
    if (check.seal == CheckpointSeal::kDamaged)
      throw std::runtime_error("damaged: " + check.problem);
    runtime::Model kept = model_;
    const std::map<std::string, std::string> metadata =
        kept.load_safetensors_bytes(bytes, path_.string());
    if (metadata.count("edgetrain.eval_data") && metadata.at("edgetrain.eval_data") == eval_data_) {
      EvaluationResult result;
      result.version = number_in(metadata, "edgetrain.version");
      result.accuracy = std::stod(metadata.at("edgetrain.test_accuracy"));
      result.loss = std::stod(metadata.at("edgetrain.test_loss"));
      best_ = result;
    }
  } catch (const std::exception& e) {
    if (log_)
      log_(std::string("the best checkpoint so far is unreadable and will be replaced: ") +
           e.what());
  }
}

void BestCheckpoint::offer(const EvaluationResult& result) {
  {
    std::lock_guard lock(mutex_);
    if (best_ && result.accuracy <= best_->accuracy) return;
  }
  std::copy(result.parameters.begin(), result.parameters.end(), model_.parameters().begin());
  const std::map<std::string, std::string> metadata = {
      {"edgetrain.kind", "best"},
      {"edgetrain.version", std::to_string(result.version)},
      {"edgetrain.model_id", std::to_string(model_.layout_id())},
      {"edgetrain.model", model_.spec().name},
      {"edgetrain.test_accuracy", fixed(result.accuracy, 6)},
      {"edgetrain.test_loss", fixed(result.loss, 6)},
      {"edgetrain.eval_data", eval_data_},
  };
  try {
    write_file_atomically(path_, sealed_checkpoint_bytes(model_, metadata));
  } catch (const std::exception& e) {
    if (log_) log_(std::string("best checkpoint not written: ") + e.what());
    return;
  }
  EvaluationResult kept = result;
  kept.parameters.clear();
  std::lock_guard lock(mutex_);
  best_ = kept;
}

std::optional<EvaluationResult> BestCheckpoint::best() const {
  std::lock_guard lock(mutex_);
  return best_;
}

}  // namespace edgetrain::server
