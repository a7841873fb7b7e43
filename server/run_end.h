// Ending a run and keeping its result (server/README.md, "Ending a run and keeping the
// model"): the stop conditions the serving loop checks, the best checkpoint by test
// accuracy kept next to the latest one, and reading a checkpoint file back for
// `edgetrain-server evaluate` and for a warm start (--init-from).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "model/model.h"
#include "server/evaluator.h"

namespace edgetrain::server {

// 0 turns a condition off.
struct StopSettings {
  double at_accuracy = 0;  // an evaluation reached at least this test accuracy
  std::uint64_t after_updates =
      0;  // the model's version (updates applied since the state directory began)
  double after_seconds = 0;  // wall time since this server started
};

struct StopReason {
  // "accuracy", "updates", "seconds" or, from the mode, "privacy" (the stats file's
  // stop.condition)
  std::string condition;
  std::string detail;     // for a person
};

class StopConditions {
 public:
  explicit StopConditions(StopSettings settings) : settings_(settings) {}
  // From the evaluator thread.
  void note_evaluation(const EvaluationResult& result);
  // From the serving thread: the first condition that holds, if any.
  std::optional<StopReason> check(std::uint64_t version, double seconds_running) const;
  bool any() const {
    return settings_.at_accuracy > 0 || settings_.after_updates > 0 || settings_.after_seconds > 0;
  }
  std::string describe() const;  // "stop at test accuracy 0.95, after 10000 updates"

 private:
  StopSettings settings_;
  mutable std::mutex mutex_;
  std::optional<EvaluationResult> reached_;  // the first evaluation at or above at_accuracy
};

// A checkpoint file read back: its model (with the file's parameters) and metadata.
struct CheckpointFile {
  runtime::Model model;
  std::map<std::string, std::string> metadata;
  std::uint64_t version = 0;  // edgetrain.version, 0 when absent
};

// Reads a checkpoint that edgetrain-server wrote (checkpoint.safetensors, its .prev, or
// best.safetensors). `model_argument` (a built-in name or a spec) names the model; empty:
// the file's edgetrain.model. Throws std::runtime_error with the reason when the file is
// missing, damaged (its edgetrain.crc32 does not match) or holds another model.
CheckpointFile read_checkpoint_file(const std::filesystem::path& path,
                                    const std::string& model_argument);

// --init-from's reading: the same, except that a plain safetensors file with no
// edgetrain.crc32 at all (not written by edgetrain-server nor sealed by
// tools/onnx_to_edgetrain.py) is read too, with `unsealed` set so the caller can warn that its
// bytes were not checked; a checksum that is there and does not match is refused as above.
CheckpointFile read_start_file(const std::filesystem::path& path, const std::string& model_argument,
                               bool& unsealed);

// The same with the model given: a checkpoint of exactly `model` (its layout id), e.g. one
// shard's (runtime::shard_model()).
CheckpointFile read_checkpoint_file(const std::filesystem::path& path, runtime::Model model);

// The model of a sharded server (server/README.md, "Sharded server") put together from its
// shards' checkpoints, given in shard order (N paths: shards 0..N-1 of N), and each shard's
// version. Throws like read_checkpoint_file(), naming the file, when one is missing,
// damaged, or another shard's or another shard count's.
struct ShardCheckpoints {
  runtime::Model model;
  std::vector<std::uint64_t> versions;
};
ShardCheckpoints read_shard_checkpoints(const std::vector<std::filesystem::path>& paths,
                                        const std::string& model_argument);

// The __metadata__ strings of a safetensors file, without loading its tensors or checking
// its checksum. Throws std::runtime_error when the file cannot be read or has no header.
std::map<std::string, std::string> checkpoint_metadata(const std::filesystem::path& path);

// The best checkpoint by test accuracy: <state-dir>/best.safetensors, written atomically
// with the checksum of every checkpoint and, in its metadata, edgetrain.version,
// edgetrain.test_accuracy, edgetrain.test_loss and edgetrain.eval_data. A best file already
// there (from before a restart) counts when it was evaluated on the same data.
class BestCheckpoint {
 public:
  using Log = std::function<void(const std::string&)>;
  BestCheckpoint(std::filesystem::path state_dir, runtime::Model model, std::string eval_data,
                 Log log);
  // From the evaluator thread: writes the file when `result` beats the best so far.
  void offer(const EvaluationResult& result);
  // Any thread.
  std::optional<EvaluationResult> best() const;
  std::filesystem::path path() const { return path_; }

 private:
  std::filesystem::path path_;
  runtime::Model model_;
  std::string eval_data_;
  Log log_;
  mutable std::mutex mutex_;
  std::optional<EvaluationResult> best_;  // without parameters
};

inline constexpr const char* kBestCheckpointName = "best.safetensors";

}  // namespace edgetrain::server
