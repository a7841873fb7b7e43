// The federated-rounds worker loop (worker/round_worker.h) against a fake server channel:
// a selected worker sends one delta per round (its round number in the fetched-version
// field, its example count, new − start), an unselected one only polls; a delta refused as
// late (4.09) is not sent again in that round; a model of another version is not trained on;
// malformed /round answers are retried; a refused identity ends the run; a transport failure
// is retried with the same bytes. A worker signs secure rounds' keys when it has a
// certificate and only then, whatever the server announces.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include <filesystem>
#include <fstream>
#include <random>

#include "model/model.h"
#include "privacy/secagg_messages.h"
#include "privacy/secagg_signed.h"
#include "tests/support/in_memory_pki.h"
#include "worker/round_worker.h"
#include "worker/server_channel.h"
#include "transport/codec.h"

namespace {

using namespace edgetrain;
using transport::CoapCode;
using transport::CoapResponse;

constexpr const char* kModelSpec = "input 8x8x1; fc 10";

std::vector<std::uint32_t> sizes_of(const runtime::Model& model) {
  std::vector<std::uint32_t> sizes;
  for (const auto& t : model.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
  return sizes;
}

runtime::Dataset small_dataset() {
  runtime::Dataset data;
  data.height = data.width = 8;
  data.channels = 1;
  data.num_classes = 10;
  for (int i = 0; i < 40; ++i) {
    for (int p = 0; p < 64; ++p) data.pixels.push_back(p == i % 64 ? 0 : 255);
    data.labels.push_back(i % 10);
  }
  return data;
}

runtime::RoundWorkerConfig test_config() {
  runtime::RoundWorkerConfig config;
  config.worker.model = kModelSpec;
  config.worker.batch = 4;
  config.worker.compressor.method = runtime::CompressionMethod::kNone;
  config.worker.backoff_initial = std::chrono::milliseconds(1);
  config.worker.backoff_max = std::chrono::milliseconds(2);
  config.lr = 0.1f;
  config.poll_seconds = 0.001;
  return config;
}

CoapResponse text(int code, const std::string& body) {
  return {code, {body.begin(), body.end()}, {}};
}

class FakeRoundServer : public runtime::ServerChannel {
 public:
  FakeRoundServer() : model_(runtime::model_spec_from_argument(kModelSpec)) {
    model_.initialize(3);
  }
  CoapResponse get_model(const std::string& path) override {
    ++pulls;
    auto bytes = transport::encode_dense_model(model_.layout_id(), model_version, sizes_of(model_),
                                               model_.parameters());
    return {CoapCode::kContent, bytes.value(), model_version};
  }
  CoapResponse post_update(std::span<const std::uint8_t>) override {
    return text(CoapCode::kNotFound, "");
  }
  CoapResponse get_round() override {
    ++polls;
    if (round_answer) return *round_answer;
    return text(CoapCode::kContent,
                "{\"round\":" + std::to_string(round) +
                    ",\"model_version\":" + std::to_string(round) +
                    ",\"deadline_seconds\":3.5,\"selected\":" + (selected ? "true" : "false") +
                    ",\"local_steps\":3,\"policy\":\"drop-stragglers\"}");
  }
  CoapResponse post_round_update(std::uint64_t examples,
                                 std::span<const std::uint8_t> body) override {
    sent.push_back({examples, {body.begin(), body.end()}});
    if (on_post) return on_post();
    return {CoapCode::kChanged, {}, {}};
  }
  transport::SparseUpdate decoded(std::size_t n) const {
    return transport::decode_sparse_update(sent.at(n).second,
                                           {model_.layout_id(), sizes_of(model_)})
        .value();
  }

  std::uint64_t round = 5, model_version = 5;
  bool selected = true;
  CoapResponse request(transport::Method method, const std::string& path,
                       std::span<const std::uint8_t> body) override {
    requests.push_back((method == transport::Method::kGet ? "GET " : "POST ") + path);
    bodies.emplace_back(body.begin(), body.end());
    return on_request ? on_request(method, path) : text(CoapCode::kNotFound, "");
  }

  std::optional<CoapResponse> round_answer;
  std::function<CoapResponse()> on_post;
  std::function<CoapResponse(transport::Method, const std::string&)> on_request;  // /round/secagg/
  std::vector<std::string> requests;
  std::vector<std::vector<std::uint8_t>> bodies;  // of each request, in order
  std::vector<std::pair<std::uint64_t, std::vector<std::uint8_t>>> sent;
  int polls = 0, pulls = 0;

 private:
  runtime::Model model_;
};

struct Fixture {
  runtime::Dataset data = small_dataset();
  FakeRoundServer server;
  std::atomic<bool> stop{false};
  std::unique_ptr<runtime::RoundWorker> worker;
  explicit Fixture(runtime::RoundWorkerConfig config = test_config()) {
    worker = std::make_unique<runtime::RoundWorker>(config, data, server, stop);
  }
};

TEST(RoundWorker, SendsOneDeltaPerRoundWithItsRoundAndExamples) {
  Fixture f;
  ASSERT_TRUE(f.worker->run_once());
  ASSERT_EQ(f.server.sent.size(), 1u);
  EXPECT_EQ(f.server.sent[0].first, 3u * 4u);  // local steps × batch
  const transport::SparseUpdate delta = f.server.decoded(0);
  EXPECT_EQ(delta.fetched_version, 5u);
  double moved = 0;
  for (const auto& t : delta.tensors)
    for (float v : t.values) moved += std::abs(v);
  EXPECT_GT(moved, 0.0);               // trained: new − start is not zero
  EXPECT_FALSE(f.worker->run_once());  // same round: done, only polls
  EXPECT_EQ(f.server.sent.size(), 1u);
  f.server.round = f.server.model_version = 6;
  EXPECT_TRUE(f.worker->run_once());
  EXPECT_EQ(f.server.decoded(1).fetched_version, 6u);
  EXPECT_EQ(f.worker->stats().rounds_trained, 2u);
  EXPECT_EQ(f.worker->stats().acknowledged_rounds, (std::vector<std::uint64_t>{5, 6}));
}

// --local-epochs on the server: the round asks for passes over the device's shard, not a
// number of minibatches (the 40 examples of this worker's shard, batch 4: 10 per pass).
TEST(RoundWorker, LocalEpochsTrainThatManyPassesOverTheShard) {
  Fixture f;
  f.server.round_answer =
      text(CoapCode::kContent,
           "{\"round\":5,\"model_version\":5,\"deadline_seconds\":3.5,\"selected\":true,"
           "\"local_steps\":3,\"local_epochs\":2,\"policy\":\"drop-stragglers\"}");
  ASSERT_TRUE(f.worker->run_once());
  ASSERT_EQ(f.server.sent.size(), 1u);
  EXPECT_EQ(f.server.sent[0].first, 2u * 40u);  // examples: two passes over the shard
  EXPECT_EQ(f.worker->stats().steps, 20u);
  runtime::RoundInfo round;
  round.local_steps = 3;
  EXPECT_EQ(runtime::round_steps(round, 40, 4), 3u);  // no epochs: the steps
  round.local_epochs = 1;
  EXPECT_EQ(runtime::round_steps(round, 41, 4), 11u);  // a last, partial minibatch counts
  EXPECT_EQ(runtime::round_steps(round, 0, 4), 1u);
}

TEST(RoundWorker, AnUnselectedWorkerOnlyPolls) {
  Fixture f;
  f.server.selected = false;
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(f.worker->run_once());
  EXPECT_EQ(f.server.pulls, 0);
  EXPECT_TRUE(f.server.sent.empty());
  EXPECT_EQ(f.server.polls, 3);
}

TEST(RoundWorker, ALateDeltaIsRefusedOnceAndTheNextRoundIsJoined) {
  Fixture f;
  f.server.on_post = [] { return text(CoapCode::kConflict, "round closed: round 5 is closed"); };
  EXPECT_FALSE(f.worker->run_once());
  EXPECT_EQ(f.worker->stats().deltas_refused, 1u);
  EXPECT_FALSE(f.worker->run_once());  // not sent again in round 5
  EXPECT_EQ(f.server.sent.size(), 1u);
  f.server.on_post = nullptr;
  f.server.round = f.server.model_version = 6;
  EXPECT_TRUE(f.worker->run_once());
}

TEST(RoundWorker, AModelOfAnotherVersionIsNotTrainedOn) {
  Fixture f;
  f.server.model_version = 6;  // the round closed between GET /round and GET /model
  EXPECT_FALSE(f.worker->run_once());
  EXPECT_EQ(f.server.pulls, 1);
  EXPECT_TRUE(f.server.sent.empty());
}

TEST(RoundWorker, MalformedRoundAnswersAreRetriedAndParsedDefensively) {
  Fixture f;
  f.server.round_answer = text(CoapCode::kContent, "{\"round\": \"five\"}");
  EXPECT_FALSE(f.worker->run_once());
  EXPECT_EQ(f.worker->stats().retries, 1u);
  EXPECT_TRUE(f.server.sent.empty());
  for (const std::string bad :
       {"", "[]",
        "{\"round\":1,\"model_version\":1,\"deadline_seconds\":1,\"selected\":1,\"local_steps\":1}",
        "{\"round\":1,\"model_version\":1,\"deadline_seconds\":1,\"selected\":true,\"local_steps\":"
        "0}",
        "{\"round\":-1,\"model_version\":1,\"deadline_seconds\":1,\"selected\":true,\"local_"
        "steps\":1}",
        "{\"round\":1,\"model_version\":1,\"deadline_seconds\":1,\"selected\":true,\"local_steps\":"
        "1,\"local_epochs\":-1}",
        "{\"round\":1,\"model_version\":1,\"deadline_seconds\":1,\"selected\":true,\"local_steps\":"
        "1,\"local_epochs\":1001}"}) {
    const std::vector<std::uint8_t> bytes(bad.begin(), bad.end());
    EXPECT_FALSE(runtime::parse_round_info(bytes)) << bad;
  }
}

TEST(RoundWorker, SecureRoundFieldsAreParsedDefensively) {
  const std::string base =
      "{\"round\":3,\"model_version\":3,\"deadline_seconds\":1,\"selected\":true,\"local_steps\":1";
  const std::string good = base + ",\"secure\":true,\"secagg_session\":196608,\"secagg_identity\":\"w1\","
                                  "\"clip_norm\":0.5}";
  const auto info = runtime::parse_round_info(std::vector<std::uint8_t>(good.begin(), good.end()));
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->secure);
  EXPECT_EQ(info->secagg_session, 196608u);
  EXPECT_EQ(info->secagg_identity, "w1");
  EXPECT_EQ(info->clip_norm, 0.5);
  EXPECT_EQ(info->secagg_subset_length, 0u);  // no subset: every entry
  const std::string subset = base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\","
                                    "\"clip_norm\":1,\"secagg_subset_seed\":18446744073709551615,"
                                    "\"secagg_subset_length\":65}";
  const auto with_subset = runtime::parse_round_info(std::vector<std::uint8_t>(subset.begin(), subset.end()));
  ASSERT_TRUE(with_subset);
  EXPECT_EQ(with_subset->secagg_subset_seed, 18446744073709551615u);
  EXPECT_EQ(with_subset->secagg_subset_length, 65u);
  const std::string plain = base + "}";
  EXPECT_FALSE(runtime::parse_round_info(std::vector<std::uint8_t>(plain.begin(), plain.end()))->secure);
  // dp-fedavg's distributed noise (privacy/distributed_noise.h): σ_d and the ring's range.
  const std::string noised = base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\","
                                    "\"clip_norm\":1,\"dp_device_noise_stddev\":0.5,\"secagg_value_bound\":6}";
  const auto with_noise = runtime::parse_round_info(std::vector<std::uint8_t>(noised.begin(), noised.end()));
  ASSERT_TRUE(with_noise);
  EXPECT_EQ(with_noise->dp_device_noise_stddev, 0.5);
  EXPECT_EQ(with_noise->secagg_value_bound, 6.0);
  EXPECT_EQ(info->dp_device_noise_stddev, 0.0);  // none announced: none added
  // SecAgg+'s k (--secagg-neighbours): absent is every device.
  EXPECT_EQ(info->secagg_neighbours, 0u);
  const std::string neighbours = base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\","
                                        "\"clip_norm\":1,\"secagg_neighbours\":12}";
  const auto with_neighbours = runtime::parse_round_info(std::vector<std::uint8_t>(neighbours.begin(), neighbours.end()));
  ASSERT_TRUE(with_neighbours);
  EXPECT_EQ(with_neighbours->secagg_neighbours, 12u);
  // The discrete noise (privacy/skellam.h): γ, v_d and Δ2.
  const std::string secure = base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,";
  const std::string skellam = secure + "\"dp_noise\":\"skellam\",\"secagg_skellam_scale\":40000,"
                                       "\"secagg_skellam_variance\":16777216,\"secagg_skellam_l2_bound\":40010}";
  const auto with_skellam = runtime::parse_round_info(std::vector<std::uint8_t>(skellam.begin(), skellam.end()));
  ASSERT_TRUE(with_skellam);
  EXPECT_EQ(with_skellam->secagg_skellam_scale, 40000.0);
  EXPECT_EQ(with_skellam->secagg_skellam_variance, 16777216.0);
  EXPECT_EQ(with_skellam->secagg_skellam_l2_bound, 40010.0);
  EXPECT_EQ(info->secagg_skellam_scale, 0.0);
  // Adaptive clipping's count (privacy/distributed_noise.h): its noise share and range.
  const std::string counted = secure + "\"dp_clip_count_device_stddev\":0.6,\"secagg_count_value_bound\":7}";
  const auto with_count = runtime::parse_round_info(std::vector<std::uint8_t>(counted.begin(), counted.end()));
  ASSERT_TRUE(with_count);
  EXPECT_EQ(with_count->dp_clip_count_device_stddev, 0.6);
  EXPECT_EQ(with_count->secagg_count_value_bound, 7.0);
  for (const std::string& bad :
       {base + ",\"secure\":true}",
        // A noise the worker does not know is not taken for none; Skellam needs its numbers.
        secure + "\"dp_noise\":\"laplace\"}",
        secure + "\"dp_clip_count_device_stddev\":0.6}",
        secure + "\"dp_noise\":\"skellam\",\"secagg_skellam_scale\":40000,\"secagg_skellam_variance\":1}",
        secure + "\"dp_noise\":\"skellam\",\"secagg_skellam_scale\":\"40000\",\"secagg_skellam_variance\":1,"
                 "\"secagg_skellam_l2_bound\":40010}",
        // The noise needs its range, and both are numbers.
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"dp_device_noise_stddev\":0.5}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"dp_device_noise_stddev\":\"0.5\",\"secagg_value_bound\":6}",
        base + ",\"secure\":true,\"secagg_session\":-1,\"secagg_identity\":\"w1\",\"clip_norm\":1}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"\",\"clip_norm\":1}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"" + std::string(256, 'x') +
            "\",\"clip_norm\":1}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":0}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":7,\"clip_norm\":1}",
        // A subset needs both its seed and a length of 1..2^28.
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"secagg_subset_length\":65}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"secagg_subset_seed\":1}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"secagg_subset_seed\":1,\"secagg_subset_length\":0}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"secagg_subset_seed\":1,\"secagg_subset_length\":268435457}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"secagg_subset_seed\":-1,\"secagg_subset_length\":65}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"secagg_subset_seed\":\"1\",\"secagg_subset_length\":65}",
        // k: an unsigned number of at most 254.
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"secagg_neighbours\":-2}",
        base + ",\"secure\":true,\"secagg_session\":1,\"secagg_identity\":\"w1\",\"clip_norm\":1,"
            "\"secagg_neighbours\":256}"}) {
    EXPECT_FALSE(runtime::parse_round_info(std::vector<std::uint8_t>(bad.begin(), bad.end()))) << bad;
  }
}

