#include "server/round_coordinator.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "common/number_text.h"
#include "privacy/distributed_noise.h"
#include "privacy/subset.h"
#include "server/durable_file.h"
#include "server/resources.h"
#include "server/secure_noise.h"
#include "transport/identity.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {
namespace {

using transport::CoapCode;
using transport::CoapRequest;
using transport::CoapResponse;
using transport::text_response;
using transport::escape_untrusted;

std::uint32_t crc_of(std::span<const std::uint8_t> bytes) {
  return static_cast<std::uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), bytes.data(), static_cast<uInt>(bytes.size())));
}

template <class T>
T get(const std::uint8_t* in) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i)
    value |= static_cast<T>(static_cast<T>(in[i]) << (8 * i));
  return value;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ?examples=N (and id=NAME of plain CoAP); N in 1..2^32. Empty string: fine.
std::string parse_examples(std::string_view query, std::uint64_t& examples) {
  examples = 0;
  for (std::size_t start = 0; start <= query.size() && !query.empty();) {
    std::size_t end = query.find('&', start);
    if (end == std::string_view::npos) end = query.size();
    const std::string_view part = query.substr(start, end - start);
    start = end + 1;
    if (part.substr(0, 3) == "id=") continue;
    constexpr std::string_view kKey = "examples=";
    if (part.substr(0, kKey.size()) != kKey)
      return "unknown query parameter '" + escape_untrusted(part.substr(0, 40)) +
             "' (examples=N is needed)";
    const std::string_view digits = part.substr(kKey.size());
    const auto [rest, error] =
        std::from_chars(digits.data(), digits.data() + digits.size(), examples);
    if (digits.empty() || error != std::errc() || rest != digits.data() + digits.size() ||
        examples == 0 || examples > (std::uint64_t{1} << 32))
      return "examples= needs a decimal count in 1..2^32, got '" +
             escape_untrusted(digits.substr(0, 40)) + "'";
  }
  if (examples == 0) return "examples=N (the examples the delta was trained on) is missing";
  return {};
}

}  // namespace

