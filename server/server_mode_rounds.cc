// --mode rounds on the server: the round coordinator (server/round_coordinator.h) behind the
// ServerMode seam.
#include <cstdio>

#include "server/round_coordinator.h"
#include "server/server_mode.h"

namespace edgetrain::server {
namespace {

class RoundsMode : public ServerMode {
 public:
  RoundsMode(ServerState& state, RoundOptions options) : rounds_(state, std::move(options)) {}
  std::string_view name() const override { return "rounds"; }
  void attach(transport::CoapDtlsServer& server,
              std::function<void(const transport::CoapRequest&)> note) override {
    rounds_.attach(server, std::move(note));
  }
  void poll() override { rounds_.poll(); }  // a round's deadline passes without a request
  std::string status_json() const override { return rounds_.status_json(); }
  std::optional<StopReason> stop_reason() const override {
    if (auto why = rounds_.privacy_exhausted()) return StopReason{"privacy", *why};
    return std::nullopt;
  }
  const RoundCoordinator& rounds() const { return rounds_; }

 private:
  RoundCoordinator rounds_;
};

}  // namespace

void declare_rounds_settings(settings::Table& t, ServerSettings& s) {
  t.add("round-policy", s.round_policy,
        "rounds: drop-stragglers closes at --round-deadline with what arrived; "
        "wait-all waits for every selected device, up to 4x the deadline")
      .choices({"drop-stragglers", "wait-all"});
  t.add("aggregation", s.aggregation,
        "rounds: masked averages each parameter over the devices that sent it; "
        "fedavg counts a missing entry as zero; trimmed-mean and median are robust to a few "
        "bad devices (coordinate-wise over the devices that sent it, unweighted)")
      .choices({"masked", "fedavg", "trimmed-mean", "median", "dp-fedavg"});
  t.add("trim-fraction", s.trim_fraction,
        "rounds, trimmed-mean: the share of each parameter's values dropped at each end "
        "(0.2 of 8 devices drops the lowest and the highest)")
      .range(0, 0.499);
  t.add("round-clip-norm", s.round_clip_norm,
        "rounds: scale each device's delta down to this L2 norm when it is above it (the "
        "round log keeps the clipped delta); 0: no clipping")
      .range(0, 3.4e38);
  t.add("dp-noise-multiplier", s.dp_noise_multiplier,
        "rounds, dp-fedavg: the Gaussian noise added to each round's aggregate, as a multiple "
        "of the clip norm over the expected devices (server/README.md \"Differential privacy\"); "
        "with --secure-aggregation the devices add it, each its share for --min-clients survivors")
      .range(0, 1e6);
  t.add("dp-expected-devices", s.dp_expected_devices,
        "rounds, dp-fedavg: the devices a round takes on average (client fraction x fleet), "
        "DP-FedAvg's fixed denominator")
      .range(0, 1e9);
  t.add("dp-delta", s.dp_delta, "rounds, dp-fedavg: the delta at which epsilon is reported")
      .range(1e-30, 0.999);
  t.add("dp-target-epsilon", s.dp_target_epsilon,
        "rounds, dp-fedavg: end the run before a round would take epsilon past this; 0: no "
        "limit")
      .range(0, 1e9);
  t.add("dp-noise", s.dp_noise,
        "rounds, dp-fedavg with --secure-aggregation: the devices' noise; gaussian: each adds its "
        "Gaussian share and rounds it to the ring; skellam: each rounds its scaled delta and adds "
        "integer Skellam noise, exact in the ring, with the Skellam mechanism's accountant "
        "(Agarwal et al. 2021; docs/privacy.md \"Discrete noise\")")
      .choices({"gaussian", "skellam"});
  t.add("dp-adaptive-clip-quantile", s.dp_adaptive_clip_quantile,
        "rounds, dp-fedavg: move the clip norm each round towards this quantile of the "
        "devices' delta norms, privately (Andrew et al. 2021; --round-clip-norm is the first "
        "round's); 0: a fixed clip norm")
      .range(0, 0.999);
  t.add("dp-clip-learning-rate", s.dp_clip_learning_rate,
        "rounds, adaptive clipping: the clip norm's geometric step per round")
      .range(1e-6, 10);
  t.add("dp-clip-count-stddev", s.dp_clip_count_stddev,
        "rounds, adaptive clipping: the noise on the count of unclipped deltas (part of the "
        "budget --dp-noise-multiplier sets); 0: expected devices / 20")
      .range(0, 1e9);
  t.add("secure-aggregation", s.secure_aggregation,
        "rounds: devices send their clipped deltas quantized and masked (Bonawitz et al. 2017), "
        "the server learns only the survivors' sum; needs --round-clip-norm; not with "
        "trimmed-mean or median; with dp-fedavg the noise is the devices' (and adaptive "
        "clipping's count a masked value) (docs/privacy.md)");
  t.add("secagg-threshold", s.secagg_threshold,
        "rounds, secure aggregation: the share of the round's key holders whose unmasking "
        "shares are needed (a majority: above 0.5); each step has --round-deadline")
      .range(0.5001, 1);
  t.add("secagg-neighbours", s.secagg_neighbours,
        "rounds, secure aggregation: SecAgg+ (Bell et al. 2020): each device masks and shares "
        "its secrets with k neighbours on a random graph drawn once the keys are in, instead "
        "of with every device, and --secagg-threshold counts a neighbourhood's k + 1; an even "
        "k, 0: every device (docs/privacy.md, \"SecAgg+\")")
      .range(0, 254);
  t.add("secagg-subset", s.secagg_subset,
        "rounds, secure aggregation: every device sends the same seeded random share of its "
        "delta's entries (announced with each session), keeping the rest for later rounds "
        "(error feedback); the round moves only those entries. 0: every entry (docs/privacy.md)")
      .range(0, 1);
  t.add("secagg-signed-keys", s.secagg_signed_keys,
        "rounds, secure aggregation: devices sign their keys and the survivor list with their "
        "certificates (from --ca), so that a server that substitutes keys or tells devices "
        "different survivor lists learns nothing; devices with PSK identities cannot take part. "
        "Without it keys are authenticated by the transport only (docs/privacy.md)");
  t.add("round-deadline", s.round_deadline, "rounds: how long a round stays open")
      .range(0.1, 1e6)
      .unit("seconds");
  t.add("client-fraction", s.client_fraction,
        "rounds: fraction of the devices seen selected each round (seeded by "
        "--seed)")
      .range(0.001, 1);
  t.add("min-clients", s.min_clients,
        "rounds: deltas a round needs before it may close before its deadline; with "
        "dp-fedavg and --secure-aggregation also the fewest survivors a round closes with, "
        "whose noise shares must add up to the whole noise (at least 2)")
      .range(1, 1000000);
  t.add("local-steps", s.local_steps, "rounds: minibatches each selected device trains per round")
      .range(1, 1000000);
  t.add("local-epochs", s.local_epochs,
        "rounds: passes over its own shard each selected device trains per round "
        "instead of --local-steps (0: use --local-steps)")
      .range(0, 1000);
  t.add("server-lr", s.server_lr,
        "rounds: the round's model moves by this times the aggregated delta")
      .range(1e-6, 100);
}

std::unique_ptr<ServerMode> make_rounds_mode(const ServerSettings& s, ServerState& state,
                                             ResourceOptions& resources) {
  RoundOptions o;
  o.policy = parse_round_policy(s.round_policy);
  o.rule = {parse_aggregation(s.aggregation), s.trim_fraction};
  o.rule.expected_devices = s.dp_expected_devices;
  o.privacy.noise_multiplier = s.dp_noise_multiplier;
  o.privacy.delta = s.dp_delta;
  o.privacy.target_epsilon = s.dp_target_epsilon;
  o.privacy.skellam = s.dp_noise == "skellam";
  o.clip_norm = s.round_clip_norm;
  o.privacy.adaptive = {s.dp_adaptive_clip_quantile, s.dp_clip_learning_rate,
                        s.dp_clip_count_stddev};
  o.secure = {s.secure_aggregation, s.secagg_threshold, s.secagg_subset,
              s.secagg_signed_keys ? s.ca : std::string(), s.secagg_neighbours};
  if (s.secure_aggregation && !s.secagg_signed_keys)
    log_line("WARNING: secure aggregation without --secagg-signed-keys: the devices' keys are "
             "authenticated by the transport only, so the devices trust this server to relay them "
             "unchanged (the semi-honest model; with PSK identities there is no key the server does "
             "not know; docs/privacy.md)");
  o.deadline_seconds = s.round_deadline;
  o.client_fraction = s.client_fraction;
  o.min_clients = s.min_clients;
  o.local_steps = s.local_steps;
  o.local_epochs = s.local_epochs;
  o.server_lr = static_cast<float>(s.server_lr);
  o.store_learning_rate = static_cast<float>(s.lr);
  o.max_parameter_magnitude = static_cast<float>(s.max_parameter_magnitude);
  o.seed = s.seed;
  o.log = log_line;
  if (s.publish_every > 0)
    log_line("WARNING: --publish-every is ignored with --mode rounds: a round's model is exact");
  auto mode = std::make_unique<RoundsMode>(state, o);
  resources.updates_refused_because = "--mode rounds: post model deltas to /round/update";
  resources.extra_status = [m = mode.get()] { return m->status_json(); };
  log_line("federated rounds: round " + std::to_string(mode->rounds().round()) + ", policy " +
           s.round_policy + ", " + s.aggregation +
           (o.rule.kind == Aggregation::kTrimmedMean
                ? " (trim " + short_number(s.trim_fraction) + ")"
                : std::string()) +
           " aggregation" +
           (s.round_clip_norm > 0 ? ", deltas clipped at norm " + short_number(s.round_clip_norm)
                                  : std::string()) +
           (o.rule.kind == Aggregation::kDpFedAvg
                ? ", DP noise multiplier " + short_number(s.dp_noise_multiplier) + " over " +
                      short_number(s.dp_expected_devices) + " expected devices (epsilon now " +
                      short_number(mode->rounds().epsilon()) + " at delta " +
                      short_number(s.dp_delta) + ")" +
                      (o.privacy.adaptive.enabled()
                           ? ", adaptive clipping to the " +
                                 short_number(s.dp_adaptive_clip_quantile) +
                                 " quantile (clip norm now " +
                                 short_number(mode->rounds().clip_norm()) + ")"
                           : std::string())
                : std::string()) +
           (s.secure_aggregation ? ", secure aggregation (threshold " + short_number(s.secagg_threshold) + " of the key holders" +
                                         (s.secagg_subset > 0 ? ", a subset of " + short_number(s.secagg_subset) + " of the entries" : std::string()) +
                                         (s.secagg_signed_keys ? ", keys signed by the devices' certificates" : std::string()) +
                                         (s.secagg_neighbours > 0 ? ", " + std::to_string(s.secagg_neighbours) + " neighbours each" : std::string()) + ")" : std::string()) +
           ", deadline " +
           short_number(s.round_deadline) + " s, client fraction " +
           short_number(s.client_fraction) + ", " +
           (s.local_epochs > 0 ? std::to_string(s.local_epochs) + " local epochs"
                               : std::to_string(s.local_steps) + " local steps") +
           ", server lr " + short_number(s.server_lr));
  return mode;
}

}  // namespace edgetrain::server
