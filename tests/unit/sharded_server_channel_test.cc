// The worker's channel to a sharded server (worker/sharded_server_channel.h) against real
// shard ServerStates in-process: the assembled model is the whole model bit for bit, and an
// update stream sent through it to N shards ends with the parameters one unsharded server
// reaches from the same stream in the same order (σ is exact per shard: every update reaches
// every shard with that shard's own t_fetch, and a parameter's touches all live on its shard).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "worker/model_replica.h"
#include "model/model_shards.h"
#include "worker/sharded_server_channel.h"
#include "server/server_state.h"
#include "tests/support/served_resources.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace edgetrain;
using transport::CoapCode;
using transport::CoapResponse;

constexpr const char* kIdentity = "pi-01";

runtime::Model whole_model() {
  return edgetrain::testing::initialized_model("input 4x4x1; fc 8 relu; fc 3", "tiny", 5);
}

server::ServerStateOptions state_options(const std::filesystem::path& dir) {
  server::ServerStateOptions options;
  options.state_dir = dir;
  options.store.learning_rate = 0.1f;
  options.store.max_staleness = 16;
  return options;
}

CoapResponse submit_answer(const server::SubmitResult& r) {
  if (r.acknowledged()) return {CoapCode::kChanged, transport::encode_update_reply(r.version)};
  const int code = r.outcome == server::SubmitOutcome::kWrongModel ||
                           r.outcome == server::SubmitOutcome::kTooStale ||
                           r.outcome == server::SubmitOutcome::kOldSequence
                       ? CoapCode::kConflict
                       : CoapCode::kBadRequest;
  return {code, std::vector<std::uint8_t>(r.diagnostic.begin(), r.diagnostic.end())};
}

// One shard server in-process: GET /model[?since=V] and POST /update as the resources
// answer them (server/resources.cc), without the network. `lose_next_answer` applies the
// next update and then throws as if its 2.04 had been lost.
class StateChannel : public runtime::ServerChannel {
 public:
  explicit StateChannel(server::ServerState& state) : state_(state) {}
  CoapResponse get_model(const std::string& path) override {
    if (fail_next_get) {
      fail_next_get = false;
      throw transport::TransportError("no answer");
    }
    if (state_.replica_records()) {  // the cheap pull, as the resources serve it
      std::optional<std::uint64_t> since;
      if (path != "model") since = std::stoull(path.substr(path.find('=') + 1));
      const auto reply = state_.pull_for_device(kIdentity, since);
      return {CoapCode::kContent, {reply.bytes.begin(), reply.bytes.end()}, reply.etag};
    }
    if (path == "model") {
      const auto bytes = state_.encoded_model();
      return {CoapCode::kContent, {bytes.begin(), bytes.end()}};
    }
    const auto reply = state_.encoded_model_since(std::stoull(path.substr(path.find('=') + 1)));
    return {CoapCode::kContent, {reply.bytes.begin(), reply.bytes.end()}};
  }
  CoapResponse post_update(std::span<const std::uint8_t> body) override {
    posts++;
    const CoapResponse answer = submit_answer(state_.submit(kIdentity, body));
    if (lose_next_answer) {
      lose_next_answer = false;
      throw transport::TransportError("the answer was lost");
    }
    return answer;
  }
  bool lose_next_answer = false;
  bool fail_next_get = false;
  int posts = 0;

 private:
  server::ServerState& state_;
};

// N shard states of the whole model in their own directories, and the channel over them.
// `replica_pull`: each shard serves the cheap pull with these options.
struct Shards {
  Shards(const runtime::Model& whole, std::uint32_t count,
         server::ReplicaRecordOptions replica_pull = {}) {
    std::vector<std::unique_ptr<runtime::ServerChannel>> channels;
    for (std::uint32_t i = 0; i < count; i++) {
      dirs.push_back(std::make_unique<edgetrain::testing::TempDir>("sharded-channel"));
      server::ServerStateOptions options = state_options(dirs.back()->path());
      options.replica_pull = replica_pull;
      states.push_back(std::make_unique<server::ServerState>(
          runtime::shard_model(whole, {i, count}), options));
      auto channel = std::make_unique<StateChannel>(*states.back());
      raw.push_back(channel.get());
      channels.push_back(std::move(channel));
    }
    channel = std::make_unique<runtime::ShardedServerChannel>(whole, std::move(channels));
  }
  std::vector<std::unique_ptr<edgetrain::testing::TempDir>> dirs;
  std::vector<std::unique_ptr<server::ServerState>> states;
  std::vector<StateChannel*> raw;
  std::unique_ptr<runtime::ShardedServerChannel> channel;
};