RoundCoordinator::RoundCoordinator(ServerState& state, RoundOptions options)
    : state_(state), options_(std::move(options)) {
  if (!(options_.client_fraction > 0 && options_.client_fraction <= 1))
    throw std::invalid_argument("client fraction must be in (0, 1]");
  if (!(options_.deadline_seconds > 0)) throw std::invalid_argument("round deadline must be > 0");
  if (!(options_.rule.trim_fraction >= 0 && options_.rule.trim_fraction < 0.5))
    throw std::invalid_argument("--trim-fraction must be in [0, 0.5)");
  if (!(options_.clip_norm >= 0 && std::isfinite(options_.clip_norm)))
    throw std::invalid_argument("--round-clip-norm must be a finite value >= 0");
  if (options_.rule.kind == Aggregation::kDpFedAvg) {
    // Each device's sensitivity is its clip norm: without one there is no privacy to count.
    if (!(options_.clip_norm > 0))
      throw std::invalid_argument("--aggregation dp-fedavg needs --round-clip-norm S > 0");
    if (!(options_.privacy.noise_multiplier > 0))
      throw std::invalid_argument("--aggregation dp-fedavg needs --dp-noise-multiplier z > 0");
    if (!(options_.rule.expected_devices > 0))
      throw std::invalid_argument(
          "--aggregation dp-fedavg needs --dp-expected-devices (devices per round on average)");
    if (!(options_.privacy.delta > 0 && options_.privacy.delta < 1))
      throw std::invalid_argument("--dp-delta must be in (0, 1)");
    accountant_.emplace(options_.client_fraction, options_.privacy.noise_multiplier);
    delta_noise_multiplier_ = options_.privacy.noise_multiplier;
  }
  const AdaptiveClipping& adaptive = options_.privacy.adaptive;
  check_adaptive_clipping(adaptive);
  if (adaptive.enabled()) {
    if (!accountant_)
      throw std::invalid_argument("--dp-adaptive-clip-quantile needs --aggregation dp-fedavg");
    delta_noise_multiplier_ = delta_noise_multiplier(
        options_.privacy.noise_multiplier,
        count_noise_stddev(adaptive, options_.rule.expected_devices));
  }
  clip_norm_ = options_.clip_norm;
  if (options_.secure.subset_fraction > 0 && !options_.secure.enabled)
    throw std::invalid_argument(
        "--secagg-subset needs --secure-aggregation: plain rounds compress each device's delta "
        "with its own compressor (the worker's compression settings)");
  if (options_.privacy.skellam && !(options_.secure.enabled && accountant_))
    throw std::invalid_argument(
        "--dp-noise skellam needs --aggregation dp-fedavg --secure-aggregation: it is the devices' "
        "discrete noise, exact in secure aggregation's ring; the server's own noise is Gaussian");
  if (options_.secure.enabled) {
    // The server sees only the survivors' sum: a rule that needs each device's values, or
    // noise the server adds to the sum it unmasked, does not go with it.
    if (options_.rule.kind == Aggregation::kTrimmedMean || options_.rule.kind == Aggregation::kMedian)
      throw std::invalid_argument(
          std::string("--secure-aggregation cannot go with --aggregation ") + aggregation_name(options_.rule.kind) +
          ": a robust rule needs every device's values, and the server sees only their sum");
    if (options_.rule.kind == Aggregation::kDpFedAvg) {
      // Distributed noise (privacy/distributed_noise.h): the devices add it, the server none.
      // Adaptive clipping: each device appends its unclipped bit plus its share of the count's
      // noise to the masked vector (privacy/distributed_noise.h, the count).
      if (adaptive.enabled() && options_.privacy.skellam)
        throw std::invalid_argument(
            "--dp-adaptive-clip-quantile with --dp-noise skellam: not yet (the count's value is "
            "Gaussian; use --dp-noise gaussian)");
      if (adaptive.enabled() && options_.secure.subset_fraction > 0)
        throw std::invalid_argument("--dp-adaptive-clip-quantile with --secagg-subset: not yet");
      noise_survivors_ = std::max<std::uint32_t>(options_.min_clients, 2);
      if (noise_survivors_ > privacy::kMaxSecAggDevices)
        throw std::invalid_argument("--min-clients " + std::to_string(options_.min_clients) +
                                    ": a secure round holds at most 255 devices");
      if (options_.privacy.skellam) {
        // Discrete noise (privacy/skellam.h): the devices' values are integers of a scale
        // fixed for the run; the accountant counts the Skellam bound at this plan.
        const std::uint64_t length =
            options_.secure.subset_fraction > 0
                ? privacy::subset_length(options_.secure.subset_fraction,
                                         static_cast<std::uint32_t>(state_.model().parameter_count()))
                : state_.model().parameter_count();
        skellam_ = privacy::skellam_plan(options_.privacy.noise_multiplier, options_.clip_norm, noise_survivors_,
                                         length);
        if (const std::string problem = privacy::skellam_ring_problem(
                skellam_.scale, options_.clip_norm, skellam_.device_variance,
                static_cast<std::uint32_t>(privacy::kMaxSecAggDevices));
            !problem.empty())
          throw std::invalid_argument("--dp-noise skellam: " + problem);
        accountant_ = DpAccountant::skellam(options_.client_fraction, skellam_.l1_bound, skellam_.l2_bound,
                                            skellam_.central_variance());
      }
    }
    if (options_.rule.kind == Aggregation::kDpFedAvg && !options_.privacy.skellam) {
      update_device_noise();  // of S_0; again once round_clip.json is read, and at each close
      if (const std::string problem =
              privacy::device_noise_problem(clip_norm_, device_noise_stddev_, secure_value_bound_);
          !problem.empty())
        throw std::invalid_argument("--dp-noise-multiplier with --secure-aggregation: " + problem);
      if (adaptive.enabled()) {
        count_device_stddev_ = count_noise_stddev(adaptive, options_.rule.expected_devices) /
                               std::sqrt(static_cast<double>(noise_survivors_));
        count_value_bound_ = privacy::count_value_bound(count_device_stddev_);
      }
    }
    secure_ = std::make_unique<SecureRound>(
        SecureRoundOptions{.threshold_fraction = options_.secure.threshold_fraction,
                           .step_seconds = options_.deadline_seconds,
                           .clip_norm = options_.clip_norm,
                           .min_devices = std::max<std::uint32_t>(options_.min_clients, 2),
                           .model_id = state_.model_id(),
                           .subset_fraction = options_.secure.subset_fraction,
                           .neighbours = options_.secure.neighbours,
                           .value_bound = secure_value_bound_,
                           .min_survivors = noise_survivors_,
                           .signing_ca = options_.secure.signing_ca_file.empty()
                                             ? nullptr
                                             : privacy::CertificateAuthority::from_file(options_.secure.signing_ca_file),
                           .skellam_scale = skellam_.scale,
                           .count_value_bound = count_value_bound_,
                           .now = options_.now,
                           .log = options_.log},
        state_.checkpoint_path().parent_path() / "secagg_attempt.json");
  }
  clip_state_path_ = state_.checkpoint_path().parent_path() / "round_clip.json";
  if (adaptive.enabled()) load_clip_state();
  if (secure_ && device_noise_stddev_ > 0) {
    update_device_noise();  // the current round's clip norm (round_clip.json)
    secure_->set_value_bound(clip_norm_, secure_value_bound_);
  }
  log_path_ = state_.checkpoint_path().parent_path() / "rounds.wal";
  open_log();
  opened_ = options_.now();
  if (secure_) {
    if (!deltas_.empty())
      throw StateError(log_path_.string() + " holds " + std::to_string(deltas_.size()) +
                       " plain deltas of round " + std::to_string(round()) +
                       ": finish that round without --secure-aggregation first");
    secure_->resume_or_begin(round(), secure_vector_length());
    if (accountant_) secure_round_passes_budget(round());  // a state directory at its budget
  }
}

RoundCoordinator::~RoundCoordinator() = default;

void RoundCoordinator::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

