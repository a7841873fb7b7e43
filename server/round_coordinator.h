// Federated rounds on the server (edgetrain-server --mode rounds; server/README.md,
// "Federated rounds"). Round r is the model version it starts from: the model only changes
// when a round closes, and each close is one update through ServerState (so one version).
//
//   GET  /round          2.05, JSON: {"round", "model_version", "deadline_seconds" (left),
//                        "selected", "local_steps", "local_epochs", "policy"}; with
//                        local_epochs > 0 a device trains that many passes over its shard
//                        instead of local_steps minibatches
//   POST /round/update?examples=N
//                        the device's model delta (new − start) as a sparse update of the
//                        codec, its fetched-version field = the round number. 2.04 (empty)
//                        once the delta is in the synced round log; the same identity
//                        again in the same round: 2.04, not counted twice. 4.09 with a
//                        reason for a closed or wrong round, another model, or a device not
//                        selected this round; 4.00 malformed; 4.01 no identity; 4.22 a
//                        value that is not finite or that alone would move a parameter
//                        past --max-parameter-magnitude (counted per device, as refused
//                        updates are: /status "devices_refused", and quarantined after
//                        --quarantine-after in a row: 4.03 until it ends). With
//                        --round-clip-norm τ a delta whose L2 norm is above τ is scaled
//                        to τ before it is logged (/status "round_deltas_clipped"; the
//                        close's log line names the devices and their norms).
//
// Durability (ours): deltas go to `rounds.wal` in the state directory, a log of the WAL's
// format and kind WalKind::kRoundDeltas (server/write_ahead_log.h: CRC'd records, fdatasync
// before the 2.04); a restart replays the records of the current round (those of closed
// rounds are ignored). Damage is the WAL's: a torn last record is cut, damage with intact
// records after it refuses the start, names the offset and the records after it, and
// changes no file (`edgetrain-server repair-wal` repairs it). The close is one update
// submitted to ServerState under the identity "#round-close" (sequence = round + 1): values
// −server_lr·Δ/lr applied with divisor 1 (delay 0), so it lands in the main WAL and replays
// bit for bit like any update; then rounds.wal is replaced by an empty one. Deadlines and
// the identities seen are not durable: after a restart the round's deadline starts again.
// A `rounds.log` of an earlier release (its own format) is read once, its open round's
// deltas moved into rounds.wal, and removed.
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

#include "privacy/skellam.h"
#include "server/adaptive_clipping.h"
#include "server/dp_accountant.h"
#include "server/round_aggregation.h"
#include "server/secure_round.h"
#include "server/server_state.h"
#include "server/write_ahead_log.h"
#include "transport/coap_dtls.h"

