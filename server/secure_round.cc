#include "server/secure_round.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <fstream>

#include "privacy/quantize.h"
#include "privacy/skellam.h"
#include "privacy/secagg_messages.h"
#include "privacy/subset.h"
#include "server/durable_file.h"
#include "server/server_state.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {
namespace {

using transport::CoapCode;
using transport::CoapRequest;
using transport::CoapResponse;
using transport::text_response;
using transport::escape_untrusted;

// Size caps per message (ours), checked before parsing: 255 devices of 255-byte identities.
constexpr std::size_t kMaxKeysBytes = 10 + 256 + 64;
constexpr std::size_t kMaxSharesBytes = 14 + 255 * (2 * 256 + 85);
constexpr std::size_t kMaxUnmaskingBytes = 14 + 256 + 255 * (256 + 34);
constexpr std::size_t kMaxSignedKeysBytes =
    kMaxKeysBytes + 2 + privacy::kMaxCertificateBytes + 2 + privacy::kMaxSignatureBytes;
constexpr std::size_t kMaxConsistencyBytes = 10 + 256 + 2 + privacy::kMaxSignatureBytes;

// ?session=N (and id=NAME of plain CoAP). nullopt when absent or not a number.
std::optional<std::uint64_t> session_of(std::string_view query) {
  for (std::size_t start = 0; start < query.size();) {
    std::size_t end = query.find('&', start);
    if (end == std::string_view::npos) end = query.size();
    const std::string_view part = query.substr(start, end - start);
    start = end + 1;
    constexpr std::string_view kKey = "session=";
    if (part.substr(0, kKey.size()) != kKey) continue;
    const std::string_view digits = part.substr(kKey.size());
    std::uint64_t value = 0;
    const auto [rest, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || error != std::errc() || rest != digits.data() + digits.size())
      return std::nullopt;
    return value;
  }
  return std::nullopt;
}

// The graph seeds of SecAgg+ (one per keys close): from the kernel, like the devices' keys.
privacy::SecureRandom& seed_random() {
  static privacy::SecureRandom random;
  return random;
}

}  // namespace

const char* SecureRound::step_name(Step step) {
  switch (step) {
    case Step::kKeys: return "keys";
    case Step::kShares: return "shares";
    case Step::kMaskedInput: return "input";
    case Step::kConsistency: return "consistency";
    case Step::kUnmasking: return "unmask";
  }
  return "?";
}

SecureRound::SecureRound(SecureRoundOptions options, std::filesystem::path attempt_file)
    : options_(std::move(options)),
      attempt_file_(std::move(attempt_file)),
      log_path_(attempt_file_.parent_path() / "secagg.wal") {
  if (!(options_.threshold_fraction > 0.5 && options_.threshold_fraction <= 1))
    throw std::invalid_argument("--secagg-threshold must be in (0.5, 1]: a majority of the round's devices");
  if (!(options_.clip_norm > 0))
    throw std::invalid_argument(
        "--secure-aggregation needs --round-clip-norm S > 0: devices quantize deltas clipped to S");
  if (!(options_.value_bound >= 0) || !std::isfinite(options_.value_bound) ||
      (options_.value_bound > 0 && options_.value_bound < options_.clip_norm))
    throw std::invalid_argument("secure aggregation: the ring's value bound must be finite and at least the clip norm");
  if (options_.min_survivors > privacy::kMaxSecAggDevices)
    throw std::invalid_argument("--min-clients " + std::to_string(options_.min_survivors) +
                                ": a secure round holds at most 255 devices");
  if (options_.neighbours % 2 != 0)
    throw std::invalid_argument("--secagg-neighbours " + std::to_string(options_.neighbours) +
                                ": an even number (a Harary graph, privacy/secagg_graph.h), or 0 for every device");
  if (!(options_.subset_fraction >= 0 && options_.subset_fraction <= 1))
    throw std::invalid_argument("--secagg-subset must be in (0, 1] (or 0: every entry), not " +
                                std::to_string(options_.subset_fraction));
  if (std::filesystem::exists(attempt_file_)) {
    try {
      std::ifstream in(attempt_file_);
      const nlohmann::json saved = nlohmann::json::parse(in);
      round_ = saved.at("round").get<std::uint64_t>();
      attempt_ = saved.at("attempt").get<std::uint32_t>();
    } catch (const std::exception& e) {
      throw StateError(attempt_file_.string() + " is damaged (" + e.what() +
                       "); remove it: the current secure round then starts from attempt 0");
    }
  }
}