// Reads rounds.wal: the records of the current round become deltas_. A torn tail is cut
// (nothing after it was acknowledged: each record is synced before its 2.04); damage with
// intact records after it refuses the start and changes nothing, as the main WAL does.
void RoundCoordinator::open_log() {
  const std::filesystem::path legacy = log_path_.parent_path() / "rounds.log";
  if (std::filesystem::exists(legacy)) migrate_legacy_log(legacy);
  const WalHeader header{.model_id = state_.model_id(), .kind = WalKind::kRoundDeltas};
  if (!std::filesystem::exists(log_path_)) {
    try {
      log_.emplace(WalWriter::replace(log_path_, header, {}));
    } catch (const WalError& e) {
      throw StateError(e.what());
    }
    return;
  }
  WalContents contents;
  try {
    contents = read_wal(log_path_);
  } catch (const WalError& e) {
    throw StateError(e.what());
  }
  if (contents.header.kind != WalKind::kRoundDeltas)
    throw StateError(log_path_.string() + " is a log of " + wal_kind_name(contents.header.kind) +
                     ", not of round deltas");
  if (contents.header.model_id != state_.model_id())
    throw StateError(log_path_.string() + " belongs to another model");
  if (!contents.damage.empty())
    throw StateError(describe_wal_damage(log_path_, contents) +
                     ". Nothing was changed; `edgetrain-server repair-wal --state-dir " +
                     log_path_.parent_path().string() + "` lists the choices");
  const std::vector<std::uint32_t> sizes = state_.model().tensor_sizes();
  const transport::ModelLayout layout{state_.model_id(), sizes};
  for (const WalRecord& record : contents.records) {
    if (record.version != state_.version()) continue;  // a closed round's delta
    auto decoded = transport::decode_sparse_update(record.update, layout);
    if (!decoded)
      throw StateError(log_path_.string() +
                       ": a logged delta does not decode: " + decoded.error().message);
    if (options_.privacy.adaptive.enabled()) {
      // The log holds the clipped delta: its norm tells a clipped one (S up to rounding)
      // from one that was below S (adaptive_clipping.h, counts_as_unclipped).
      const double norm = clip_round_delta(decoded.value(), /*max_norm=*/0);  // 0: measures only
      if (counts_as_unclipped(norm, clip_norm_, /*reloaded=*/true))
        ++unclipped_this_round_;
    }
    deltas_.push_back({record.sequence, std::move(decoded).value()});
    answered_.insert(record.identity);
    seen_.insert(record.identity);
  }
  if (contents.dropped_bytes > 0)
    log("round log: cut a torn last record (" + std::to_string(contents.dropped_bytes) + " bytes)");
  try {
    log_.emplace(WalWriter::append_to(log_path_, contents.valid_bytes));
  } catch (const WalError& e) {
    throw StateError(e.what());
  }
  if (!deltas_.empty())
    log("round " + std::to_string(state_.version()) + ": " + std::to_string(deltas_.size()) +
        " acknowledged deltas reloaded from " + log_path_.string());
}

