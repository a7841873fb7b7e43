// The worker's copy of the server's model and how it is kept current: the first pull (and
// any pull after the copy was found wrong) downloads the dense model, unless the copy was
// assumed (the seeded first pull: the model built from the run's seed, as version 0); later
// pulls ask only
// for what changed since the version held (GET /model?since=V, transport/CODEC.md "Model
// delta") and overwrite those entries. The copy then equals the server's model bit for bit,
// which the delta's digest confirms; on a mismatch the copy is dropped and the next pull is
// dense. Nothing else may write the parameters, or the copy would no longer be the version
// it claims to be.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/codec.h"

namespace edgetrain::runtime {

class ModelReplica {
 public:
  // `dense_pull`: always ask for the whole model (the paper's behaviour, byte for byte).
  ModelReplica(std::uint64_t model_id, std::vector<std::uint32_t> tensor_sizes,
               bool dense_pull = false);

  // The resource to GET next: "model", or "model?since=V" while the copy is exact.
  std::string pull_path() const;

  enum class PullOutcome {
    kDense,     // a dense model replaced the copy
    kDelta,     // a delta brought the copy to a newer version
    kMismatch,  // a delta that does not decode or fit the copy (base version, digest): copy
                // dropped, pull again
  };
  // Takes the payload of a 2.05 answer to GET pull_path(). Throws std::runtime_error when it
  // is a dense model that does not decode, or anything of another model (the copy is left
  // as it was).
  PullOutcome take(std::span<const std::uint8_t> payload);

  // Takes PARAMETERS as the model at VERSION without a pull: gossip peers, and an async
  // worker and its server, start from the same seeded initial model, so the first pull can
  // be a delta from it. A wrong guess costs one delta: its digest does not match, and the
  // next pull is dense.
  void assume(std::uint64_t version, std::span<const float> parameters);

  // Take model deltas whose values are fp16 increments (transport::ValueEncoding::
  // kFp16Increment: the cheap pull's option, server/replica_pull.h), added to the copy, and
  // say so in pull_path() ("model?since=V&values=fp16-increment"); off by default, when such
  // a delta counts as undecodable (kMismatch).
  void accept_fp16_increments(bool accept) { limits_.accept_fp16_increment_delta_values = accept; }

  bool exact() const { return exact_; }  // the copy is the server's model at version()
  std::uint64_t version() const { return version_; }
  std::span<const float> parameters() const { return parameters_; }
  // Why the last kMismatch happened, for the log.
  const std::string& mismatch() const { return mismatch_; }

 private:
  std::uint64_t model_id_;
  std::vector<std::uint32_t> tensor_sizes_;
  bool dense_pull_;
  bool exact_ = false;
  std::uint64_t version_ = 0;
  std::vector<float> parameters_;
  std::string mismatch_;
  transport::DecodeLimits limits_;  // for model deltas: which value encodings are taken
};

}  // namespace edgetrain::runtime