namespace edgetrain::server {

struct RoundOptions {
  // The rule (and trimmed-mean's β): server/round_aggregation.h.
  AggregationRule rule;
  // Per-device norm clipping (clip_round_delta): a delta whose L2 norm is above this is
  // scaled down to it before it is logged; 0: off.
  double clip_norm = 0;
  // Client-level differential privacy (rule.kind kDpFedAvg, issue 39): the close adds
  // Gaussian noise of standard deviation noise_multiplier · clip_norm / expected_devices
  // (server/secure_noise.h) to the aggregate, and the accountant (server/dp_accountant.h,
  // sampling rate client_fraction) reports ε at `delta` after every round. With
  // target_epsilon > 0 a close that would take ε past it is not made: the run ends
  // (privacy_exhausted()).
  struct Privacy {
    double noise_multiplier = 0;
    double delta = 1e-5;
    double target_epsilon = 0;
    // Adaptive clipping (server/adaptive_clipping.h): clip_norm is then the first round's
    // clip norm S_0, and each close moves it towards this quantile of the devices' delta
    // norms. The current S is kept in `round_clip.json` in the state directory (written
    // durably before the close it belongs to is submitted), so a restart goes on with it.
    AdaptiveClipping adaptive;
    // With secure aggregation: the devices add Skellam integer noise after they round their
    // scaled deltas (privacy/skellam.h), exact in the ring, instead of Gaussian noise rounded
    // to it; the accountant counts the Skellam mechanism's bound (server/dp_accountant.h).
    bool skellam = false;
  } privacy;
  // Secure aggregation (issue 39 part 2, server/secure_round.h): devices send their clipped
  // deltas quantized and masked; the close applies the unweighted mean of the survivors'
  // (ours: a weight per device would need its example count in the clear). Needs clip_norm;
  // refused with trimmed-mean and median. Each step's deadline: deadline_seconds. With
  // dp-fedavg the noise is distributed (privacy/distributed_noise.h): GET /round announces
  // each device's share σ_d = z·S/√c, c = max(min_clients, 2) the fewest survivors a round
  // closes with, and the range the devices quantize in; the close is the sum over the
  // expected devices, with no noise of the server's. With adaptive clipping each device also
  // appends its unclipped bit plus its share σ_b/√c of the count's noise as one more value
  // (the server unmasks only the noisy count; σ_d is then z_Δ·S_r/√c, announced each round);
  // not yet with --dp-noise skellam or a subset.
  struct SecureAggregation {
    bool enabled = false;
    double threshold_fraction = 0.6;  // t = max(⌊n/2⌋ + 1, ⌈fraction · n⌉)
    double subset_fraction = 0;       // > 0: a seeded random subset of entries (privacy/subset.h)
    // Non-empty: the CA file the devices' certificates chain to; keys are signed and the
    // consistency round runs (privacy/secagg_signed.h, --secagg-signed-keys).
    std::string signing_ca_file;
    std::uint32_t neighbours = 0;     // SecAgg+'s k (privacy/secagg_graph.h); 0: every device
  } secure;
  RoundPolicy policy = RoundPolicy::kDropStragglers;
  // drop-stragglers: the round closes this long after it opened with the deltas that
  // arrived. wait-all: a safety limit of kWaitAllSafetyFactor times this for a device that
  // vanished (ours).
  double deadline_seconds = 30;
  double client_fraction = 1.0;   // of the identities seen, selected per round (seeded)
  std::uint32_t min_clients = 1;  // deltas needed before a round may close early
  std::uint32_t local_steps = 10;
  std::uint32_t local_epochs = 0;  // > 0: passes over each device's shard instead of local_steps
  float server_lr = 1.0f;
  float store_learning_rate =
      0.1f;  // ServerStateOptions::store.learning_rate (the close divides by it)
  // A delta is refused (4.22) when a value is not finite or moves a parameter by more than
  // this (|server_lr · v|): the server's --max-parameter-magnitude, which no parameter may
  // pass, so a delta that alone would is never an honest one.
  float max_parameter_magnitude = 1e6f;
  std::uint64_t seed = 1;
  std::function<std::chrono::steady_clock::time_point()> now = [] {
    return std::chrono::steady_clock::now();
  };
  std::function<void(const std::string&)> log;
};
inline constexpr const char* kRoundCloseIdentity = "#round-close";

class RoundCoordinator {
 public:
  // Opens (or creates) rounds.wal in the state's directory and reloads the current round's
  // deltas. Throws StateError when the log belongs to another model, is not a round log, or
  // is damaged in the middle (the message names the offset and says how to repair it).
  RoundCoordinator(ServerState& state, RoundOptions options);
  ~RoundCoordinator();
  RoundCoordinator(const RoundCoordinator&) = delete;
  RoundCoordinator& operator=(const RoundCoordinator&) = delete;

  transport::CoapResponse get_round(const transport::CoapRequest& request);
  transport::CoapResponse post_round_update(const transport::CoapRequest& request);
  // With secure aggregation: the /round/secagg/<step> resources (server/secure_round.h);
  // `step` is keys, shares, input, survivors or unmask.
  transport::CoapResponse secagg_request(transport::Method method, const std::string& step,
                                         const transport::CoapRequest& request);
  // Closes the round when it is due (all selected devices answered, or the deadline).
  // Called after each request and from the serving loop. Returns true when it closed one.
  bool poll();
  // Serves GET /round and POST /round/update on `server`; `note` (if set) sees each request
  // first (the server's ingress and device counters: ServerResources::note_request).
  void attach(transport::CoapDtlsServer& server,
              std::function<void(const transport::CoapRequest&)> note = {});