// A secure round (worker/README.md, "Secure rounds") against a server that refuses or stalls:
// a 4.09 ends the device's part in that session and only that one; a step that stays "not
// yet" far past its deadline is left; no plain delta is ever sent.
TEST(RoundWorker, ASecureSessionRefusedOrStalledIsLeftAndTheNextOneJoined) {
  Fixture f;
  std::uint64_t session = 7;
  auto secure_round = [&] {
    return text(CoapCode::kContent,
                "{\"round\":5,\"model_version\":5,\"deadline_seconds\":0.1,\"selected\":true,"
                "\"local_steps\":1,\"secure\":true,\"secagg_session\":" + std::to_string(session) +
                    ",\"secagg_identity\":\"w1\",\"clip_norm\":1}");
  };
  f.server.round_answer = secure_round();
  f.server.on_request = [](transport::Method, const std::string&) {
    return text(CoapCode::kConflict, "wrong step: the secure round is in step shares");
  };
  EXPECT_FALSE(f.worker->run_once());
  EXPECT_EQ(f.server.requests, (std::vector<std::string>{"POST round/secagg/keys"}));
  EXPECT_FALSE(f.worker->run_once());  // the same session: polls only
  EXPECT_EQ(f.server.requests.size(), 1u);
  EXPECT_TRUE(f.server.sent.empty());

  session = 8;  // another attempt: joined, and its key directory never comes
  f.server.round_answer = secure_round();
  f.server.on_request = [](transport::Method method, const std::string&) {
    return method == transport::Method::kPost ? text(CoapCode::kChanged, "") : text(503, "not yet");
  };
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(f.worker->run_once());
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(900));
  EXPECT_EQ(f.server.requests.at(1), "POST round/secagg/keys");
  EXPECT_EQ(f.server.requests.at(2), "GET round/secagg/keys?session=8");
  EXPECT_GT(f.worker->stats().secagg_not_yet, 3u);
  EXPECT_EQ(f.worker->stats().deltas_refused, 2u);
  EXPECT_EQ(f.worker->stats().rounds_trained, 0u);
  EXPECT_TRUE(f.server.sent.empty());
}