void SecureRound::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void SecureRound::begin(std::uint64_t round, std::uint32_t vector_length) {
  // A record of this round means an attempt of it began before (and was lost in a restart,
  // or abandoned): never reuse its session number.
  const bool again = std::filesystem::exists(attempt_file_) && round_ == round;
  attempt_ = again ? attempt_ + 1 : 0;
  set_session(round, vector_length);
  const std::string text =
      nlohmann::json{{"round", round_}, {"attempt", attempt_}}.dump() + "\n";
  write_file_atomically(attempt_file_,
                        std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
  log_.emplace(WalWriter::replace(log_path_, {.model_id = options_.model_id, .kind = WalKind::kRoundDeltas}, {}));
  server_.reset();
  directory_bytes_.clear();
  survivors_bytes_.clear();
  threshold_ = 0;
  keys_.clear();
  credentials_.clear();
  certificates_.clear();
  consistency_.reset();
  consistency_bytes_.clear();
  open_step(Step::kKeys);
  if (again) log("secure aggregation: round " + std::to_string(round) + " attempt " + std::to_string(attempt_) +
                 " (session " + std::to_string(session_) + ") begins");
}

// Record kinds of secagg.wal (the record's sequence field): a message, by its type byte
// (privacy/secagg_messages.h), or a step's close, 100 + the step (identity "#close").
namespace {
constexpr std::uint64_t kCloseRecord = 100;
const std::string kCloseIdentity = "#close";
}  // namespace

void SecureRound::record(const std::string& identity, std::uint64_t kind, std::vector<std::uint8_t> body) {
  if (!log_) throw WalError(log_path_.string() + " is not open");
  log_->append(WalRecord{session_, identity, kind, std::move(body), {}});
}

void SecureRound::resume_or_begin(std::uint64_t round, std::uint32_t vector_length) {
  if (!std::filesystem::exists(attempt_file_) || round_ != round || !std::filesystem::exists(log_path_))
    return begin(round, vector_length);
  set_session(round, vector_length);
  std::string why;
  try {
    const WalContents contents = read_wal(log_path_);
    if (contents.header.model_id != options_.model_id || contents.header.kind != WalKind::kRoundDeltas)
      why = "it belongs to another model";
    else if (!contents.damage.empty())
      why = describe_wal_damage(log_path_, contents);
    std::size_t replayed = 0;
    if (why.empty()) {
      open_step(Step::kKeys);
      for (const WalRecord& r : contents.records) {
        if (r.version != session_) continue;
        replay(r);
        ++replayed;
      }
      if (replayed == 0) why = "it holds nothing of session " + std::to_string(session_);
    }
    if (why.empty()) {
      log_.emplace(WalWriter::append_to(log_path_, contents.valid_bytes));
      step_opened_ = options_.now();  // the step's deadline starts again; posted_ as replayed
      log("secure aggregation: round " + std::to_string(round) + " attempt " + std::to_string(attempt_) +
          " resumed from " + log_path_.string() + " (" + std::to_string(replayed) + " records, step " +
          step_name(step_) + ")");
      return;
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  log("secure aggregation: " + log_path_.string() + " does not resume round " + std::to_string(round) + " (" +
      why + "): the next attempt begins");
  begin(round, vector_length);
}

void SecureRound::replay(const WalRecord& r) {
  const std::span<const std::uint8_t> body = r.update;
  switch (r.sequence) {
    case static_cast<std::uint64_t>(privacy::MessageType::kAdvertiseKeys):
      if (signed_keys()) throw privacy::SecAggError("unsigned keys in a log of a signed session");
      keys_.emplace(r.identity, privacy::parse_advertise_keys(body));
      break;
    case privacy::kSignedKeysType:  // checked again: the CA file may have changed since
      if (!signed_keys()) throw privacy::SecAggError("signed keys in a log of an unsigned session");
      take_signed_keys(r.identity, privacy::parse_signed_keys(body));
      break;
    case kCloseRecord + static_cast<std::uint64_t>(Step::kKeys): {
      // t (4 bytes LE), and with neighbours the graph's seed (8 bytes LE).
      if (body.size() != (options_.neighbours > 0 ? 12u : 4u))
        throw privacy::SecAggError("a keys close record of " + std::to_string(body.size()) + " bytes");
      std::uint64_t graph_seed = 0;
      for (std::size_t i = 4; i < body.size(); ++i) graph_seed |= std::uint64_t{body[i]} << (8 * (i - 4));
      close_keys(static_cast<std::uint32_t>(body[0]) | static_cast<std::uint32_t>(body[1]) << 8 |
                     static_cast<std::uint32_t>(body[2]) << 16 | static_cast<std::uint32_t>(body[3]) << 24,
                 graph_seed);
      return;  // close_keys opened the next step
    }
    case static_cast<std::uint64_t>(privacy::MessageType::kEncryptedShares):
      server_->receive_shares(r.identity, privacy::parse_encrypted_shares(body));
      break;
    case kCloseRecord + static_cast<std::uint64_t>(Step::kShares):
      server_->close_share_keys();
      open_step(Step::kMaskedInput);
      return;
    case static_cast<std::uint64_t>(privacy::MessageType::kMaskedInput):
      server_->receive_masked_input(r.identity, privacy::parse_masked_input(body));
      break;
    case kCloseRecord + static_cast<std::uint64_t>(Step::kMaskedInput):
      close_masked_input();
      return;
    case privacy::kConsistencySignatureType: {
      if (!consistency_) throw privacy::SecAggError("a consistency signature out of its step");
      consistency_->receive(r.identity, privacy::parse_consistency_signature(body), certificates_.at(r.identity));
      break;
    }
    case kCloseRecord + static_cast<std::uint64_t>(Step::kConsistency):
      close_consistency();
      return;
    case static_cast<std::uint64_t>(privacy::MessageType::kUnmaskingShares):
      server_->receive_unmasking_shares(r.identity, privacy::parse_unmasking_shares(body));
      break;
    default:
      throw privacy::SecAggError("a record of unknown kind " + std::to_string(r.sequence));
  }
  posted_.insert(r.identity);
}

void SecureRound::set_session(std::uint64_t round, std::uint32_t vector_length) {
  round_ = round;
  vector_length_ = vector_length;
  session_ = (round << 16) | (attempt_ & 0xffffu);
  subset_indices_.clear();
  if (options_.subset_fraction > 0 && vector_length > 0) {
    subset_seed_ = privacy::subset_seed(options_.model_id, session_);
    subset_indices_ = privacy::subset_indices(
        subset_seed_, vector_length, privacy::subset_length(options_.subset_fraction, vector_length));
  }
}

std::optional<SecureRound::Subset> SecureRound::subset() const {
  if (subset_indices_.empty()) return std::nullopt;
  return Subset{subset_seed_, static_cast<std::uint32_t>(subset_indices_.size())};
}

std::uint32_t SecureRound::sent_length() const {
  return subset_indices_.empty() ? vector_length_ : static_cast<std::uint32_t>(subset_indices_.size());
}

void SecureRound::close_keys(std::uint32_t threshold, std::uint64_t graph_seed) {
  threshold_ = threshold;
  server_.emplace(privacy::RoundConfig{session_, threshold_, sent_length(), options_.neighbours, graph_seed});
  for (const auto& [identity, keys] : keys_) server_->receive_keys(identity, keys);
  keys_.clear();
  privacy::KeyDirectory directory = server_->close_key_advertisement();
  if (signed_keys()) {
    privacy::SignedKeyDirectory signed_directory{directory, {}};
    for (const privacy::AdvertiseKeys& entry : directory.devices)
      signed_directory.credentials.push_back(credentials_.at(entry.identity));
    directory_bytes_ = privacy::serialize(signed_directory);
  } else {
    directory_bytes_ = privacy::serialize(directory);
  }
  open_step(Step::kShares);
}

void SecureRound::take_signed_keys(const std::string& identity, privacy::SignedKeys keys) {
  if (keys.keys.identity != identity)
    throw privacy::SecAggError("keys for '" + escape_untrusted(keys.keys.identity) + "' from '" +
                               escape_untrusted(identity) + "'");
  privacy::PeerCertificate certificate = privacy::check_signed_keys(*options_.signing_ca, keys.keys, keys.credential);
  certificates_.insert_or_assign(identity, std::move(certificate));
  credentials_.insert_or_assign(identity, std::move(keys.credential));
  keys_.emplace(identity, std::move(keys.keys));
}

void SecureRound::close_masked_input() {
  privacy::SurvivorList survivors = server_->close_masked_input();
  survivors_bytes_ = privacy::serialize(survivors);
  if (signed_keys()) {
    consistency_.emplace(std::move(survivors), threshold_);
    open_step(Step::kConsistency);
  } else {
    open_step(Step::kUnmasking);
  }
}

void SecureRound::close_consistency() {
  consistency_bytes_ = privacy::serialize(consistency_->close());
  open_step(Step::kUnmasking);
}

void SecureRound::open_step(Step step) {
  step_ = step;
  posted_.clear();
  step_opened_ = options_.now();
}

double SecureRound::seconds_left() const {
  const double elapsed = std::chrono::duration<double>(options_.now() - step_opened_).count();
  return std::max(0.0, options_.step_seconds - elapsed);
}

void SecureRound::next_attempt(const std::string& why) {
  ++attempts_abandoned_;
  log("secure aggregation: round " + std::to_string(round_) + " attempt " + std::to_string(attempt_) +
      " abandoned: " + why + "; the devices start again with fresh keys");
  begin_or_note(round_, vector_length_);
}

void SecureRound::begin_or_note(std::uint64_t round, std::uint32_t vector_length) {
  try {
    begin(round, vector_length);
    cannot_begin_ = false;
  } catch (const std::exception& e) {
    if (!cannot_begin_) log(std::string("ERROR: secure aggregation cannot begin round ") + std::to_string(round) + ": " + e.what());
    cannot_begin_ = true;
    round_ = round;
    vector_length_ = vector_length;
    log_.reset();
  }
}

bool SecureRound::may_take_part(const std::string& identity) const {
  if (step_ == Step::kKeys) return true;
  const auto& u1 = server_->key_holders();
  return std::binary_search(u1.begin(), u1.end(), identity);
}

std::optional<SecureRound::Sum> SecureRound::poll(std::size_t expected_keys) {
  if (cannot_begin_) {
    begin_or_note(round_, vector_length_);
    if (cannot_begin_) return std::nullopt;
  }
  // The keys step's deadline counts from its first key (ours, as a plain round's from its
  // first delta): devices train before they advertise.
  if (step_ == Step::kKeys && keys_.empty()) step_opened_ = options_.now();
  const bool late = seconds_left() <= 0;
  try {
    switch (step_) {
      case Step::kKeys: {
        const std::size_t n = keys_.size();
        // Fewer keys than this never close the step (one key; fewer than the distributed
        // noise's c): a new deadline, the same attempt.
        const std::size_t fewest = std::max<std::size_t>(2, options_.min_survivors);
        const bool everyone = n >= std::max<std::size_t>(options_.min_devices, 2) && n >= expected_keys;
        if (!(everyone && n >= fewest) && !(late && n >= fewest)) {
          if (late && n >= 2)  // say why the round does not move (once a deadline)
            log("secure aggregation: round " + std::to_string(round_) + ": " + std::to_string(n) +
                " keys at the deadline, fewer than the " + std::to_string(fewest) +
                " survivors the distributed noise is calibrated to (--min-clients); waiting another deadline");
          if (late) step_opened_ = options_.now();
          return std::nullopt;
        }
        // The holders of each device's shares: everyone, or with neighbours (SecAgg+) the k + 1
        // of a neighbourhood, whose majority t must be (the distributed noise's floor c is
        // then held by the input step, below, as t ≤ k + 1 cannot).
        const bool graph = options_.neighbours > 0 && options_.neighbours + 1 < n;
        const std::size_t holders = graph ? options_.neighbours + 1 : n;
        const auto threshold = static_cast<std::uint32_t>(std::max<double>(
            {static_cast<double>(holders / 2 + 1),
             std::ceil(options_.threshold_fraction * static_cast<double>(holders) - 1e-9),
             graph ? 0.0 : static_cast<double>(options_.min_survivors)}));
        // The graph's seed, drawn now that U1 is fixed (Bell et al.: no device can choose its
        // neighbours), and logged with the close so that a restart draws the same graph.
        std::uint64_t graph_seed = 0;
        std::vector<std::uint8_t> close_body = {static_cast<std::uint8_t>(threshold), static_cast<std::uint8_t>(threshold >> 8),
                                                static_cast<std::uint8_t>(threshold >> 16), static_cast<std::uint8_t>(threshold >> 24)};
        if (options_.neighbours > 0) {
          std::array<std::uint8_t, 8> bytes{};
          seed_random().fill(bytes);
          for (std::size_t i = 0; i < 8; ++i) graph_seed |= std::uint64_t{bytes[i]} << (8 * i);
          close_body.insert(close_body.end(), bytes.begin(), bytes.end());
        }
        // Before the record: a close that replays.
        privacy::check_round_threshold({session_, threshold, sent_length(), options_.neighbours, graph_seed}, n);
        record(kCloseIdentity, kCloseRecord + static_cast<std::uint64_t>(Step::kKeys), std::move(close_body));
        close_keys(threshold, graph_seed);
        log("secure aggregation: round " + std::to_string(round_) + ": " + std::to_string(n) +
            " devices advertised keys (U1), threshold " + std::to_string(threshold_));
        return std::nullopt;
      }
      case Step::kShares:
        if (posted_.size() < server_->key_holders().size() && !late) return std::nullopt;
        if (posted_.size() < threshold_)
          throw privacy::SecAggError(std::to_string(posted_.size()) + " devices shared their keys, fewer than t = " +
                                     std::to_string(threshold_));
        record(kCloseIdentity, kCloseRecord + static_cast<std::uint64_t>(Step::kShares), {});
        server_->close_share_keys();
        open_step(Step::kMaskedInput);
        return std::nullopt;
      case Step::kMaskedInput: {
        if (posted_.size() < server_->share_senders().size() && !late) return std::nullopt;
        if (posted_.size() < threshold_)
          throw privacy::SecAggError(std::to_string(posted_.size()) + " masked inputs, fewer than t = " +
                                     std::to_string(threshold_));
        if (posted_.size() < options_.min_survivors)  // with neighbours t may be below c
          throw privacy::SecAggError(std::to_string(posted_.size()) + " masked inputs, fewer than the " +
                                     std::to_string(options_.min_survivors) +
                                     " survivors the distributed noise is calibrated to (--min-clients)");
        // Durable before any device can ask for the list: U3 is fixed once, restart or not.
        record(kCloseIdentity, kCloseRecord + static_cast<std::uint64_t>(Step::kMaskedInput), {});
        close_masked_input();
        return std::nullopt;
      }
      case Step::kConsistency:
        if (posted_.size() < server_->survivors().size() && !late) return std::nullopt;
        if (consistency_->received() < threshold_)
          throw privacy::SecAggError(std::to_string(consistency_->received()) +
                                     " survivors signed the survivor list, fewer than t = " +
                                     std::to_string(threshold_));
        // Durable before any device can fetch the signatures: the set a device sees is fixed.
        record(kCloseIdentity, kCloseRecord + static_cast<std::uint64_t>(Step::kConsistency), {});
        close_consistency();
        return std::nullopt;
      case Step::kUnmasking: {
        // t shares of every secret to reveal (without neighbours: t answers): waiting for more
        // changes nothing.
        if (!server_->has_enough_shares() && posted_.size() < server_->survivors().size() && !late)
          return std::nullopt;
        const std::vector<std::uint32_t> sum = server_->unmask();
        Sum out;
        const auto devices = static_cast<std::uint32_t>(server_->key_holders().size());
        out.values = options_.skellam_scale > 0
                         ? privacy::skellam_decode(sum, options_.skellam_scale)
                         : privacy::dequantize(sum, options_.value_bound > 0 ? options_.value_bound : options_.clip_norm,
                                               devices);
        if (options_.count_value_bound > 0 && !sum.empty())  // the count's own range
          out.values.back() = privacy::dequantize(std::span(&sum.back(), 1), options_.count_value_bound, devices)[0];
        out.entries_summed = out.values.size();
        if (!subset_indices_.empty()) {
          std::vector<double> whole(vector_length_, 0.0);
          for (std::size_t k = 0; k < subset_indices_.size(); ++k) whole[subset_indices_[k]] = out.values[k];
          out.values = std::move(whole);
        }
        out.survivors = server_->survivors().size();
        out.key_holders = server_->key_holders().size();
        out.unmasking_senders = posted_.size();
        last_close_ = Sum{.values = {},
                          .entries_summed = out.entries_summed,
                          .survivors = out.survivors,
                          .key_holders = out.key_holders,
                          .unmasking_senders = out.unmasking_senders};
        return out;
      }
    }
  } catch (const privacy::SecAggError& e) {
    next_attempt(std::string("step ") + step_name(step_) + " could not close: " + e.what());
  } catch (const WalError& e) {
    next_attempt(std::string("step ") + step_name(step_) + " could not be logged: " + e.what());
  }
  return std::nullopt;
}

CoapResponse SecureRound::handle(transport::Method method, const std::string& resource,
                                 const std::string& identity, const CoapRequest& request,
                                 bool selected) {
  if (identity.empty())
    return text_response(CoapCode::kUnauthorized, "secure aggregation needs an identity (DTLS)");
  if (cannot_begin_)
    return text_response(CoapCode::kInternalServerError,
                         "not durable: the server cannot begin the secure round (its log says why)");
  const Step wanted = resource == "keys"     ? Step::kKeys
                      : resource == "shares" ? Step::kShares
                      : resource == "input" || resource == "survivors" ? Step::kMaskedInput
                      : resource == "consistency"                      ? Step::kConsistency
                                                                       : Step::kUnmasking;
  if (wanted == Step::kConsistency && !signed_keys())
    return text_response(CoapCode::kNotFound,
                         "this server's secure rounds have no consistency step (no --secagg-signed-keys)");
  if (method == transport::Method::kGet) {
    // The answer of step `wanted` exists once that step has closed (survivors: the input step).
    const std::optional<std::uint64_t> asked = session_of(request.query);
    if (!asked)
      return text_response(CoapCode::kBadRequest, "malformed: ?session=N (GET /round's secagg_session) is missing");
    if (*asked != session_)
      return text_response(CoapCode::kConflict, "wrong session: " + std::to_string(*asked) +
                                                    " is not the current secure session " +
                                                    std::to_string(session_) + " (round " +
                                                    std::to_string(round_) + " attempt " +
                                                    std::to_string(attempt_) + ")");
    if (static_cast<int>(step_) <= static_cast<int>(wanted))
      return text_response(kCoapNotYet, std::string("not yet: the secure round is in step ") + step_name(step_));
    try {
      if (wanted == Step::kKeys) {
        if (!may_take_part(identity))
          return text_response(CoapCode::kConflict, "not in this round: the keys step closed without this device");
        // With neighbours each device gets its own neighbourhood's keys (SecAgg+).
        if (options_.neighbours > 0) return {CoapCode::kContent, privacy::serialize(server_->directory_for(identity)), {}};
        return {CoapCode::kContent, directory_bytes_, {}};
      }
      if (wanted == Step::kShares) return {CoapCode::kContent, privacy::serialize(server_->shares_for(identity)), {}};
      if (!server_->survivors().count(identity))
        return text_response(CoapCode::kConflict, "not a survivor: no masked input of this device arrived in time");
      if (wanted == Step::kConsistency) return {CoapCode::kContent, consistency_bytes_, {}};
      if (options_.neighbours > 0) return {CoapCode::kContent, privacy::serialize(server_->survivors_for(identity)), {}};
      return {CoapCode::kContent, survivors_bytes_, {}};
    } catch (const privacy::SecAggError& e) {
      return text_response(CoapCode::kConflict, std::string("not in this step: ") + e.what());
    }
  }
  // POST: the step's message, which must be of the current session and step.
  const std::size_t cap = wanted == Step::kKeys          ? (signed_keys() ? kMaxSignedKeysBytes : kMaxKeysBytes)
                          : wanted == Step::kShares      ? kMaxSharesBytes
                          : wanted == Step::kMaskedInput ? 14 + 256 + std::size_t{4} * sent_length()
                          : wanted == Step::kConsistency ? kMaxConsistencyBytes
                                                         : kMaxUnmaskingBytes;
  if (request.payload.size() > cap)
    return text_response(CoapCode::kRequestEntityTooLarge, "too large: a " + resource + " message of " +
                                                               std::to_string(request.payload.size()) +
                                                               " bytes, at most " + std::to_string(cap));
  if (!selected)
    return text_response(CoapCode::kConflict, "not selected: this device is not selected in round " +
                                                  std::to_string(round_));
  std::uint64_t message_session = 0;
  bool parsed = false;  // a refusal after the parse is the protocol's (4.22), before it 4.00
  try {
    switch (wanted) {
      case Step::kKeys: {
        if (signed_keys()) {
          if (!request.payload.empty() && request.payload[0] == static_cast<std::uint8_t>(privacy::MessageType::kAdvertiseKeys)) {
            parsed = true;
            throw privacy::SecAggError(
                "unsigned keys: this server's secure rounds need keys signed by the device's certificate "
                "(--secagg-signed-keys); a device with a PSK identity cannot take part");
          }
          privacy::SignedKeys signed_keys = privacy::parse_signed_keys(request.payload);
          parsed = true;
          message_session = signed_keys.keys.round;
          if (message_session == session_ && step_ == wanted) {
            if (posted_.count(identity)) return {CoapCode::kChanged, {}, {}};
            if (keys_.size() == privacy::kMaxSecAggDevices)
              throw privacy::SecAggError("more than 255 devices in one secure round");
            take_signed_keys(identity, std::move(signed_keys));  // checked before it is logged
            try {
              record(identity, privacy::kSignedKeysType, {request.payload.begin(), request.payload.end()});
            } catch (...) {
              keys_.erase(identity);
              throw;
            }
          }
          break;
        }
        privacy::AdvertiseKeys keys = privacy::parse_advertise_keys(request.payload);
        parsed = true;
        message_session = keys.round;
        if (message_session == session_ && step_ == wanted) {
          if (posted_.count(identity)) return {CoapCode::kChanged, {}, {}};
          if (keys.identity != identity)
            throw privacy::SecAggError("keys for '" + escape_untrusted(keys.identity) + "' from '" +
                                       escape_untrusted(identity) + "'");
          if (keys_.size() == (options_.neighbours > 0 ? privacy::kMaxNeighbourGraphDevices : privacy::kMaxSecAggDevices))
            throw privacy::SecAggError("more than " + std::to_string(keys_.size()) + " devices in one secure round" +
                                       (options_.neighbours > 0 ? "" : " (--secagg-neighbours allows more)"));
          record(identity, static_cast<std::uint64_t>(privacy::MessageType::kAdvertiseKeys),
                 {request.payload.begin(), request.payload.end()});
          keys_.emplace(identity, std::move(keys));
        }
        break;
      }
      case Step::kShares: {
        const privacy::EncryptedShares shares = privacy::parse_encrypted_shares(request.payload);
        parsed = true;
        message_session = shares.round;
        if (message_session == session_ && step_ == wanted && !posted_.count(identity)) {
          server_->receive_shares(identity, shares);
          record(identity, static_cast<std::uint64_t>(privacy::MessageType::kEncryptedShares),
                 {request.payload.begin(), request.payload.end()});
        }
        break;
      }
      case Step::kMaskedInput: {
        const privacy::MaskedInput input = privacy::parse_masked_input(request.payload);
        if (input.round == session_ && input.masked.size() != sent_length())
          throw privacy::SecAggError(
              std::to_string(input.masked.size()) + " values, but session " + std::to_string(session_) +
              " sends " + std::to_string(sent_length()) +
              (subset_indices_.empty() ? std::string(" (the model's parameters)")
                                       : std::string(" (GET /round's secagg_subset_length)")));
        parsed = true;
        message_session = input.round;
        if (message_session == session_ && step_ == wanted && !posted_.count(identity)) {
          server_->receive_masked_input(identity, input);  // added to the running sum
          record(identity, static_cast<std::uint64_t>(privacy::MessageType::kMaskedInput),
                 {request.payload.begin(), request.payload.end()});
        }
        break;
      }
      case Step::kConsistency: {
        const privacy::ConsistencySignature signature = privacy::parse_consistency_signature(request.payload);
        parsed = true;
        message_session = signature.round;
        if (message_session == session_ && step_ == wanted && !posted_.count(identity)) {
          const auto certificate = certificates_.find(identity);
          if (certificate == certificates_.end())
            throw privacy::SecAggError("a consistency signature from '" + escape_untrusted(identity) +
                                       "', which advertised no keys");
          consistency_->receive(identity, signature, certificate->second);
          record(identity, privacy::kConsistencySignatureType, {request.payload.begin(), request.payload.end()});
        }
        break;
      }
      case Step::kUnmasking: {
        const privacy::UnmaskingShares shares = privacy::parse_unmasking_shares(request.payload);
        parsed = true;
        message_session = shares.round;
        if (message_session == session_ && step_ == wanted && !posted_.count(identity)) {
          server_->receive_unmasking_shares(identity, shares);
          record(identity, static_cast<std::uint64_t>(privacy::MessageType::kUnmaskingShares),
                 {request.payload.begin(), request.payload.end()});
        }
        break;
      }
    }
  } catch (const WalError& e) {
    // The core took a message the log could not: the session cannot be resumed as it is.
    next_attempt(std::string("a ") + resource + " message could not be logged: " + e.what());
    return text_response(CoapCode::kInternalServerError, std::string("not durable: ") + e.what());
  } catch (const privacy::SecAggError& e) {
    if (!parsed) {
      ++malformed_;
      return text_response(CoapCode::kBadRequest, "malformed " + resource + " message: " + e.what());
    }
    ++refused_;
    log("secure aggregation: refused a " + resource + " message from '" + escape_untrusted(identity) +
        "': " + e.what());
    return text_response(CoapCode::kUnprocessableEntity, std::string("refused: ") + e.what());
  }
  if (message_session != session_)
    return text_response(CoapCode::kConflict, "wrong session: " + std::to_string(message_session) +
                                                  " is not the current secure session " +
                                                  std::to_string(session_) + " (round " +
                                                  std::to_string(round_) + ")");
  if (static_cast<int>(step_) > static_cast<int>(wanted)) {
    // A retransmission of a message the step took before it closed (its 2.04 was lost).
    const bool taken = wanted == Step::kKeys     ? may_take_part(identity)
                       : wanted == Step::kShares ? server_->share_senders().count(identity) > 0
                       : wanted == Step::kMaskedInput ? server_->survivors().count(identity) > 0
                       : wanted == Step::kConsistency ? consistency_ && consistency_->signed_by(identity)
                                                      : false;
    if (taken) return {CoapCode::kChanged, {}, {}};
  }
  if (step_ != wanted)
    return text_response(CoapCode::kConflict, std::string("wrong step: the secure round is in step ") +
                                                  step_name(step_) + ", not " + step_name(wanted));
  posted_.insert(identity);
  return {CoapCode::kChanged, {}, {}};
}

std::string SecureRound::status_json() const {
  nlohmann::json j = {{"secagg_round", round_},
                      {"secagg_attempt", attempt_},
                      {"secagg_session", session_},
                      {"secagg_step", step_name(step_)},
                      {"secagg_threshold", threshold_},
                      {"secagg_step_posted", posted_.size()},
                      {"secagg_attempts_abandoned", attempts_abandoned_},
                      {"secagg_messages_refused", refused_},
                      {"secagg_messages_malformed", malformed_},
                      {"secagg_last_key_holders", last_close_.key_holders},
                      {"secagg_last_survivors", last_close_.survivors},
                      {"secagg_last_unmasking_senders", last_close_.unmasking_senders},
                      {"secagg_sent_length", sent_length()},
                      {"secagg_signed_keys", signed_keys()},
                      {"secagg_neighbours", options_.neighbours}};
  if (step_ == Step::kKeys) {
    j["secagg_keys"] = keys_.size();
  } else {
    j["secagg_keys"] = server_->key_holders().size();
    j["secagg_share_senders"] = server_->share_senders().size();
    j["secagg_survivors"] = server_->survivors().size();
    if (consistency_) j["secagg_consistency_signers"] = consistency_->received();
  }
  return j.dump();
}

}  // namespace edgetrain::server