// A random update of the whole model: each entry sent with probability 1/4; values in
// [-1, 1), or ±s per tensor for sign + scale.
transport::SparseUpdate random_update(std::mt19937& rng, const runtime::Model& model,
                                      transport::ValueEncoding encoding) {
  transport::SparseUpdate update;
  update.model_id = model.layout_id();
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (std::uint32_t t = 0; t < model.tensors().size(); t++) {
    transport::SparseTensor tensor{t, static_cast<std::uint32_t>(model.tensors()[t].size), {}, {}};
    const float scale = 0.25f + static_cast<float>(rng() % 8) / 16;
    for (std::uint32_t i = 0; i < tensor.size; i++) {
      if (rng() % 4 != 0) continue;
      tensor.indices.push_back(i);
      float v = value(rng);
      if (encoding == transport::ValueEncoding::kSignScale) v = v < 0 ? -scale : scale;
      if (encoding == transport::ValueEncoding::kFp16) v = transport::round_to_fp16(v);
      tensor.values.push_back(v);
    }
    if (!tensor.indices.empty()) update.tensors.push_back(std::move(tensor));
  }
  return update;
}

std::vector<std::uint8_t> encode(transport::SparseUpdate update, std::uint64_t sequence,
                                 std::uint64_t fetched, transport::ValueEncoding encoding) {
  update.sequence = sequence;
  update.fetched_version = fetched;
  return transport::encode_sparse_update(update, {encoding}).value();
}

TEST(ShardedServerChannel, PullsTheWholeModelBitForBit) {
  const runtime::Model whole = whole_model();
  for (std::uint32_t count : {1u, 3u, 5u}) {
    Shards shards(whole, count);
    const CoapResponse answer = shards.channel->get_model("model");
    ASSERT_EQ(answer.code, CoapCode::kContent);
    const auto sizes = edgetrain::testing::tensor_sizes(whole);
    const auto dense = transport::decode_dense_model(answer.payload, {whole.layout_id(), sizes});
    ASSERT_TRUE(dense) << dense.error().message;
    EXPECT_EQ(dense.value().version, 0u);
    ASSERT_EQ(dense.value().values.size(), whole.parameter_count());
    for (std::size_t i = 0; i < whole.parameter_count(); i++)
      ASSERT_EQ(dense.value().values[i], whole.parameters()[i]) << count << " shards, entry " << i;
  }
}