// rounds.log of an earlier release: magic "ETRL", u64 model id, then records of u32 body
// length, u32 CRC-32 of the body, body = u64 round, u64 examples, u16 identity length,
// identity, delta. Read as that release read it (up to the first record that does not check
// out); the open round's deltas move to rounds.wal, then the old file goes.
void RoundCoordinator::migrate_legacy_log(const std::filesystem::path& legacy) {
  std::vector<std::uint8_t> bytes;
  {
    std::ifstream in(legacy, std::ios::binary);
    if (!in) throw StateError("cannot read " + legacy.string());
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  constexpr char kLegacyMagic[4] = {'E', 'T', 'R', 'L'};
  constexpr std::size_t kLegacyHeaderBytes = 12;
  std::vector<WalRecord> records;
  std::size_t at = kLegacyHeaderBytes;
  if (bytes.size() >= kLegacyHeaderBytes) {
    if (std::memcmp(bytes.data(), kLegacyMagic, 4) != 0)
      throw StateError(legacy.string() + " is not a round log");
    if (get<std::uint64_t>(bytes.data() + 4) != state_.model_id())
      throw StateError(legacy.string() + " belongs to another model");
    while (bytes.size() - at >= 8) {
      const std::uint32_t length = get<std::uint32_t>(bytes.data() + at);
      const std::uint32_t crc = get<std::uint32_t>(bytes.data() + at + 4);
      if (length < 18 || length > kWalMaxRecordBody || bytes.size() - at - 8 < length) break;
      const std::span<const std::uint8_t> body(bytes.data() + at + 8, length);
      if (crc_of(body) != crc) break;
      const std::uint16_t id_length = get<std::uint16_t>(body.data() + 16);
      if (18u + id_length > length) break;
      at += 8 + length;
      const std::uint64_t round = get<std::uint64_t>(body.data());
      if (round != state_.version()) continue;
      records.push_back({round,
                         std::string(reinterpret_cast<const char*>(body.data() + 18), id_length),
                         get<std::uint64_t>(body.data() + 8),
                         std::vector<std::uint8_t>(body.begin() + 18 + id_length, body.end()),
                         {}});
    }
  }
  try {
    WalWriter::replace(log_path_, {.model_id = state_.model_id(), .kind = WalKind::kRoundDeltas},
                       records);
  } catch (const WalError& e) {
    throw StateError(e.what());
  }
  std::filesystem::remove(legacy);
  log("round log: moved " + std::to_string(records.size()) + " deltas of round " +
      std::to_string(state_.version()) + " from " + legacy.string() +
      " (an earlier release's) to " + log_path_.string());
}

void RoundCoordinator::append_to_log(std::uint64_t examples, const std::string& identity,
                                     std::span<const std::uint8_t> body) {
  if (!log_) log_.emplace(WalWriter::append_to(log_path_, read_wal(log_path_).valid_bytes));
  log_->append(WalRecord{state_.version(), identity, examples, {body.begin(), body.end()}, {}});
}

bool RoundCoordinator::selected(const std::string& identity, std::uint64_t round) const {
  if (options_.client_fraction >= 1) return true;
  std::uint64_t hash = mix(options_.seed ^ mix(round));
  for (unsigned char c : identity) hash = mix(hash ^ c);
  return static_cast<double>(hash >> 11) * 0x1.0p-53 < options_.client_fraction;
}

double RoundCoordinator::seconds_left() const {
  const double limit = options_.deadline_seconds *
                       (options_.policy == RoundPolicy::kWaitAll ? kWaitAllSafetyFactor : 1.0);
  const double elapsed = std::chrono::duration<double>(options_.now() - opened_).count();
  return std::max(0.0, limit - elapsed);
}

CoapResponse RoundCoordinator::get_round(const CoapRequest& request) {
  poll();
  const std::string identity = identity_key(request);
  if (!identity.empty()) seen_.insert(identity);
  heard_from(identity);
  const bool is_selected = !identity.empty() && selected(identity, round()) &&
                           answered_.count(identity) == 0 && !privacy_exhausted_ &&
                           (!secure_ || secure_->may_take_part(identity));
  nlohmann::json answer = {{"round", round()},
                                 {"model_version", state_.version()},
                                 {"deadline_seconds", std::round(seconds_left() * 1000) / 1000},
                                 {"selected", is_selected},
                                 {"local_steps", options_.local_steps},
                                 {"local_epochs", options_.local_epochs},
                                 {"policy", round_policy_name(options_.policy)}};
  if (secure_) {
    // The device takes the steps of /round/secagg/ with this session, under the identity the
    // server knows it by, and clips its delta to clip_norm before quantizing it.
    // Each step has the whole deadline, and the keys step's counts from its first key: a
    // device has that long to train (DISTREAL's budget, worker/round_worker.h).
    answer["deadline_seconds"] = options_.deadline_seconds;
    answer["secure"] = true;
    answer["secagg_session"] = secure_->session();
    answer["secagg_step"] = SecureRound::step_name(secure_->step());
    answer["secagg_identity"] = identity;
    answer["clip_norm"] = clip_norm_;
    // The device signs its keys and the survivor list (privacy/secagg_signed.h); a device with
    // a certificate requires it whatever this says, one with a PSK identity cannot take part.
    if (secure_->signed_keys()) answer["secagg_signed_keys"] = true;
    if (device_noise_stddev_ > 0) {
      // dp-fedavg: each device adds N(0, σ_d²) per value before it quantizes in [−B, B]
      // (privacy/distributed_noise.h); a device refuses values it cannot honour.
      answer["dp_device_noise_stddev"] = device_noise_stddev_;
      answer["dp_noise_survivors"] = noise_survivors_;
      answer["secagg_value_bound"] = secure_value_bound_;
    }
    if (options_.secure.neighbours > 0) answer["secagg_neighbours"] = options_.secure.neighbours;  // SecAgg+'s k
    if (count_value_bound_ > 0) {
      // Adaptive clipping: the device appends b + N(0, σ_b²/c), quantized in [−B_b, B_b].
      answer["dp_clip_count_device_stddev"] = count_device_stddev_;
      answer["secagg_count_value_bound"] = count_value_bound_;
    }
    if (skellam_.scale > 0) {
      // dp-fedavg, discrete: each device rounds γ·delta within Δ2 and adds Sk(v_d) per value
      // (privacy/skellam.h); a device refuses a plan it cannot honour.
      answer["dp_noise"] = "skellam";
      answer["dp_noise_survivors"] = noise_survivors_;
      answer["secagg_skellam_scale"] = skellam_.scale;
      answer["secagg_skellam_variance"] = skellam_.device_variance;
      answer["secagg_skellam_l2_bound"] = skellam_.l2_bound;
    }
    if (const auto subset = secure_->subset()) {
      // Every device masks the same entries: those privacy::subset_indices picks from these.
      answer["secagg_subset_seed"] = subset->seed;
      answer["secagg_subset_length"] = subset->length;
    }
  }
  return text_response(CoapCode::kContent, answer.dump());
}

CoapResponse RoundCoordinator::post_round_update(const CoapRequest& request) {
  poll();
  const std::string identity = identity_key(request);
  if (identity.empty())
    return text_response(CoapCode::kUnauthorized,
                         "round deltas need an identity (DTLS, or ?id=NAME on plain CoAP)");
  seen_.insert(identity);
  if (secure_)
    return text_response(CoapCode::kConflict,
                         "secure aggregation: this server takes masked inputs at /round/secagg/input, "
                         "not plain deltas");
  std::uint64_t examples = 0;
  if (std::string problem = parse_examples(request.query, examples); !problem.empty()) {
    ++malformed_;
    return text_response(CoapCode::kBadRequest, "malformed: " + problem);
  }
  const std::vector<std::uint32_t> sizes = state_.model().tensor_sizes();
  auto decoded = transport::decode_sparse_update(request.payload, {state_.model_id(), sizes});
  if (!decoded) {
    if (decoded.error().code == transport::CodecErrorCode::kWrongModel) {
      ++wrong_refused_;
      return text_response(CoapCode::kConflict, "wrong model: " + decoded.error().message);
    }
    ++malformed_;
    return text_response(CoapCode::kBadRequest, "malformed: " + decoded.error().message);
  }
  if (state_.device_quarantined(identity)) {
    ++quarantined_;
    return text_response(CoapCode::kForbidden,
                         "quarantined: this device sent too many bad deltas or updates in a row");
  }
  if (const std::string problem = round_delta_problem(decoded.value(), options_.server_lr,
                                                      options_.max_parameter_magnitude);
      !problem.empty()) {
    ++refused_values_;
    const std::string note = state_.note_device_outcome(identity, SubmitOutcome::kOutOfBounds);
    log("refused a delta from '" + escape_untrusted(identity) + "': " + problem + note);
    return text_response(CoapCode::kUnprocessableEntity, "delta refused: " + problem + note);
  }
  const std::uint64_t delta_round = decoded.value().fetched_version;
  if (delta_round < round()) {
    ++late_refused_;
    log("refused a late delta from '" + escape_untrusted(identity) + "' for closed round " +
        std::to_string(delta_round));
    return text_response(CoapCode::kConflict, "round closed: round " + std::to_string(delta_round) +
                                                  " is closed, the current round is " +
                                                  std::to_string(round()));
  }
  if (delta_round > round()) {
    ++wrong_refused_;
    return text_response(CoapCode::kConflict, "wrong round: " + std::to_string(delta_round) +
                                                  " is not the current round " +
                                                  std::to_string(round()));
  }
  if (answered_.count(identity)) {
    ++duplicates_;
    return {CoapCode::kChanged, {}, {}};
  }
  if (!selected(identity, round())) {
    ++wrong_refused_;
    return text_response(
        CoapCode::kConflict,
        "not selected: this device is not selected in round " + std::to_string(round()));
  }
  // Per-device norm clipping: the log keeps the clipped delta (fp32), so a restart reloads
  // what the close aggregates, whatever --round-clip-norm it is given then.
  std::vector<std::uint8_t> clipped_body;
  const double norm = clip_round_delta(decoded.value(), clip_norm_);
  const bool clipped = clip_norm_ > 0 && norm > clip_norm_;
  if (clipped) {
    auto encoded = transport::encode_sparse_update(decoded.value());
    if (!encoded) {  // cannot happen for finite values scaled down; refused rather than lost
      log("ERROR: cannot encode a clipped delta: " + encoded.error().message);
      return text_response(CoapCode::kInternalServerError, "cannot encode the clipped delta");
    }
    clipped_body = std::move(encoded).value();
  }
  try {
    append_to_log(examples, identity, clipped ? std::span<const std::uint8_t>(clipped_body)
                                              : std::span<const std::uint8_t>(request.payload));
  } catch (const std::exception& e) {
    log(std::string("ERROR: ") + e.what());
    return text_response(CoapCode::kInternalServerError, e.what());
  }
  if (counts_as_unclipped(norm, clip_norm_, /*reloaded=*/false)) ++unclipped_this_round_;
  if (clipped) {
    ++clipped_;
    clipped_this_round_.push_back(escape_untrusted(identity) + " " +
                                  common::short_number(norm));
  }
  deltas_.push_back({examples, std::move(decoded).value()});
  answered_.insert(identity);
  state_.note_device_outcome(identity, SubmitOutcome::kApplied);
  poll();
  return {CoapCode::kChanged, {}, {}};
}

std::size_t RoundCoordinator::selected_seen() const {
  const auto recent = options_.now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                          std::chrono::duration<double>(2 * options_.deadline_seconds));
  std::size_t count = 0;
  for (const auto& [identity, heard] : last_heard_)
    count += heard >= recent && selected(identity, round()) ? 1 : 0;
  return count;
}

