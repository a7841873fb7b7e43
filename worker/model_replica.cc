#include "worker/model_replica.h"

#include <stdexcept>

namespace edgetrain::runtime {

ModelReplica::ModelReplica(std::uint64_t model_id, std::vector<std::uint32_t> tensor_sizes,
                           bool dense_pull)
    : model_id_(model_id), tensor_sizes_(std::move(tensor_sizes)), dense_pull_(dense_pull) {}

std::string ModelReplica::pull_path() const {
  if (dense_pull_ || !exact_) return "model";
  return "model?since=" + std::to_string(version_) +
         (limits_.accept_fp16_increment_delta_values ? "&values=fp16-increment" : "");
}

void ModelReplica::assume(std::uint64_t version, std::span<const float> parameters) {
  parameters_.assign(parameters.begin(), parameters.end());
  version_ = version;
  exact_ = true;
}

ModelReplica::PullOutcome ModelReplica::take(std::span<const std::uint8_t> payload) {
  const transport::ModelLayout expected{model_id_, tensor_sizes_};
  if (transport::model_message_kind(payload) == transport::ModelMessageKind::kDelta) {
    auto delta = transport::decode_model_delta(payload, expected, limits_);
    if (!delta) {
      if (delta.error().code == transport::CodecErrorCode::kWrongModel)
        throw std::runtime_error("bad model delta: " + delta.error().message);
      // Whatever went wrong, a dense pull starts over from what the server holds.
      exact_ = false;
      mismatch_ = "undecodable model delta: " + delta.error().message;
      return PullOutcome::kMismatch;
    }
    // A delta we did not ask for, or for another base, cannot be applied to this copy.
    if (!exact_ || delta.value().base_version != version_) {
      exact_ = false;
      mismatch_ = "model delta from version " + std::to_string(delta.value().base_version) +
                  ", the copy is at " + std::to_string(version_);
      return PullOutcome::kMismatch;
    }
    // A server answers a repeated request with the same body (server/README.md, "Cheap
    // pull"), and increments, unlike values, would add twice: a same-version delta whose
    // digest the copy already has was applied already.
    if (delta.value().values == transport::ValueEncoding::kFp16Increment &&
        delta.value().base_version == delta.value().version &&
        transport::parameter_digest(parameters_) == delta.value().digest)
      return PullOutcome::kDelta;
    if (!transport::apply_model_delta(delta.value(), tensor_sizes_, parameters_) ||
        transport::parameter_digest(parameters_) != delta.value().digest) {
      exact_ = false;  // e.g. the server's state directory was replaced under the same versions
      mismatch_ = "model delta " + std::to_string(version_) + " -> " +
                  std::to_string(delta.value().version) +
                  " did not reproduce the server's parameters (digest differs)";
      return PullOutcome::kMismatch;
    }
    version_ = delta.value().version;
    return PullOutcome::kDelta;
  }
  // The new values take over the old copy's allocation (a good message only).
  auto dense = transport::decode_dense_model(payload, expected, {}, &parameters_);
  if (!dense) throw std::runtime_error("bad model: " + dense.error().message);
  parameters_ = std::move(dense.value().values);
  version_ = dense.value().version;
  exact_ = true;
  return PullOutcome::kDense;
}

}  // namespace edgetrain::runtime