// The cut the channel posts and edgetrain-loadgen's sharded load sends: every entry lands
// once, on the shard whose range holds it, at its index within that shard's piece; each part
// carries the update's sequence and its own shard's t_fetch; an untouched shard gets a part
// without tensors (it still makes a version).
TEST(ShardedUpdateSplitter, CutsEveryEntryOntoItsShardWithThatShardsFetchedVersion) {
  const runtime::Model whole = whole_model();
  const auto sizes = edgetrain::testing::tensor_sizes(whole);
  std::mt19937 rng(11);
  for (std::uint32_t count : {1u, 3u, 5u}) {
    const runtime::ShardedUpdateSplitter splitter(whole, count);
    ASSERT_EQ(splitter.shard_count(), count);
    auto update = random_update(rng, whole, transport::ValueEncoding::kFp32);
    update.sequence = 42;
    std::vector<std::uint64_t> fetched;
    for (std::uint32_t s = 0; s < count; s++) fetched.push_back(100 + 7 * s);
    std::vector<transport::SparseUpdate> parts;
    splitter.split(update, fetched, parts);
    ASSERT_EQ(parts.size(), count);
    // Put back together through shard_pieces(): the whole update, entry for entry.
    std::vector<std::vector<std::pair<std::uint32_t, float>>> rebuilt(sizes.size());
    for (std::uint32_t s = 0; s < count; s++) {
      EXPECT_EQ(parts[s].model_id, runtime::shard_model(whole, {s, count}).layout_id());
      EXPECT_EQ(parts[s].model_id, splitter.shard_layout_id(s));
      EXPECT_EQ(parts[s].sequence, 42u);
      EXPECT_EQ(parts[s].fetched_version, fetched[s]);
      const auto pieces = runtime::shard_pieces(sizes, {s, count});
      for (const auto& t : parts[s].tensors) {
        ASSERT_LT(t.tensor, pieces.size());
        EXPECT_EQ(t.size, pieces[t.tensor].size);
        for (std::size_t j = 0; j < t.indices.size(); j++) {
          ASSERT_LT(t.indices[j], pieces[t.tensor].size);
          rebuilt[pieces[t.tensor].tensor].push_back(
              {pieces[t.tensor].offset + t.indices[j], t.values[j]});
        }
      }
      // What the shard server decodes against its own layout.
      auto encoded = transport::encode_sparse_update(parts[s], {transport::ValueEncoding::kFp32});
      ASSERT_TRUE(encoded) << encoded.error().message;
      std::vector<std::uint32_t> own_sizes;
      for (const auto& p : pieces) own_sizes.push_back(p.size);
      const transport::ModelLayout layout{parts[s].model_id, own_sizes};
      const auto decoded = transport::decode_sparse_update(encoded.value(), layout);
      EXPECT_TRUE(decoded) << "shard " << s << " of " << count << ": " << decoded.error().message;
    }
    std::size_t entries = 0;
    for (const auto& t : update.tensors) {
      ASSERT_EQ(rebuilt[t.tensor].size(), t.indices.size()) << "tensor " << t.tensor;
      for (std::size_t j = 0; j < t.indices.size(); j++) {
        EXPECT_EQ(rebuilt[t.tensor][j].first, t.indices[j]);
        EXPECT_EQ(rebuilt[t.tensor][j].second, t.values[j]);
      }
      entries += t.indices.size();
    }
    EXPECT_GT(entries, 0u);
  }
  // An update touching only the first tensor's first entry: the other shards' parts are empty.
  const runtime::ShardedUpdateSplitter splitter(whole, 3);
  transport::SparseUpdate one;
  one.model_id = whole.layout_id();
  one.tensors.push_back({0, sizes[0], {0}, {0.5f}});
  std::vector<transport::SparseUpdate> parts;
  splitter.split(one, std::vector<std::uint64_t>{1, 2, 3}, parts);
  EXPECT_EQ(parts[0].tensors.size(), 1u);
  EXPECT_TRUE(parts[1].tensors.empty());
  EXPECT_TRUE(parts[2].tensors.empty());
  EXPECT_EQ(parts[2].fetched_version, 3u);
  // A t_fetch per shard, no fewer.
  EXPECT_THROW(splitter.split(one, std::vector<std::uint64_t>{1, 2}, parts), std::invalid_argument);
  EXPECT_THROW(runtime::ShardedUpdateSplitter(whole, 0), std::invalid_argument);
}

class SameStream
    : public ::testing::TestWithParam<std::tuple<std::uint32_t, transport::ValueEncoding>> {};

