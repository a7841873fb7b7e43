// The worker's side of a sharded server (server/README.md, "Sharded server"): one
// ServerChannel over N shard servers, each an ordinary edgetrain-server whose model is one
// range of the parameters (model/model_shards.h). The worker loop and its ModelReplica see
// one server of the whole model and stay as they are:
//   - a pull asks every shard for what changed since the version this channel holds of it,
//     reassembles the whole model in a copy of its own, and answers with the whole model, or
//     with a delta of the whole model when the worker holds the previous assembly;
//   - a push splits the worker's update by range into one update per shard (same sequence,
//     value encoding and identity, that shard's own t_fetch) and posts it to every shard,
//     also an empty one, so that every shard's version moves with every update.
// The version the worker sees is synthetic: the sum of the shard versions it was assembled
// from. The channel remembers the per-shard versions behind its recent sums, so an update's
// t_fetch maps back to each shard's exact t_fetch; a sum it no longer knows gets 4.09 (pull
// again), as a too stale update would.
//
// Shard answers are network input: decoded with the codec's caps against each shard's own
// layout, and a shard delta must reproduce that shard's digest.
//
// Not thread-safe (one worker loop calls it, like every ServerChannel).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "model/model_shards.h"
#include "worker/server_channel.h"
#include "transport/codec.h"

namespace edgetrain::runtime {

// How an update of the whole model is cut into the shards' updates: the channel's push
// below and edgetrain-loadgen's sharded load (tests/bench/loadgen.cc) both call it, so the
// load a benchmark puts on shard servers is the one workers send. Immutable after
// construction; its calls may run on any thread.
class ShardedUpdateSplitter {
 public:
  // Shards 0..shard_count-1 of `model` (model/model_shards.h). Throws std::invalid_argument
  // when shard_count is 0 or larger than the parameter count.
  ShardedUpdateSplitter(const Model& model, std::uint32_t shard_count);

  std::size_t shard_count() const { return layout_ids_.size(); }
  // Shard s's layout id (the codec's model id of its updates and models).
  std::uint64_t shard_layout_id(std::size_t s) const { return layout_ids_[s]; }

  // Fills parts[s] (resized to shard_count()) with shard s's piece of `update`: the entries
  // in its range, indexed within its own tensors, with the update's sequence and
  // fetched_versions[s] as t_fetch; a shard the update does not touch gets an update without
  // tensors (it still makes a version there). `update` must have decoded against the whole
  // model's layout (indices increasing within each record, as the codec guarantees), and
  // fetched_versions must hold shard_count() versions; otherwise std::invalid_argument.
  void split(const transport::SparseUpdate& update,
             std::span<const std::uint64_t> fetched_versions,
             std::vector<transport::SparseUpdate>& parts) const;

 private:
  // A piece as seen from a tensor of the whole model: entries [offset, offset + size) of it
  // are tensor `local_tensor` of shard `shard`.
  struct PieceRef {
    std::uint32_t shard = 0, local_tensor = 0, offset = 0, size = 0;
  };
  std::vector<std::uint64_t> layout_ids_;
  std::vector<std::vector<PieceRef>> pieces_of_tensor_;  // per tensor of the whole model, in offset order
};

class ShardedServerChannel : public ServerChannel {
 public:
  // `shards[i]` talks to shard i of shards.size() of `model` (the whole model; its
  // parameters are not used: every pull reads the shards'). Throws std::invalid_argument
  // when there are no shards or more shards than parameters.
  ShardedServerChannel(const Model& model, std::vector<std::unique_ptr<ServerChannel>> shards);

  // "model" or "model?since=V". Every shard is asked; a shard answering anything but 2.05
  // makes the answer that answer (the first such shard's); a shard that sends what does not
  // decode or fit is asked again for its whole slice once, then answered 5.02 to the worker.
  // Throws transport::TransportError when a shard does not answer.
  transport::CoapResponse get_model(const std::string& path) override;
  // One update of the whole model. 2.04 with the sum of the shards' versions when every
  // shard acknowledged its part; otherwise the first shard's refusal (4.09: the worker pulls
  // again). A shard that does not answer makes it throw transport::TransportError after the
  // other shards had their part: a retry of the same body is applied once by every shard
  // (each answers a duplicate with its original version).
  transport::CoapResponse post_update(std::span<const std::uint8_t> body) override;

  std::size_t shard_count() const { return shards_.size(); }
  // Per shard: the highest version it acknowledged (2.04) to this channel, 0 before any.
  const std::vector<std::uint64_t>& acknowledged_versions() const { return acknowledged_; }
  // The assembled parameters of the last pull (all shards), for tests.
  std::span<const float> parameters() const { return parameters_; }

 private:
  struct Shard {
    std::unique_ptr<ServerChannel> channel;
    std::uint64_t layout_id = 0;
    std::vector<std::uint32_t> tensor_sizes;  // its pieces' sizes
    std::vector<ShardPiece> pieces;
    std::size_t first = 0;  // its range in the flat parameters: [first, first + size)
    std::size_t size = 0;
    bool exact = false;  // parameters_ holds this shard's slice at `version`
    std::uint64_t version = 0;
  };

  // Brings shard `s` up to date; on a 2.05 fills `changed` with the shard's records of the
  // entries that changed (meaningful when the slice was exact before). Returns the shard's
  // answer, or 5.02 when it sent twice what does not decode or fit.
  transport::CoapResponse pull_shard(std::size_t s, std::vector<transport::SparseTensor>& changed);
  std::uint64_t synthetic_version() const;
  void remember_versions();
  const std::vector<std::uint64_t>* versions_behind(std::uint64_t synthetic) const;
  transport::CoapResponse dense_answer() const;

  std::uint64_t model_id_;
  std::vector<std::uint32_t> tensor_sizes_;
  std::vector<Shard> shards_;
  ShardedUpdateSplitter splitter_;
  std::vector<float> parameters_;
  std::vector<std::uint64_t> acknowledged_;
  // The last assemblies: synthetic version → per-shard versions (newest last).
  std::deque<std::pair<std::uint64_t, std::vector<std::uint64_t>>> recent_;
  // A pull broken off after some shards changed their slices, unseen by the worker: with the
  // cheap pull a slice can change without its version (entries sent later at a standing
  // version), so the versions alone do not show that the worker is behind.
  bool slices_changed_unseen_ = false;
};

}  // namespace edgetrain::runtime
