// Secure aggregation in --mode rounds (issue 39, part 2; docs/privacy.md, "Secure
// aggregation"): the protocol core of privacy/ (privacy/secagg.h, Bonawitz et al. 2017) carried
// as CoAP resources, with a deadline per step so that a round closes when devices drop out.
// The server learns the sum of the survivors' quantized clipped deltas, never one of them.
//
//   POST /round/secagg/keys            AdvertiseKeys           2.04 | 4.09 wrong step/session
//   GET  /round/secagg/keys?session=S  KeyDirectory (U1)       2.05 | 5.03 not yet | 4.09
//   POST /round/secagg/shares          EncryptedShares         2.04 | 4.09
//   GET  /round/secagg/shares?session=S the shares for me      2.05 | 5.03 | 4.09
//   POST /round/secagg/input           MaskedInput             2.04 | 4.09
//   GET  /round/secagg/survivors?session=S SurvivorList (U3)   2.05 | 5.03 | 4.09
//   POST /round/secagg/consistency     ConsistencySignature    2.04 | 4.09 (signed sessions)
//   GET  /round/secagg/consistency?session=S ConsistencySignatures 2.05 | 5.03 | 4.09
//   POST /round/secagg/unmask          UnmaskingShares         2.04 | 4.09
// Every body is parsed with privacy/secagg_messages.h's parsers (4.00 when it does not parse,
// 4.13 above the step's size cap); a message the core refuses (another identity than the DTLS
// one, a failed check) is 4.22 with the core's reason; the same identity posting again in the
// same step, or after it closed with that identity's message in, is 2.04 and not counted twice
// (a retransmission after a lost answer).
//
// Sessions (ours): the core's round field carries a session number, (round << 16) | attempt.
// An attempt that cannot go on (fewer than t devices at a step's deadline, or an unmasking
// that fails) is abandoned and the next attempt of the same round begins with fresh keys.
// Durability (ours): `secagg.wal` in the state directory (the WAL's format and kind of round
// records, server/write_ahead_log.h; version = session) holds every message the session
// accepted, each synced before its 2.04, and a record of each step's close (with t) synced
// before any answer depends on it; a restart replays them into a new SecAggServer, so the
// session goes on where it was (the running sum rebuilt from the masked inputs, U1, U2, U3
// and the unmasking shares as they were fixed: a device can never be told two survivor
// lists). What the log holds is what the server received anyway: keys, sealed shares, masked
// inputs (each y_u is uniformly random without the masks), the shares revealed; never an
// unmasked x_u. `secagg_attempt.json` records the attempt begun (durably before it takes any
// message); a log that does not replay (damaged, another model or session) makes the restart
// begin the next attempt instead, and the devices, finding their session gone (4.09), redo
// the round. The unmasked aggregate goes through the main WAL like a plain close.
//
// Distributed noise (ours, dp-fedavg with secure aggregation): with min_survivors c > 0 the
// keys step does not close with fewer than c keys, even at its deadline (it waits another
// deadline, as with one key), and t = max(the formula's t, c); the devices quantize noised
// values in [−value_bound, value_bound] and the sum is read back with that bound.
//
// A subset (ours, --secagg-subset, privacy/subset.h): with subset_fraction > 0 every device of
// a session masks and sends only the same seeded random subset of the vector's entries (GET
// /round announces its public seed and length); the protocol core runs on vectors of the
// subset's length, and the sum comes back scattered to the whole vector with zeros elsewhere
// (the close leaves those entries unchanged this round). The seed is derived from the model
// and the session, so replaying secagg.wal rebuilds the same subset.
//
// Signed keys (--secagg-signed-keys, privacy/secagg_signed.h: Bonawitz et al.'s malicious-server
// additions): with signing_ca set, POST keys takes SignedKeys only (the certificate checked
// against the CA, its CN the DTLS identity, the signature over the keys and session: 4.22
// otherwise), GET keys answers the SignedKeyDirectory, and a consistency step comes between
// the input step and the unmasking: each survivor posts its signature over U3, and GET
// consistency answers the signatures gathered once at least t arrived (by the step's
// deadline; fewer: the attempt is abandoned). The server checks every signature too, so one
// device's bad one cannot make the others refuse; the devices check them all themselves. The
// signed messages and the consistency close go through secagg.wal like the others.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "privacy/secagg.h"
#include "privacy/secagg_signed.h"
#include "server/write_ahead_log.h"
#include "transport/coap_dtls.h"

