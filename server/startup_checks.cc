#include "server/startup_checks.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/model_shards.h"
#include "server/keystore.h"
#include "server/parameter_store.h"
#include "server/run_end.h"
#include "server/write_ahead_log.h"

namespace edgetrain::server {
namespace {

bool writable_directory(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::is_directory(path, error) && ::access(path.c_str(), W_OK | X_OK) == 0;
}

void check_listen_address(const std::string& listen) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(listen.c_str(), nullptr, &hints, &found);
  if (found) ::freeaddrinfo(found);
  if (rc != 0)
    throw StartupError("--listen " + listen + ": not an address of this machine (" +
                       gai_strerror(rc) + ")");
}

// The state directory, or (while it does not exist) the nearest existing directory above
// it, must let the server create files; nothing is created here.
void check_state_dir(const std::filesystem::path& state_dir) {
  std::error_code error;
  if (std::filesystem::exists(state_dir, error)) {
    if (!writable_directory(state_dir))
      throw StartupError("--state-dir " + state_dir.string() +
                         ": not a directory this user can write to");
    return;
  }
  std::filesystem::path above = std::filesystem::absolute(state_dir, error).parent_path();
  while (!above.empty() && !std::filesystem::exists(above, error) && above != above.root_path())
    above = above.parent_path();
  if (!writable_directory(above))
    throw StartupError("--state-dir " + state_dir.string() + ": cannot be created (" +
                       above.string() + " is not a directory this user can write to)");
}

void check_readable_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error) || !std::ifstream(path))
    throw StartupError(flag + " " + path + ": no readable file there");
}

void check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::filesystem::path directory = std::filesystem::path(path).parent_path();
  if (directory.empty()) directory = ".";
  if (!writable_directory(directory))
    throw StartupError(flag + " " + path + ": " + directory.string() +
                       " is not a directory this user can write to");
}

// A state directory holding another model's run is refused here, before recovery touches
// it. Only the model id is compared: a damaged checkpoint is recovery's to handle.
void check_state_dir_model(const std::filesystem::path& state_dir, const runtime::Model& model) {
  const std::filesystem::path checkpoint = state_dir / "checkpoint.safetensors";
  std::error_code error;
  if (!std::filesystem::exists(checkpoint, error)) return;
  std::map<std::string, std::string> metadata;
  try {
    metadata = checkpoint_metadata(checkpoint);
  } catch (const std::exception&) {
    return;
  }
  const auto id = metadata.find("edgetrain.model_id");
  if (id == metadata.end() || id->second == std::to_string(model.layout_id())) return;
  const auto name = metadata.find("edgetrain.model");
  // A shard's model name says which shard of how many ("mlp shard 1/3"): another --shard
  // (or none) is refused here like another --model.
  throw StartupError("--model " + model.spec().name + ": the state directory " +
                     state_dir.string() + " holds a run of another model" +
                     (name == metadata.end() ? "" : " ('" + name->second + "')") +
                     "; use a new state directory for a new model or another --shard");
}