// The strongest check of "exact per shard": one unsharded server and N shards behind the
// channel get the same updates with the same delays in the same order and end bit-identical.
// The worker side pulls through a ModelReplica, so the channel's deltas are checked too.
TEST_P(SameStream, EndsWithTheParametersOfOneServer) {
  const auto [count, encoding] = GetParam();
  const runtime::Model whole = whole_model();
  edgetrain::testing::TempDir single_dir("sharded-channel-single");
  server::ServerState single(whole, state_options(single_dir.path()));
  Shards shards(whole, count);
  runtime::ModelReplica replica(whole.layout_id(), edgetrain::testing::tensor_sizes(whole));
  std::mt19937 rng(11 + count);
  std::vector<std::uint64_t>
      synthetic_at;  // the worker's version after a pull at each server version
  std::uint64_t deltas = 0;
  constexpr int kUpdates = 60;
  for (int n = 0; n < kUpdates; n++) {
    const CoapResponse pulled = shards.channel->get_model(replica.pull_path());
    ASSERT_EQ(pulled.code, CoapCode::kContent);
    const auto outcome = replica.take(pulled.payload);
    ASSERT_NE(outcome, runtime::ModelReplica::PullOutcome::kMismatch) << replica.mismatch();
    deltas += outcome == runtime::ModelReplica::PullOutcome::kDelta;
    ASSERT_EQ(replica.version(),
              std::uint64_t{count} * single.version());  // shards move in lockstep
    synthetic_at.push_back(replica.version());
    // Fetched up to 5 versions ago: the same delay at the single server and at every shard.
    const std::uint64_t delay = rng() % (std::min<std::uint64_t>(single.version(), 5) + 1);
    const std::uint64_t fetched = single.version() - delay;
    const transport::SparseUpdate update = random_update(rng, whole, encoding);
    const auto sequence = static_cast<std::uint64_t>(n + 1);
    const auto alone = single.submit(kIdentity, encode(update, sequence, fetched, encoding));
    ASSERT_TRUE(alone.acknowledged()) << alone.diagnostic;
    const CoapResponse answer =
        shards.channel->post_update(encode(update, sequence, synthetic_at[fetched], encoding));
    ASSERT_EQ(answer.code, CoapCode::kChanged)
        << std::string(answer.payload.begin(), answer.payload.end());
    EXPECT_EQ(transport::decode_update_reply(answer.payload), std::uint64_t{count} * alone.version);
  }
  const CoapResponse last = shards.channel->get_model(replica.pull_path());
  ASSERT_EQ(last.code, CoapCode::kContent);
  ASSERT_NE(replica.take(last.payload), runtime::ModelReplica::PullOutcome::kMismatch)
      << replica.mismatch();
  const auto expected = single.snapshot().parameters;
  const auto assembled = shards.channel->parameters();
  ASSERT_EQ(assembled.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); i++)
    ASSERT_EQ(assembled[i], expected[i]) << count << " shards, entry " << i;
  for (std::size_t i = 0; i < expected.size(); i++)
    ASSERT_EQ(replica.parameters()[i], expected[i]) << "replica entry " << i;
  EXPECT_GT(deltas, 0u);  // the channel answered with deltas of the whole model
  for (std::uint32_t s = 0; s < count; s++) {
    EXPECT_EQ(shards.states[s]->version(), single.version());
    EXPECT_EQ(shards.channel->acknowledged_versions()[s], single.version());
  }
}

INSTANTIATE_TEST_SUITE_P(ShardCountsAndEncodings, SameStream,
                         ::testing::Values(std::tuple{1u, transport::ValueEncoding::kFp32},
                                           std::tuple{3u, transport::ValueEncoding::kFp32},
                                           std::tuple{5u, transport::ValueEncoding::kFp16},
                                           std::tuple{3u, transport::ValueEncoding::kSignScale},
                                           // More shards than tensors: some shards get empty
                                           // updates and must still advance.
                                           std::tuple{17u, transport::ValueEncoding::kSignScale}));

TEST(ShardedServerChannel, ARetryAfterALostAnswerIsAppliedOnceByEveryShard) {
  const runtime::Model whole = whole_model();
  Shards shards(whole, 3);
  ASSERT_EQ(shards.channel->get_model("model").code, CoapCode::kContent);
  std::mt19937 rng(3);
  const auto body = encode(random_update(rng, whole, transport::ValueEncoding::kFp32), 1, 0,
                           transport::ValueEncoding::kFp32);
  shards.raw[1]->lose_next_answer = true;
  EXPECT_THROW(shards.channel->post_update(body), transport::TransportError);
  for (const auto& state : shards.states)
    EXPECT_EQ(state->version(), 1u);  // every shard had its part
  const CoapResponse retried = shards.channel->post_update(body);
  ASSERT_EQ(retried.code, CoapCode::kChanged);
  EXPECT_EQ(transport::decode_update_reply(retried.payload),
            3u);  // each shard's original version 1
  for (const auto& state : shards.states) EXPECT_EQ(state->version(), 1u);
}