namespace edgetrain::server {

// CoAP 5.03: the step asked for has not closed yet; ask again (ours: no Max-Age).
inline constexpr int kCoapNotYet = 503;

struct SecureRoundOptions {
  double threshold_fraction = 0.6;  // t = max(⌊n/2⌋ + 1, ⌈fraction · n⌉), n = |U1|
  double step_seconds = 30;         // each step's deadline
  double clip_norm = 0;             // S: the devices' deltas are clipped to it (quantize.h)
  std::uint32_t min_devices = 2;    // keys needed before the keys step may close early
  std::uint64_t model_id = 0;       // secagg.wal's header; with the session, the subset's seed
  double subset_fraction = 0;       // 0: every entry (dense); in (0, 1]: privacy/subset.h
  // SecAgg+ (privacy/secagg_graph.h): k neighbours per device, an even number; 0: every device.
  // The graph's seed is drawn when the keys step closes and logged with its close; t counts a
  // neighbourhood's k + 1 holders; with min_survivors, the input step also needs that many.
  std::uint32_t neighbours = 0;
  // Distributed noise (dp-fedavg, privacy/distributed_noise.h): the per-value range B the
  // devices quantize their noised deltas in (0: clip_norm, no noise), and the fewest
  // survivors a round may close with, c: the keys step waits for c keys and the threshold t
  // is at least c, so |U3| ≥ c and the sum holds at least c devices' shares of the noise
  // (0: no floor beyond the protocol's).
  double value_bound = 0;
  std::uint32_t min_survivors = 0;
  // Signed keys and the consistency step: the CA the devices' certificates chain to; null:
  // keys authenticated by the transport only (the semi-honest model).
  std::shared_ptr<const privacy::CertificateAuthority> signing_ca;
  // Discrete noise (privacy/skellam.h): the devices send integers of scale γ, and the sum is
  // read back as int32(sum)/γ whatever the session's devices; 0: quantize.h's scale.
  double skellam_scale = 0;
  // Adaptive clipping under secure aggregation (privacy/distributed_noise.h, "The count"): the
  // vector's last value is each device's unclipped bit plus its share of the count's noise,
  // quantized in [−count_value_bound, count_value_bound] and read back with that bound; 0: no
  // such value.
  double count_value_bound = 0;
  std::function<std::chrono::steady_clock::time_point()> now;
  std::function<void(const std::string&)> log;
};

// The secure-aggregation side of one round at a time. Used from the server's one thread.
class SecureRound {
 public:
  enum class Step { kKeys, kShares, kMaskedInput, kConsistency, kUnmasking };  // kConsistency: signed only
  // `attempt_file`: secagg_attempt.json. Throws StateError when it is damaged.
  SecureRound(SecureRoundOptions options, std::filesystem::path attempt_file);

  // Begins round `round` (its first attempt, or the next one after a restart) for vectors of
  // `vector_length` values. Throws when the attempt cannot be made durable.
  void begin(std::uint64_t round, std::uint32_t vector_length);
  // As begin() for a running server: a failure is logged, every message answered 5.00 and
  // begin retried by poll() until it works.
  void begin_next_round(std::uint64_t round, std::uint32_t vector_length) { begin_or_note(round, vector_length); }
  // At start-up: goes on with the session secagg.wal holds when it is of this round's current
  // attempt and replays; begin() otherwise.
  void resume_or_begin(std::uint64_t round, std::uint32_t vector_length);
  // Adaptive clipping: the clip norm and value bound of the sessions to come (and of the one
  // in progress, whose sum is read back with them): the caller sets them before begin or
  // resume, from the clip norm the session's devices were announced.
  void set_value_bound(double clip_norm, double value_bound) {
    options_.clip_norm = clip_norm;
    options_.value_bound = value_bound;
  }