// 0.05f as "0.05", not "0.050000".
std::string shortest(float value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

// A state directory whose WAL was written with another learning rate or staleness bound is
// refused here too: replay needs the settings the updates were applied with (recovery would
// refuse it later, after the keystore and the data are loaded). A WAL that cannot be read is
// recovery's to handle.
void check_state_dir_settings(const std::filesystem::path& state_dir, const ServerSettings& s) {
  for (const char* name : {"wal.log", "wal.prev.log"}) {
    const std::filesystem::path path = state_dir / name;
    std::error_code error;
    if (!std::filesystem::exists(path, error)) continue;
    WalHeader header;
    try {
      header = read_wal_header(path);
    } catch (const WalError&) {
      return;
    }
    std::string differences;
    if (header.learning_rate != static_cast<float>(s.lr))
      differences += "--lr " + shortest(header.learning_rate) + " (not " +
                     shortest(static_cast<float>(s.lr)) + ")";
    if (header.max_staleness != s.max_staleness)
      differences += std::string(differences.empty() ? "" : ", ") + "--max-staleness " +
                     std::to_string(header.max_staleness) + " (not " +
                     std::to_string(s.max_staleness) + ")";
    if (wal_offline_step_credit(header.staleness_rule) != s.offline_step_credit)
      differences += std::string(differences.empty() ? "" : ", ") + "--offline-step-credit " +
                     std::to_string(wal_offline_step_credit(header.staleness_rule)) + " (not " +
                     std::to_string(s.offline_step_credit) + ")";
    if (wal_offline_average(header.staleness_rule) != s.offline_average)
      differences += std::string(differences.empty() ? "" : ", ") + "--offline-average " +
                     (wal_offline_average(header.staleness_rule) ? "on" : "off") + " (not " +
                     (s.offline_average ? "on" : "off") + ")";
    const bool scheduled = !s.lr_decay_at.empty();
    const std::vector<std::uint64_t> decay_at = parse_lr_decay_at(s.lr_decay_at);
    const float factor = scheduled ? static_cast<float>(s.lr_decay_factor) : 0.0f;
    if (header.lr_decay_at != decay_at || header.lr_decay_factor != factor) {
      const auto schedule = [](const std::vector<std::uint64_t>& at, float by) {
        return at.empty() ? std::string("none")
                          : format_lr_decay_at(at) + " --lr-decay-factor " + shortest(by);
      };
      differences += std::string(differences.empty() ? "" : ", ") + "--lr-decay-at " +
                     schedule(header.lr_decay_at, header.lr_decay_factor) + " (not " +
                     schedule(decay_at, factor) + ")";
    }
    if (differences.empty()) return;
    throw StartupError(
        "the state directory " + state_dir.string() + " was trained with " + differences +
        ", and replaying its log needs the same settings: start with them, or use a new state "
        "directory (--init-from " +
        (state_dir / "checkpoint.safetensors").string() + " carries the model over)");
  }
}

bool holds_a_run(const std::filesystem::path& state_dir) {
  for (const char* name :
       {"checkpoint.safetensors", "checkpoint.prev.safetensors", "wal.log", "wal.prev.log"})
    if (std::filesystem::exists(state_dir / name)) return true;
  return false;
}

// What must be true of a data set for evaluation: both files there (raw or .gz), images of
// the model's input shape.
void load_eval_data(const ServerSettings& s, const runtime::Model& model, StartPlan& plan) {
  if (s.eval_data == "none") return;
  const runtime::DatasetFiles files =
      runtime::dataset_files(s.eval_data, runtime::DataSplit::kTest);
  std::error_code error;
  // A described data set (edgetrain-data.toml) is there when its description is; what it
  // names is checked as it loads.
  const bool present =
      runtime::is_described_dataset(s.eval_data) || (std::filesystem::exists(files.images, error) &&
                                                     std::filesystem::exists(files.labels, error));
  if (!present) {
    const std::string missing = "the test set of --eval-data " + s.eval_data +
                                " is not there (looked for " + files.images.string() + " and " +
                                files.labels.string() + ", raw or .gz)";
    if (!s.eval_data_optional)
      throw StartupError(
          missing +
          "; set eval_data = \"none\" to run without evaluation, or eval_data_optional = true "
          "to evaluate only where the data is present");
    plan.eval_note = "evaluation off: " + missing + " (--eval-data-optional)";
    return;
  }
  try {
    plan.eval_data = runtime::load_named_dataset(s.eval_data, runtime::DataSplit::kTest);
  } catch (const std::exception& e) {
    throw StartupError("--eval-data " + s.eval_data + ": " + e.what());
  }
  const runtime::ExampleShape input = model.input_shape();
  if (plan.eval_data->height != static_cast<std::uint32_t>(input.H) ||
      plan.eval_data->width != static_cast<std::uint32_t>(input.W) ||
      plan.eval_data->channels != static_cast<std::uint32_t>(input.C))
    throw StartupError(
        "--eval-data " + s.eval_data + ": images of " + std::to_string(plan.eval_data->height) +
        "x" + std::to_string(plan.eval_data->width) + "x" +
        std::to_string(plan.eval_data->channels) + ", but model " + model.spec().name + " takes " +
        std::to_string(input.H) + "x" + std::to_string(input.W) + "x" + std::to_string(input.C));
  // A label past the model's outputs would index past its logits.
  if (model.num_classes() < static_cast<int>(plan.eval_data->num_classes))
    throw StartupError("--eval-data " + s.eval_data + ": " +
                       std::to_string(plan.eval_data->num_classes) + " classes, but model " +
                       model.spec().name + " has " + std::to_string(model.num_classes()) +
                       " outputs");
}

void load_init_from(const ServerSettings& s, StartPlan& plan) {
  if (s.init_from.empty()) return;
  const CheckpointFile start = [&] {
    try {
      return read_start_file(s.init_from, s.model, plan.init_from_unsealed);
    } catch (const std::exception& e) {
      throw StartupError(std::string("--init-from: ") + e.what());
    }
  }();
  const auto checksum = start.metadata.find("edgetrain.crc32");
  plan.init_from_identity =
      std::filesystem::absolute(s.init_from).string() + " crc32 " +
      (checksum == start.metadata.end() ? std::string("none") : checksum->second);
  const std::filesystem::path state_dir = s.state_dir;
  if (holds_a_run(state_dir)) {
    // A restart of a warm-started run (the same command line under systemd) resumes it.
    std::ifstream record(state_dir / kInitFromRecordName);
    const auto recorded = nlohmann::json::parse(record, nullptr, false);
    if (record && !recorded.is_discarded() &&
        recorded.value("source", "") == plan.init_from_identity) {
      plan.init_from_already_applied = true;
      return;
    }
    throw StartupError(
        "--init-from " + s.init_from + ": the state directory " + s.state_dir +
        " already holds a run; warm start only a new (empty or missing) state directory");
  }
  plan.initial_parameters.emplace(start.model.parameters().begin(), start.model.parameters().end());
}

}  // namespace