void RoundCoordinator::heard_from(const std::string& identity) {
  if (!secure_ || identity.empty()) return;
  last_heard_[identity] = options_.now();
}

bool RoundCoordinator::poll() {
  if (secure_) {
    if (privacy_exhausted_) return false;  // no further round closes
    const std::optional<SecureRound::Sum> sum = secure_->poll(selected_seen());
    if (!sum) return false;
    close_secure_round(*sum);
    return true;
  }
  if (deltas_.empty()) {
    if (seconds_left() <= 0)
      opened_ = options_.now();  // nothing arrived: a new deadline, same round
    return false;
  }
  bool everyone_answered = deltas_.size() >= options_.min_clients;
  for (const std::string& identity : seen_)
    if (selected(identity, round()) && answered_.count(identity) == 0) everyone_answered = false;
  if (!everyone_answered && seconds_left() > 0) return false;
  close_round();
  return true;
}

void RoundCoordinator::close_round() {
  const std::uint64_t closing = round();
  pending_clip_norm_.reset();  // a close that failed before left its S_r+1 unused
  std::uint64_t missing = 0;
  for (const std::string& identity : seen_)
    if (selected(identity, closing) && answered_.count(identity) == 0) ++missing;
  // The close is one update through ServerState (round_aggregation.h, as the simulator's).
  transport::SparseUpdate update;
  if (accountant_) {
    // Every version of the state directory counts as one released round (ours: a state
    // directory that began without dp-fedavg is counted as if it had it).
    DpAccountant next = *accountant_;
    next.add_rounds(closing + 1);
    const double epsilon_after = next.epsilon(options_.privacy.delta).epsilon;
    if (options_.privacy.target_epsilon > 0 && epsilon_after > options_.privacy.target_epsilon) {
      if (!privacy_exhausted_) {
        privacy_exhausted_ = "closing round " + std::to_string(closing) + " would take epsilon to " +
                             common::short_number(epsilon_after) + ", past --dp-target-epsilon " +
                             common::short_number(options_.privacy.target_epsilon);
        log("privacy budget: " + *privacy_exhausted_ + "; no further round closes");
      }
      return;
    }
    std::vector<float> mean =
        aggregate_deltas(deltas_, state_.model().tensor_sizes(), options_.rule);
    add_secure_gaussian_noise(
        mean, delta_noise_multiplier_ * clip_norm_ / options_.rule.expected_devices);
    const AdaptiveClipping& adaptive = options_.privacy.adaptive;
    if (adaptive.enabled()) {
      // The next round's clip norm, durable before the close that releases it: a crash after
      // this write but before the close lands finds round_clip.json one round ahead and
      // clips this round's deltas with previous_clip_norm again (load_clip_state).
      float count_noise = 0;
      add_secure_gaussian_noise(
          std::span<float>(&count_noise, 1),
          count_noise_stddev(adaptive, options_.rule.expected_devices));
      const double next = next_clip_norm(clip_norm_, unclipped_this_round_, count_noise,
                                         options_.rule.expected_devices, adaptive);
      try {
        save_clip_state(closing + 1, next, clip_norm_);
      } catch (const std::exception& e) {
        ++close_failures_;
        opened_ = options_.now();
        log(std::string("ERROR: round ") + std::to_string(closing) +
            " could not close: cannot save the next clip norm: " + e.what());
        return;
      }
      pending_clip_norm_ = next;
    }
    update = close_update_of(mean, state_.model().tensor_sizes(), options_.server_lr,
                             options_.store_learning_rate, state_.model_id(), closing);
  } else {
    update = round_close_update(deltas_, state_.model().tensor_sizes(), options_.rule,
                                options_.server_lr, options_.store_learning_rate,
                                state_.model_id(), closing);
  }
  auto encoded = transport::encode_sparse_update(update);
  if (!encoded) {
    // A value the codec refuses (not finite): the aggregate cannot be applied.
    restart_round("its aggregate cannot be encoded: " + encoded.error().message);
    return;
  }
  const SubmitResult result = state_.submit(kRoundCloseIdentity, encoded.value());
  if (result.outcome == SubmitOutcome::kNotDurable) {
    // The WAL could not take it (a disk error): the round stays open with its deltas (they
    // are in the round log) and the next poll tries again.
    ++close_failures_;
    opened_ = options_.now();
    log("ERROR: round " + std::to_string(closing) + " could not close (" +
        submit_outcome_name(result.outcome) + "): " + result.diagnostic);
    return;
  }
  if (!result.acknowledged()) {
    // The store refused the aggregate itself (e.g. out of bounds): retrying the same deltas
    // would refuse it again, so the round goes on without them.
    restart_round(std::string("the store refused its aggregate (") +
                  submit_outcome_name(result.outcome) + "): " + result.diagnostic);
    return;
  }
  std::string clipped;
  if (!clipped_this_round_.empty()) {
    // Which devices' deltas were clipped, with their norms (the first few).
    clipped = " (" + std::to_string(clipped_this_round_.size()) + " clipped at norm " +
              common::short_number(clip_norm_) + ":";
    for (std::size_t i = 0; i < clipped_this_round_.size() && i < kClippedNamesLogged; ++i)
      clipped += " " + clipped_this_round_[i];
    clipped += clipped_this_round_.size() > kClippedNamesLogged ? " ...)" : ")";
  }
  log("round " + std::to_string(closing) + " closed with " + std::to_string(deltas_.size()) +
      " deltas" + clipped + ", " + std::to_string(missing) + " stragglers; version " +
      std::to_string(result.version));
  ++rounds_closed_;
  stragglers_ += missing;
  deltas_.clear();
  answered_.clear();
  clipped_this_round_.clear();
  unclipped_this_round_ = 0;
  if (pending_clip_norm_) {
    log("adaptive clipping: round " + std::to_string(result.version) + " clips at " +
        common::short_number(*pending_clip_norm_) + " (was " + common::short_number(clip_norm_) +
        ")");
    clip_norm_ = *pending_clip_norm_;
    pending_clip_norm_.reset();
  }
  opened_ = options_.now();
  // The close is durable in the WAL: the closed round's records are no longer needed (a
  // crash before this replacement leaves records of a closed round, which reloading skips).
  empty_log();
}