// dp-fedavg with secure aggregation: a round whose ring range B does not cover the clip plus
// ten standard deviations of the announced noise could wrap the sum: the worker takes no step
// of that session (not even its keys), counts it refused, and joins the next session that
// announces a range it can honour.
TEST(RoundWorker, ASecureRoundWhoseRangeTheNoiseWouldOverflowIsRefused) {
  Fixture f;
  std::uint64_t session = 7;
  double bound = 5.9;  // S + 10·σ_d = 1 + 10·0.5 = 6
  auto secure_round = [&] {
    return text(CoapCode::kContent,
                "{\"round\":5,\"model_version\":5,\"deadline_seconds\":0.1,\"selected\":true,"
                "\"local_steps\":1,\"secure\":true,\"secagg_session\":" + std::to_string(session) +
                    ",\"secagg_identity\":\"w1\",\"clip_norm\":1,\"dp_device_noise_stddev\":0.5,"
                    "\"secagg_value_bound\":" + std::to_string(bound) + "}");
  };
  f.server.round_answer = secure_round();
  f.server.on_request = [](transport::Method, const std::string&) {
    return text(CoapCode::kConflict, "wrong step");
  };
  EXPECT_FALSE(f.worker->run_once());
  EXPECT_TRUE(f.server.requests.empty()) << "no step of a session whose noise would overflow the ring";
  EXPECT_EQ(f.worker->stats().deltas_refused, 1u);
  EXPECT_FALSE(f.worker->run_once());  // the same session: polls only
  EXPECT_TRUE(f.server.requests.empty());

  session = 8;
  bound = 6.0;  // enough: the device takes part
  f.server.round_answer = secure_round();
  EXPECT_FALSE(f.worker->run_once());
  EXPECT_EQ(f.server.requests, (std::vector<std::string>{"POST round/secagg/keys"}));
  EXPECT_EQ(f.worker->stats().deltas_refused, 2u);  // the fake's 4.09
}

