#include "server/secure_round.h"

#include <nlohmann/json.hpp>

#include <algorithm>
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

}  // namespace

const char* SecureRound::step_name(Step step) {
  switch (step) {
    case Step::kKeys: return "keys";
    case Step::kShares: return "shares";
    case Step::kMaskedInput: return "input";
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
  log_->append(WalRecord{session_, identity, kind, std::move(body)});
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
      keys_.emplace(r.identity, privacy::parse_advertise_keys(body));
      break;
    case kCloseRecord + static_cast<std::uint64_t>(Step::kKeys):
      if (body.size() != 4) throw privacy::SecAggError("a keys close record of " + std::to_string(body.size()) + " bytes");
      close_keys(static_cast<std::uint32_t>(body[0]) | static_cast<std::uint32_t>(body[1]) << 8 |
                 static_cast<std::uint32_t>(body[2]) << 16 | static_cast<std::uint32_t>(body[3]) << 24);
      return;  // close_keys opened the next step
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
      survivors_bytes_ = privacy::serialize(server_->close_masked_input());
      open_step(Step::kUnmasking);
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

void SecureRound::close_keys(std::uint32_t threshold) {
  threshold_ = threshold;
  server_.emplace(privacy::RoundConfig{session_, threshold_, sent_length()});
  for (const auto& [identity, keys] : keys_) server_->receive_keys(identity, keys);
  keys_.clear();
  directory_bytes_ = privacy::serialize(server_->close_key_advertisement());
  open_step(Step::kShares);
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
        const auto threshold = static_cast<std::uint32_t>(std::max<double>(
            {static_cast<double>(n / 2 + 1), std::ceil(options_.threshold_fraction * static_cast<double>(n) - 1e-9),
             static_cast<double>(options_.min_survivors)}));
        privacy::check_threshold(threshold, n);  // before the record: a close that replays
        record(kCloseIdentity, kCloseRecord + static_cast<std::uint64_t>(Step::kKeys),
               {static_cast<std::uint8_t>(threshold), static_cast<std::uint8_t>(threshold >> 8),
                static_cast<std::uint8_t>(threshold >> 16), static_cast<std::uint8_t>(threshold >> 24)});
        close_keys(threshold);
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
        // Durable before any device can ask for the list: U3 is fixed once, restart or not.
        record(kCloseIdentity, kCloseRecord + static_cast<std::uint64_t>(Step::kMaskedInput), {});
        survivors_bytes_ = privacy::serialize(server_->close_masked_input());
        open_step(Step::kUnmasking);
        return std::nullopt;
      }
      case Step::kUnmasking: {
        // t answers give t shares of every secret to reveal: waiting for more changes nothing.
        if (posted_.size() < threshold_ && posted_.size() < server_->survivors().size() && !late)
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
                                                                       : Step::kUnmasking;
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
        return {CoapCode::kContent, directory_bytes_, {}};
      }
      if (wanted == Step::kShares) return {CoapCode::kContent, privacy::serialize(server_->shares_for(identity)), {}};
      if (!server_->survivors().count(identity))
        return text_response(CoapCode::kConflict, "not a survivor: no masked input of this device arrived in time");
      return {CoapCode::kContent, survivors_bytes_, {}};
    } catch (const privacy::SecAggError& e) {
      return text_response(CoapCode::kConflict, std::string("not in this step: ") + e.what());
    }
  }
  // POST: the step's message, which must be of the current session and step.
  const std::size_t cap = wanted == Step::kKeys          ? kMaxKeysBytes
                          : wanted == Step::kShares      ? kMaxSharesBytes
                          : wanted == Step::kMaskedInput ? 14 + 256 + std::size_t{4} * sent_length()
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
        privacy::AdvertiseKeys keys = privacy::parse_advertise_keys(request.payload);
        parsed = true;
        message_session = keys.round;
        if (message_session == session_ && step_ == wanted) {
          if (posted_.count(identity)) return {CoapCode::kChanged, {}, {}};
          if (keys.identity != identity)
            throw privacy::SecAggError("keys for '" + escape_untrusted(keys.identity) + "' from '" +
                                       escape_untrusted(identity) + "'");
          if (keys_.size() == privacy::kMaxSecAggDevices)
            throw privacy::SecAggError("more than 255 devices in one secure round");
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
                      {"secagg_sent_length", sent_length()}};
  if (step_ == Step::kKeys) {
    j["secagg_keys"] = keys_.size();
  } else {
    j["secagg_keys"] = server_->key_holders().size();
    j["secagg_share_senders"] = server_->share_senders().size();
    j["secagg_survivors"] = server_->survivors().size();
  }
  return j.dump();
}

}  // namespace edgetrain::server