void RoundCoordinator::update_device_noise() {
  device_noise_stddev_ = privacy::device_noise_stddev(delta_noise_multiplier_, clip_norm_, noise_survivors_);
  secure_value_bound_ = privacy::noised_value_bound(clip_norm_, device_noise_stddev_);
}

std::uint32_t RoundCoordinator::secure_vector_length() const {
  // The parameters, and adaptive clipping's count after them.
  return static_cast<std::uint32_t>(state_.model().parameter_count()) + (count_value_bound_ > 0 ? 1 : 0);
}

void RoundCoordinator::close_secure_round(const SecureRound::Sum& sum_with_count) {
  const std::uint64_t closing = round();
  const std::uint32_t parameters = secure_vector_length();
  SecureRound::Sum sum = sum_with_count;
  std::optional<double> next_clip;
  if (count_value_bound_ > 0 && !sum.values.empty()) {
    // Adaptive clipping: the last value is Σb plus the survivors' shares of the count noise;
    // the next clip norm is durable before the close that releases it, as in close_round.
    const double noisy_count = sum.values.back();
    sum.values.pop_back();
    next_clip = next_clip_norm(clip_norm_, 0, noisy_count, options_.rule.expected_devices, options_.privacy.adaptive);
    try {
      save_clip_state(closing + 1, *next_clip, clip_norm_);
    } catch (const std::exception& e) {
      ++close_failures_;
      log(std::string("ERROR: secure round ") + std::to_string(closing) +
          " could not close: cannot save the next clip norm: " + e.what() + "; the round starts again");
      secure_->begin_next_round(round(), parameters);
      return;
    }
  }
  // dp-fedavg: DP-FedAvg's fixed denominator m, and no noise of the server's (the devices'
  // shares are in the sum); otherwise the survivors' unweighted mean.
  double denominator = static_cast<double>(sum.survivors);
  if (accountant_) {
    // (Checked when the round began too: this one is for a budget that changed meanwhile.)
    if (secure_round_passes_budget(closing)) return;  // the sum is dropped, nothing kept
    denominator = options_.rule.expected_devices;
  }
  std::vector<float> mean(sum.values.size());
  for (std::size_t i = 0; i < mean.size(); ++i)
    mean[i] = static_cast<float>(sum.values[i] / denominator);
  const transport::SparseUpdate update =
      close_update_of(mean, state_.model().tensor_sizes(), options_.server_lr,
                      options_.store_learning_rate, state_.model_id(), closing);
  auto encoded = transport::encode_sparse_update(update);
  SubmitResult result;
  if (encoded) result = state_.submit(kRoundCloseIdentity, encoded.value());
  if (!encoded || !result.acknowledged()) {
    // The sum is gone with its session (nothing of it is kept): the round begins again.
    ++close_failures_;
    log("ERROR: secure round " + std::to_string(closing) + " could not close (" +
        (encoded ? std::string(submit_outcome_name(result.outcome)) + "): " + result.diagnostic
                 : "its aggregate cannot be encoded): " + encoded.error().message) +
        "; the round starts again");
    secure_->begin_next_round(round(), parameters);
    return;
  }
  log("round " + std::to_string(closing) + " closed securely with the sum of " +
      std::to_string(sum.survivors) + " masked inputs of " + std::to_string(sum.key_holders) +
      " devices (" + std::to_string(sum.unmasking_senders) + " answered the unmasking); version " +
      std::to_string(result.version));
  ++rounds_closed_;
  stragglers_ += sum.key_holders - sum.survivors;
  opened_ = options_.now();
  if (next_clip) {
    log("adaptive clipping: round " + std::to_string(result.version) + " clips at " +
        common::short_number(*next_clip) + " (was " + common::short_number(clip_norm_) + ")");
    clip_norm_ = *next_clip;
    update_device_noise();
    secure_->set_value_bound(clip_norm_, secure_value_bound_);
  }
  // Devices need not take the steps of a round whose close the budget would refuse.
  if (accountant_ && secure_round_passes_budget(round())) return;
  secure_->begin_next_round(round(), parameters);
}