// A pull broken off by a silent shard moved the shards before it on; the worker, which got
// no answer, must not get a delta from those shards' new versions (shard_crash_recovery.sh found
// the digest mismatch).
TEST(ShardedServerChannel, APullBrokenOffByASilentShardLeavesTheWorkerExact) {
  const runtime::Model whole = whole_model();
  Shards shards(whole, 3);
  runtime::ModelReplica replica(whole.layout_id(), edgetrain::testing::tensor_sizes(whole));
  std::mt19937 rng(6);
  std::uint64_t sequence = 0;
  auto pull = [&] {
    const CoapResponse pulled = shards.channel->get_model(replica.pull_path());
    ASSERT_EQ(pulled.code, CoapCode::kContent);
    ASSERT_NE(replica.take(pulled.payload), runtime::ModelReplica::PullOutcome::kMismatch)
        << replica.mismatch();
  };
  auto push = [&] {
    const auto body = encode(random_update(rng, whole, transport::ValueEncoding::kFp32), ++sequence,
                             replica.version(), transport::ValueEncoding::kFp32);
    ASSERT_EQ(shards.channel->post_update(body).code, CoapCode::kChanged);
  };
  pull();
  push();
  pull();
  push();
  shards.raw[1]->fail_next_get = true;
  EXPECT_THROW(shards.channel->get_model(replica.pull_path()), transport::TransportError);
  pull();
  for (std::size_t i = 0; i < whole.parameter_count(); i++)
    ASSERT_EQ(replica.parameters()[i], shards.channel->parameters()[i]) << "entry " << i;
  EXPECT_EQ(replica.version(), 6u);
}

// The cheap pull per shard (server/README.md, "Cheap pull"): each shard keeps the record of
// its slice of the worker's copy and sends its largest differences; the channel checks each
// slice's digest and the worker the assembled one, through updates and a pull broken off by
// a silent shard (the shards that answered moved their records on with the channel's slices).
TEST(ShardedServerChannel, TheCheapPullPerShardKeepsEverySliceAndTheWorkerExact) {
  const runtime::Model whole = whole_model();
  Shards shards(whole, 3, {{0.1, 2}, 4});
  runtime::ModelReplica replica(whole.layout_id(), edgetrain::testing::tensor_sizes(whole));
  std::mt19937 rng(9);
  std::uint64_t sequence = 0;
  auto pull = [&] {
    const CoapResponse pulled = shards.channel->get_model(replica.pull_path());
    ASSERT_EQ(pulled.code, CoapCode::kContent) << std::string(pulled.payload.begin(), pulled.payload.end());
    ASSERT_NE(replica.take(pulled.payload), runtime::ModelReplica::PullOutcome::kMismatch)
        << replica.mismatch();
  };
  auto push = [&] {
    const auto body = encode(random_update(rng, whole, transport::ValueEncoding::kFp32), ++sequence,
                             replica.version(), transport::ValueEncoding::kFp32);
    ASSERT_EQ(shards.channel->post_update(body).code, CoapCode::kChanged);
  };
  pull();
  for (int i = 0; i < 10 && !HasFatalFailure(); i++) {
    push();
    pull();
  }
  shards.raw[2]->fail_next_get = true;
  EXPECT_THROW(shards.channel->get_model(replica.pull_path()), transport::TransportError);
  push();
  pull();
  ASSERT_FALSE(HasFatalFailure());
  for (std::size_t i = 0; i < whole.parameter_count(); i++)
    ASSERT_EQ(replica.parameters()[i], shards.channel->parameters()[i]) << "entry " << i;
  // Each shard's pulls were deltas from its record after the first, and its slice of the
  // worker's copy lags its model: a cheap pull, not an exact one.
  bool lags = false;
  for (std::size_t s = 0; s < shards.states.size(); s++) {
    const server::ReplicaRecords& records = *shards.states[s]->replica_records();
    EXPECT_EQ(records.counters().dense_pulls, 1u) << "shard " << s;
    EXPECT_GE(records.counters().delta_pulls, 11u) << "shard " << s;
    const auto slice = shards.states[s]->snapshot().parameters;
    const auto first = runtime::shard_range(whole.parameter_count(), {static_cast<std::uint32_t>(s), 3}).first;
    for (std::size_t i = 0; i < slice.size(); i++)
      lags = lags || slice[i] != replica.parameters()[first + i];
  }
  EXPECT_TRUE(lags);
}