  // What a close needs: Σ over U3 of the quantized deltas, read back as values.
  struct Sum {
    std::vector<double> values;      // the whole vector: 0 outside a subset
    std::size_t entries_summed = 0;  // the subset's length (the vector's without one)
    std::size_t survivors = 0;       // |U3|
    std::size_t key_holders = 0;     // |U1|
    std::size_t unmasking_senders = 0;
  };
  // Moves on when a step's devices have all answered or its deadline passed; returns the sum
  // once the unmasking succeeds (the caller applies it and begins the next round).
  // `expected_keys`: the selected devices the round waits for in the keys step.
  std::optional<Sum> poll(std::size_t expected_keys);

  transport::CoapResponse handle(transport::Method method, const std::string& resource,
                                 const std::string& identity, const transport::CoapRequest& request,
                                 bool selected);

  std::uint64_t session() const { return session_; }
  Step step() const { return step_; }
  static const char* step_name(Step step);
  // In U1 of the current attempt (or the keys step is still open).
  bool may_take_part(const std::string& identity) const;
  std::string status_json() const;  // the secagg_* keys of /status
  std::uint32_t threshold() const { return threshold_; }
  bool signed_keys() const { return options_.signing_ca != nullptr; }
  // The session's subset (privacy/subset.h), for GET /round: nullopt when dense.
  struct Subset {
    std::uint64_t seed = 0;
    std::uint32_t length = 0;
  };
  std::optional<Subset> subset() const;
  // How many ring values a masked input of this session holds: the subset's length, or the
  // vector's.
  std::uint32_t sent_length() const;

 private:
  void next_attempt(const std::string& why);
  // The session number of (round, attempt_) and its subset.
  void set_session(std::uint64_t round, std::uint32_t vector_length);
  // begin() that logs a failure instead of throwing (cannot_begin_).
  void begin_or_note(std::uint64_t round, std::uint32_t vector_length);
  // Appends one record to secagg.wal and syncs it; throws WalError.
  void record(const std::string& identity, std::uint64_t kind, std::vector<std::uint8_t> body);
  // One record of secagg.wal into the session's state, as when its message came.
  void replay(const WalRecord& record);
  // Closes the current step (after its record is durable, or replaying it).
  void close_keys(std::uint32_t threshold, std::uint64_t graph_seed);
  // Signed sessions: checks SignedKeys (against the CA, from `identity`) and keeps them.
  void take_signed_keys(const std::string& identity, privacy::SignedKeys keys);
  void close_masked_input();
  void close_consistency();
  void open_step(Step step);
  double seconds_left() const;
  void log(const std::string& line) const;

  SecureRoundOptions options_;
  std::filesystem::path attempt_file_;
  std::filesystem::path log_path_;  // secagg.wal
  std::optional<WalWriter> log_;
  std::uint64_t round_ = 0;
  std::uint32_t attempt_ = 0;
  std::uint32_t vector_length_ = 0;
  std::uint64_t session_ = 0;
  std::uint64_t subset_seed_ = 0;
  std::vector<std::uint32_t> subset_indices_;  // empty: dense
  std::optional<privacy::SecAggServer> server_;
  Step step_ = Step::kKeys;
  std::chrono::steady_clock::time_point step_opened_;
  std::uint32_t threshold_ = 0;
  std::map<std::string, privacy::AdvertiseKeys, std::less<>> keys_;  // the keys step's, until it closes
  std::set<std::string, std::less<>> posted_;  // who posted in the current step
  std::vector<std::uint8_t> directory_bytes_, survivors_bytes_;
  // Signed sessions: U1's credentials and checked certificates, step 3 and its answer.
  std::map<std::string, privacy::KeyCredential, std::less<>> credentials_;
  std::map<std::string, privacy::PeerCertificate, std::less<>> certificates_;
  std::optional<privacy::ConsistencyRound> consistency_;
  std::vector<std::uint8_t> consistency_bytes_;
  // begin() failed after start-up (the state directory would not take secagg_attempt.json or
  // secagg.wal): every message is refused (5.00) and poll() tries again.
  bool cannot_begin_ = false;
  std::uint64_t attempts_abandoned_ = 0, refused_ = 0, malformed_ = 0;
  Sum last_close_;  // the set sizes of the last sum (its values are not kept)
};

}  // namespace edgetrain::server