bool RoundCoordinator::secure_round_passes_budget(std::uint64_t round) {
  if (options_.privacy.target_epsilon <= 0 || privacy_exhausted_) return privacy_exhausted_.has_value();
  DpAccountant next = *accountant_;
  next.add_rounds(round + 1);
  const double epsilon_after = next.epsilon(options_.privacy.delta).epsilon;
  if (epsilon_after <= options_.privacy.target_epsilon) return false;
  privacy_exhausted_ = "closing round " + std::to_string(round) + " would take epsilon to " +
                       common::short_number(epsilon_after) + ", past --dp-target-epsilon " +
                       common::short_number(options_.privacy.target_epsilon);
  log("privacy budget: " + *privacy_exhausted_ + "; no further round closes");
  return true;
}

void RoundCoordinator::restart_round(const std::string& why) {
  ++close_failures_;
  log("ERROR: round " + std::to_string(round()) + " cannot close with its " +
      std::to_string(deltas_.size()) + " deltas: " + why + "; the round starts again without them");
  deltas_.clear();
  answered_.clear();
  clipped_this_round_.clear();
  unclipped_this_round_ = 0;
  opened_ = options_.now();
  // Their records go too, or a restart would reload them beside the deltas sent again.
  empty_log();
}

void RoundCoordinator::empty_log() {
  try {
    WalWriter emptied = WalWriter::replace(
        log_path_, {.model_id = state_.model_id(), .kind = WalKind::kRoundDeltas}, {});
    log_ = std::move(emptied);
  } catch (const WalError& e) {
    // The old writer may point at a file the rename replaced: the next delta reopens the
    // log as it is on disk (append_to_log).
    log_.reset();
    log(std::string("WARNING: cannot empty the round log: ") + e.what());
  }
}