StartPlan check_startup(const ServerSettings& s) {
  std::optional<runtime::Model> model;
  try {
    model.emplace(runtime::model_spec_from_argument(s.model));
  } catch (const std::exception& e) {
    throw StartupError(std::string("--model: ") + e.what());
  }
  if (const auto shard = runtime::parse_shard_id(s.shard)) {
    try {
      model.emplace(runtime::shard_model(*model, *shard));
    } catch (const std::invalid_argument& e) {
      throw StartupError("--shard " + s.shard + ": " + e.what());
    }
  }
  check_listen_address(s.listen);
  check_state_dir(s.state_dir);
  check_state_dir_model(s.state_dir, *model);
  check_state_dir_settings(s.state_dir, s);
  if (!s.keystore.empty()) {
    try {
      Keystore::load(s.keystore);
    } catch (const std::exception& e) {
      throw StartupError(std::string("--keystore: ") + e.what());
    }
  }
  check_readable_file("--cert", s.cert);
  check_readable_file("--cert-key", s.cert_key);
  check_readable_file("--ca", s.ca);
  check_output_file("--port-file", s.port_file);
  check_output_file("--stats-file", s.stats_file);
  StartPlan plan;
  load_eval_data(s, *model, plan);
  if (s.stop_at_accuracy > 0 && !plan.eval_data)
    throw StartupError("--stop-at-accuracy needs evaluation: no test set (" +
                       (plan.eval_note.empty() ? std::string("--eval-data none") : plan.eval_note) +
                       ")");
  load_init_from(s, plan);
  return plan;
}

}  // namespace edgetrain::server