  std::uint64_t round() const { return state_.version(); }
  std::size_t deltas_received() const { return deltas_.size(); }
  bool selected(const std::string& identity, std::uint64_t round) const;
  // The round keys of /status and the stats file.
  std::string status_json() const;
  // dp-fedavg: ε after the rounds closed so far (0 otherwise).
  double epsilon() const;
  // The clip norm deltas of the current round are clipped to (adaptive clipping moves it).
  double clip_norm() const { return clip_norm_; }
  // dp-fedavg with a target ε: why no further round may close, once that is so.
  std::optional<std::string> privacy_exhausted() const { return privacy_exhausted_; }

 private:
  void open_log();
  void migrate_legacy_log(const std::filesystem::path& legacy);
  void append_to_log(std::uint64_t examples, const std::string& identity,
                     std::span<const std::uint8_t> body);
  void close_round();
  // Applies a secure round's unmasked sum like a plain close, then begins the next round.
  void close_secure_round(const SecureRound::Sum& sum_with_count);
  // σ_d and B of the current clip norm (the devices' Gaussian shares at z or z_Δ).
  void update_device_noise();
  // What each device of a secure session sends: the parameters, and the count's value.
  std::uint32_t secure_vector_length() const;
  // dp-fedavg with a target ε: whether closing `round` would pass it (then privacy_exhausted_
  // says so, and no further round closes).
  bool secure_round_passes_budget(std::uint64_t round);
  std::size_t selected_seen() const;  // secure rounds: of last_heard_, recently
  void heard_from(const std::string& identity);
  // The round's deltas are dropped (a close the store refused): the same round again, with
  // an empty log and every device free to send.
  void restart_round(const std::string& why);
  void empty_log();
  // Adaptive clipping's durable state: round_clip.json, {"round": r, "clip_norm": S_r,
  // "previous_clip_norm": S_r−1}, written before round r − 1's close is submitted.
  void load_clip_state();
  void save_clip_state(std::uint64_t round, double clip_norm, double previous) const;
  double seconds_left() const;
  void log(const std::string& line) const;

  ServerState& state_;
  RoundOptions options_;
  std::filesystem::path log_path_;
  std::optional<WalWriter> log_;
  std::chrono::steady_clock::time_point opened_;
  std::vector<RoundDelta> deltas_;
  std::set<std::string> answered_;  // identities with a delta in this round
  std::set<std::string> seen_;      // identities that asked for a round
  // Secure rounds: when each identity last made a request. The keys step expects the selected
  // devices heard from within two deadlines (ours), not every device ever seen, so that a
  // round does not wait out its deadline for devices that left long ago.
  std::map<std::string, std::chrono::steady_clock::time_point> last_heard_;
  std::uint64_t rounds_closed_ = 0, stragglers_ = 0, late_refused_ = 0, wrong_refused_ = 0,
                malformed_ = 0;
  std::uint64_t duplicates_ = 0, close_failures_ = 0, refused_values_ = 0, quarantined_ = 0,
                clipped_ = 0;
  static constexpr std::size_t kClippedNamesLogged = 5;
  std::vector<std::string> clipped_this_round_;  // "identity norm", for the close's log line
  std::optional<DpAccountant> accountant_;        // dp-fedavg
  double clip_norm_ = 0;                  // the current round's (options_.clip_norm when fixed)
  double delta_noise_multiplier_ = 0;     // z, or z_Δ with adaptive clipping
  // dp-fedavg with secure aggregation: each device's share of the noise, σ_d, and the ring's
  // per-value range B (privacy/distributed_noise.h); 0 otherwise.
  double device_noise_stddev_ = 0;
  double secure_value_bound_ = 0;
  std::uint32_t noise_survivors_ = 0;  // c
  // privacy.skellam: the plan every device follows (γ, v_d, Δ2, Δ1); scale 0 otherwise.
  privacy::SkellamPlan skellam_;
  // Adaptive clipping with secure aggregation: each device's share of the count's noise,
  // σ_b/√c, and the appended value's range B_b (privacy/distributed_noise.h); 0 otherwise.
  double count_device_stddev_ = 0;
  double count_value_bound_ = 0;
  std::size_t unclipped_this_round_ = 0;  // adaptive clipping's count b
  std::optional<double> pending_clip_norm_;  // S_r+1 while round r's close is submitted
  std::filesystem::path clip_state_path_;
  std::optional<std::string> privacy_exhausted_;
  std::unique_ptr<SecureRound> secure_;  // --secure-aggregation
};

}  // namespace edgetrain::server