// Signed keys (server --secagg-signed-keys, privacy/secagg_signed.h): a worker with a PSK
// identity cannot sign and takes no step of a signed session; one with a certificate takes no
// step of an unsigned session (the server could substitute keys unseen) and posts SignedKeys
// in a signed one. The server's word never turns signing off.
TEST(RoundWorker, SignsKeysWhenItHasACertificateAndOnlyThen) {
  std::uint64_t session = 1;
  bool signed_session = true;
  auto secure_round = [&] {
    return text(CoapCode::kContent,
                "{\"round\":5,\"model_version\":5,\"deadline_seconds\":0.1,\"selected\":true,"
                "\"local_steps\":1,\"secure\":true,\"secagg_session\":" + std::to_string(session) +
                    ",\"secagg_identity\":\"w1\",\"clip_norm\":1" +
                    (signed_session ? ",\"secagg_signed_keys\":true}" : "}"));
  };
  auto refuse_steps = [](transport::Method, const std::string&) { return text(CoapCode::kConflict, "wrong step"); };

  Fixture psk;
  psk.server.on_request = refuse_steps;
  psk.server.round_answer = secure_round();
  EXPECT_FALSE(psk.worker->run_once());
  EXPECT_TRUE(psk.server.requests.empty()) << "a PSK device cannot sign: no step";
  EXPECT_EQ(psk.worker->stats().deltas_refused, 1u);
  session = 2, signed_session = false;
  psk.server.round_answer = secure_round();
  EXPECT_FALSE(psk.worker->run_once());
  ASSERT_EQ(psk.server.requests, (std::vector<std::string>{"POST round/secagg/keys"}));
  EXPECT_EQ(psk.server.bodies[0].at(0), static_cast<std::uint8_t>(privacy::MessageType::kAdvertiseKeys));

  // The certificate w1 of a fleet CA, in files as a device has them.
  const auto dir = std::filesystem::temp_directory_path() / ("round_worker_test_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  privacy::test_pki::Pki& pki = privacy::test_pki::fleet();
  const auto issued = pki.issue_pem("w1");
  for (const auto& [file, text] : {std::pair{"w1.crt", issued.certificate}, std::pair{"w1.key", issued.key},
                                   std::pair{"ca.crt", pki.ca_pem}})
    std::ofstream(dir / file) << text;
  runtime::RoundWorkerConfig config = test_config();
  config.worker.certificates = transport::CertificateFiles{(dir / "w1.crt").string(), (dir / "w1.key").string(),
                                                           (dir / "ca.crt").string()};
  Fixture with_certificate(config);
  with_certificate.server.on_request = refuse_steps;
  session = 3, signed_session = false;
  with_certificate.server.round_answer = secure_round();
  EXPECT_FALSE(with_certificate.worker->run_once());
  EXPECT_TRUE(with_certificate.server.requests.empty()) << "a device with a certificate takes no unsigned step";
  EXPECT_EQ(with_certificate.worker->stats().deltas_refused, 1u);
  session = 4, signed_session = true;
  with_certificate.server.round_answer = secure_round();
  EXPECT_FALSE(with_certificate.worker->run_once());
  ASSERT_EQ(with_certificate.server.requests, (std::vector<std::string>{"POST round/secagg/keys"}));
  const privacy::SignedKeys posted = privacy::parse_signed_keys(with_certificate.server.bodies[0]);
  EXPECT_EQ(posted.keys.identity, "w1");
  EXPECT_EQ(posted.keys.round, 4u);
  EXPECT_NO_THROW(privacy::check_signed_keys(*pki.ca, posted.keys, posted.credential));
  std::filesystem::remove_all(dir);
}

TEST(RoundWorker, ARefusedIdentityEndsTheRun) {
  runtime::RoundWorkerConfig config = test_config();
  config.worker.max_refusals = 2;
  Fixture f(config);
  f.server.on_post = [] { return text(CoapCode::kUnauthorized, "no DTLS identity"); };
  EXPECT_FALSE(f.worker->run_once());
  f.server.round = f.server.model_version = 6;
  try {
    f.worker->run_once();
    FAIL() << "expected WorkerFailure";
  } catch (const runtime::WorkerFailure& e) {
    EXPECT_EQ(e.exit(), runtime::WorkerExit::kUnknownIdentity);
  }
}

TEST(RoundWorker, ATransportFailureIsRetriedWithTheSameBytes) {
  Fixture f;
  int calls = 0;
  f.server.on_post = [&calls]() -> CoapResponse {
    if (calls++ == 0)
      throw transport::TransportError("timed out", transport::TransportFailure::kNoAnswer);
    return {CoapCode::kChanged, {}, {}};
  };
  EXPECT_TRUE(f.worker->run_once());
  ASSERT_EQ(f.server.sent.size(), 2u);
  EXPECT_EQ(f.server.sent[0].second, f.server.sent[1].second);
}

}  // namespace