std::string RoundCoordinator::status_json() const {
  const nlohmann::json status = {{"round", round()},
                                 {"round_deltas_received", deltas_.size()},
                                 {"rounds_closed", rounds_closed_},
                                 {"round_stragglers", stragglers_},
                                 {"round_late_deltas_refused", late_refused_},
                                 {"round_wrong_deltas_refused", wrong_refused_},
                                 {"round_malformed_deltas", malformed_},
                                 {"round_duplicate_deltas", duplicates_},
                                 {"round_close_failures", close_failures_},
                                 {"round_deltas_refused_values", refused_values_},
                                 {"round_deltas_quarantined", quarantined_},
                                 {"round_policy", round_policy_name(options_.policy)},
                                 {"round_deltas_clipped", clipped_},
                                 {"round_clip_norm", clip_norm_},
                                 {"round_aggregation", aggregation_name(options_.rule.kind)}};
  nlohmann::json with_secure = status;
  if (secure_) with_secure.update(nlohmann::json::parse(secure_->status_json()));
  if (!accountant_) return with_secure.dump();
  nlohmann::json with_privacy = with_secure;
  with_privacy["dp_epsilon"] = epsilon();
  with_privacy["dp_delta"] = options_.privacy.delta;
  with_privacy["dp_noise_multiplier"] = options_.privacy.noise_multiplier;
  with_privacy["dp_expected_devices"] = options_.rule.expected_devices;
  with_privacy["dp_target_epsilon"] = options_.privacy.target_epsilon;
  with_privacy["dp_budget_exhausted"] = privacy_exhausted_.has_value();
  if (options_.privacy.adaptive.enabled()) {
    with_privacy["dp_clip_quantile"] = options_.privacy.adaptive.target_quantile;
    with_privacy["dp_delta_noise_multiplier"] = delta_noise_multiplier_;
  }
  if (device_noise_stddev_ > 0) {
    with_privacy["dp_device_noise_stddev"] = device_noise_stddev_;
    with_privacy["dp_noise_survivors"] = noise_survivors_;
  }
  if (skellam_.scale > 0) {
    with_privacy["dp_noise"] = "skellam";
    with_privacy["dp_noise_survivors"] = noise_survivors_;
    with_privacy["dp_skellam_scale"] = skellam_.scale;
    with_privacy["dp_skellam_device_variance"] = skellam_.device_variance;
    with_privacy["dp_skellam_l2_sensitivity"] = skellam_.l2_bound;
  }
  return with_privacy.dump();
}

double RoundCoordinator::epsilon() const {
  if (!accountant_) return 0;
  DpAccountant counted = *accountant_;
  counted.add_rounds(state_.version());
  return counted.epsilon(options_.privacy.delta).epsilon;
}

void RoundCoordinator::load_clip_state() {
  if (!std::filesystem::exists(clip_state_path_)) return;  // S_0: --round-clip-norm
  nlohmann::json saved;
  try {
    std::ifstream in(clip_state_path_);
    saved = nlohmann::json::parse(in);
    const auto saved_round = saved.at("round").get<std::uint64_t>();
    const double saved_clip = saved.at("clip_norm").get<double>();
    const double previous = saved.at("previous_clip_norm").get<double>();
    if (!(saved_clip > 0 && std::isfinite(saved_clip) && previous > 0 && std::isfinite(previous)))
      throw std::invalid_argument("a clip norm is not a positive number");
    // One round ahead: the close that was to release saved_clip did not land.
    clip_norm_ = saved_round == round() + 1 ? previous : saved_clip;
    if (saved_round != round() && saved_round != round() + 1)
      log("adaptive clipping: " + clip_state_path_.string() + " is of round " +
          std::to_string(saved_round) + ", the state of round " + std::to_string(round()) +
          "; going on with its clip norm");
  } catch (const std::exception& e) {
    throw StateError(clip_state_path_.string() + " is damaged (" + e.what() +
                     "); remove it to start again from --round-clip-norm");
  }
  log("adaptive clipping: round " + std::to_string(round()) + " clips at " +
      common::short_number(clip_norm_) + " (" + clip_state_path_.string() + ")");
}

void RoundCoordinator::save_clip_state(std::uint64_t round, double clip_norm,
                                       double previous) const {
  const std::string text =
      nlohmann::json{{"round", round}, {"clip_norm", clip_norm}, {"previous_clip_norm", previous}}
          .dump() +
      "\n";
  write_file_atomically(clip_state_path_,
                        std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

void RoundCoordinator::attach(transport::CoapDtlsServer& server,
                              std::function<void(const CoapRequest&)> note) {
  server.add_resource("round", transport::Method::kGet, [this, note](const CoapRequest& r) {
    if (note) note(r);
    return get_round(r);
  });
  server.add_resource("round/update", transport::Method::kPost, [this, note](const CoapRequest& r) {
    if (note) note(r);
    return post_round_update(r);
  });
  if (!secure_) return;
  const std::pair<const char*, transport::Method> secagg[] = {
      {"keys", transport::Method::kPost},      {"keys", transport::Method::kGet},
      {"shares", transport::Method::kPost},    {"shares", transport::Method::kGet},
      {"input", transport::Method::kPost},     {"survivors", transport::Method::kGet},
      {"consistency", transport::Method::kPost}, {"consistency", transport::Method::kGet},
      {"unmask", transport::Method::kPost}};
  for (const auto& [name, method] : secagg) {
    server.add_resource("round/secagg/" + std::string(name), method,
                        [this, note, name = std::string(name), method](const CoapRequest& r) {
                          if (note) note(r);
                          return secagg_request(method, name, r);
                        });
  }
}

CoapResponse RoundCoordinator::secagg_request(transport::Method method, const std::string& step,
                                              const CoapRequest& request) {
  if (!secure_)
    return text_response(CoapCode::kNotFound, "this server runs rounds without --secure-aggregation");
  poll();
  const std::string identity = identity_key(request);
  if (!identity.empty()) seen_.insert(identity);
  heard_from(identity);
  CoapResponse answer = secure_->handle(method, step, identity, request,
                                        !identity.empty() && selected(identity, round()));
  poll();  // the step may close with this message (and the round with the unmasking)
  return answer;
}

}  // namespace edgetrain::server