TEST(ShardedServerChannel, RefusesWhatItCannotMapOrUse) {
  const runtime::Model whole = whole_model();
  Shards shards(whole, 3);
  std::mt19937 rng(4);
  const auto update = random_update(rng, whole, transport::ValueEncoding::kFp32);
  // A version the channel never assembled: pull again.
  EXPECT_EQ(shards.channel->post_update(encode(update, 1, 7, transport::ValueEncoding::kFp32)).code,
            CoapCode::kConflict);
  for (const auto* raw : shards.raw) EXPECT_EQ(raw->posts, 0);
  // Another model's update.
  auto other = update;
  other.model_id ^= 1;
  EXPECT_EQ(shards.channel->post_update(encode(other, 1, 0, transport::ValueEncoding::kFp32)).code,
            CoapCode::kConflict);
  // Shards given in the wrong order serve other layouts: 5.02, nothing taken.
  Shards swapped(whole, 2);
  std::vector<std::unique_ptr<runtime::ServerChannel>> wrong;
  wrong.push_back(std::make_unique<StateChannel>(*swapped.states[1]));
  wrong.push_back(std::make_unique<StateChannel>(*swapped.states[0]));
  runtime::ShardedServerChannel misordered(whole, std::move(wrong));
  EXPECT_EQ(misordered.get_model("model").code, 502);
}

TEST(ShardedServerChannel, AShardRestartedFromItsStateDirectoryCarriesOn) {
  const runtime::Model whole = whole_model();
  Shards shards(whole, 3);
  runtime::ModelReplica replica(whole.layout_id(), edgetrain::testing::tensor_sizes(whole));
  std::mt19937 rng(5);
  std::uint64_t sequence = 0;
  auto step = [&] {
    const CoapResponse pulled = shards.channel->get_model(replica.pull_path());
    ASSERT_EQ(pulled.code, CoapCode::kContent);
    ASSERT_NE(replica.take(pulled.payload), runtime::ModelReplica::PullOutcome::kMismatch)
        << replica.mismatch();
    const auto body = encode(random_update(rng, whole, transport::ValueEncoding::kFp32), ++sequence,
                             replica.version(), transport::ValueEncoding::kFp32);
    ASSERT_EQ(shards.channel->post_update(body).code, CoapCode::kChanged);
  };
  for (int n = 0; n < 5; n++) step();
  const auto before = shards.states[1]->snapshot();
  // "kill" shard 1 and start it again on its directory: recovery replays its WAL.
  shards.states[1].reset();
  shards.states[1] = std::make_unique<server::ServerState>(runtime::shard_model(whole, {1, 3}),
                                                           state_options(shards.dirs[1]->path()));
  EXPECT_EQ(shards.states[1]->version(), before.version);
  EXPECT_EQ(shards.states[1]->snapshot().parameters, before.parameters);
  // The channel still points at the old state object: rebuild it over the new one, as a
  // worker whose shard came back would reconnect. The worker's copy stays usable.
  std::vector<std::unique_ptr<runtime::ServerChannel>> channels;
  for (auto& state : shards.states) channels.push_back(std::make_unique<StateChannel>(*state));
  shards.channel = std::make_unique<runtime::ShardedServerChannel>(whole, std::move(channels));
  for (int n = 0; n < 5; n++) step();
  for (const auto& state : shards.states) EXPECT_EQ(state->version(), 10u);
}

}  // namespace
