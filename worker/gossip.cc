#include "worker/gossip.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

#include "common/splitmix64.h"
#include "transport/identity.h"

namespace edgetrain::runtime {

namespace {

constexpr std::uint32_t kMaxPeers = 100000;

std::vector<GossipPeerAddress> numbered_peers(std::uint32_t count, const std::string& prefix) {
  std::vector<GossipPeerAddress> peers(count);
  for (std::uint32_t i = 0; i < count; ++i) peers[i].name = prefix + std::to_string(i);
  return peers;
}

// A uniform random pairing of `degree` half-edges per peer (the configuration model);
// nullopt when the draw has a self loop or a double edge.
std::optional<std::vector<std::pair<std::uint32_t, std::uint32_t>>> draw_pairing(
    std::uint32_t peers, std::uint32_t degree, SplitMix64& random) {
  std::vector<std::uint32_t> stubs;
  stubs.reserve(static_cast<std::size_t>(peers) * degree);
  for (std::uint32_t i = 0; i < peers; ++i)
    for (std::uint32_t d = 0; d < degree; ++d) stubs.push_back(i);
  for (std::size_t i = stubs.size(); i > 1; --i) std::swap(stubs[i - 1], stubs[random.next() % i]);
  std::set<std::pair<std::uint32_t, std::uint32_t>> seen;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  for (std::size_t i = 0; i + 1 < stubs.size(); i += 2) {
    const std::uint32_t a = std::min(stubs[i], stubs[i + 1]), b = std::max(stubs[i], stubs[i + 1]);
    if (a == b || !seen.insert({a, b}).second) return std::nullopt;
    edges.emplace_back(a, b);
  }
  return edges;
}

}  // namespace

const char* gossip_algorithm_name(GossipAlgorithm algorithm) {
  return algorithm == GossipAlgorithm::kDpsgd ? "d-psgd" : "ad-psgd";
}

GossipAlgorithm parse_gossip_algorithm(const std::string& name) {
  if (name == "d-psgd") return GossipAlgorithm::kDpsgd;
  if (name == "ad-psgd") return GossipAlgorithm::kAdpsgd;
  throw std::invalid_argument("--gossip: unknown algorithm '" + name + "' (d-psgd or ad-psgd)");
}

const char* topology_kind_name(TopologyKind kind) {
  switch (kind) {
    case TopologyKind::kRing:
      return "ring";
    case TopologyKind::kRandomRegular:
      return "random-regular";
    case TopologyKind::kFull:
      return "full";
    case TopologyKind::kExplicit:
      return "explicit";
  }
  return "?";
}

TopologyKind parse_topology_kind(std::string_view name) {
  for (TopologyKind k : {TopologyKind::kRing, TopologyKind::kRandomRegular, TopologyKind::kFull,
                         TopologyKind::kExplicit})
    if (name == topology_kind_name(k)) return k;
  throw std::invalid_argument("unknown topology '" + std::string(name) +
                              "' (ring, random-regular, full, explicit)");
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> GossipTopology::edges() const {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> out;
  for (std::uint32_t i = 0; i < neighbours.size(); ++i)
    for (std::uint32_t j : neighbours[i])
      if (i < j) out.emplace_back(i, j);
  return out;
}

std::optional<std::uint32_t> GossipTopology::find(std::string_view name) const {
  for (std::uint32_t i = 0; i < peers.size(); ++i)
    if (peers[i].name == name) return i;
  return std::nullopt;
}

bool GossipTopology::connected() const {
  if (peers.empty()) return true;
  std::vector<bool> seen(peers.size(), false);
  std::vector<std::uint32_t> stack = {0};
  seen[0] = true;
  std::size_t reached = 1;
  while (!stack.empty()) {
    const std::uint32_t i = stack.back();
    stack.pop_back();
    for (std::uint32_t j : neighbours[i])
      if (!seen[j]) {
        seen[j] = true;
        ++reached;
        stack.push_back(j);
      }
  }
  return reached == peers.size();
}

GossipTopology topology_from_edges(
    std::vector<GossipPeerAddress> peers,
    const std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges) {
  if (peers.empty() || peers.size() > kMaxPeers)
    throw std::invalid_argument("a topology needs 1 to " + std::to_string(kMaxPeers) +
                                " peers, not " + std::to_string(peers.size()));
  std::set<std::string> names;
  for (const GossipPeerAddress& p : peers) {
    if (!transport::is_plain_identity(p.name))
      throw std::invalid_argument("peer name '" + p.name.substr(0, 80) +
                                  "' is not a plain identity (1-64 of A-Za-z0-9._-)");
    if (!names.insert(p.name).second)
      throw std::invalid_argument("peer name '" + p.name + "' appears twice");
  }
  GossipTopology t;
  t.kind = TopologyKind::kExplicit;
  t.neighbours.assign(peers.size(), {});
  const auto n = static_cast<std::uint32_t>(peers.size());
  for (const auto& [a, b] : edges) {
    if (a >= n || b >= n)
      throw std::invalid_argument("edge [" + std::to_string(a) + ", " + std::to_string(b) +
                                  "] names a peer beyond the " + std::to_string(n) + " listed");
    if (a == b)
      throw std::invalid_argument("edge [" + std::to_string(a) + ", " + std::to_string(a) +
                                  "] is a self loop");
    t.neighbours[a].push_back(b);
    t.neighbours[b].push_back(a);
  }
  for (auto& list : t.neighbours) {
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
  }
  t.peers = std::move(peers);
  return t;
}

GossipTopology make_topology(TopologyKind kind, std::uint32_t peers, std::uint32_t degree,
                             std::uint64_t seed, const std::string& name_prefix) {
  if (peers < 2 || peers > kMaxPeers)
    throw std::invalid_argument("a generated topology needs 2 to " + std::to_string(kMaxPeers) +
                                " peers, not " + std::to_string(peers));
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  switch (kind) {
    case TopologyKind::kRing:
      for (std::uint32_t i = 0; i < peers; ++i)
        if (peers > 2 || i == 0) edges.emplace_back(i, (i + 1) % peers);
      break;
    case TopologyKind::kFull:
      for (std::uint32_t i = 0; i < peers; ++i)
        for (std::uint32_t j = i + 1; j < peers; ++j) edges.emplace_back(i, j);
      break;
    case TopologyKind::kRandomRegular: {
      if (degree < 1 || degree >= peers || (static_cast<std::uint64_t>(peers) * degree) % 2 != 0)
        throw std::invalid_argument(
            "a random " + std::to_string(degree) + "-regular graph on " + std::to_string(peers) +
            " peers does not exist (needs 1 <= degree < peers and peers x degree even)");
      SplitMix64 random{seed};
      for (int attempt = 0;; ++attempt) {
        if (attempt == 100000)
          throw std::invalid_argument("no simple connected " + std::to_string(degree) +
                                      "-regular graph drawn on " + std::to_string(peers) +
                                      " peers in 100000 attempts");
        auto drawn = draw_pairing(peers, degree, random);
        if (!drawn) continue;
        GossipTopology t = topology_from_edges(numbered_peers(peers, name_prefix), *drawn);
        if (!t.connected()) continue;
        t.kind = kind;
        return t;
      }
    }
    case TopologyKind::kExplicit:
      throw std::invalid_argument("an explicit topology comes from a file, not from make_topology");
  }
  GossipTopology t = topology_from_edges(numbered_peers(peers, name_prefix), edges);
  t.kind = kind;
  return t;
}

std::string topology_json(const GossipTopology& topology) {
  nlohmann::json peers = nlohmann::json::array();
  for (const GossipPeerAddress& p : topology.peers)
    peers.push_back({{"name", p.name}, {"address", p.address}});
  nlohmann::json edges = nlohmann::json::array();
  for (const auto& [a, b] : topology.edges()) edges.push_back({a, b});
  const nlohmann::json j = {
      {"kind", topology_kind_name(topology.kind)}, {"peers", peers}, {"edges", edges}};
  return j.dump(1) + "\n";
}

GossipTopology parse_topology_json(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw std::invalid_argument("topology: not a JSON object");
  if (!j.contains("peers") || !j["peers"].is_array())
    throw std::invalid_argument("topology: no \"peers\" array");
  if (!j.contains("edges") || !j["edges"].is_array())
    throw std::invalid_argument("topology: no \"edges\" array");
  std::vector<GossipPeerAddress> peers;
  for (const auto& p : j["peers"]) {
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
      throw std::invalid_argument("topology: peer " + std::to_string(peers.size()) +
                                  " has no \"name\" string");
    GossipPeerAddress peer{p["name"].get<std::string>(), ""};
    if (p.contains("address")) {
      if (!p["address"].is_string() || p["address"].get<std::string>().size() > 255)
        throw std::invalid_argument("topology: peer " + std::to_string(peers.size()) +
                                    "'s \"address\" is not a host:port string");
      peer.address = p["address"].get<std::string>();
    }
    peers.push_back(std::move(peer));
  }
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  for (const auto& e : j["edges"]) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_number_unsigned() || !e[1].is_number_unsigned())
      throw std::invalid_argument("topology: edge " + std::to_string(edges.size()) +
                                  " is not [i, j] of peer indices");
    const auto a = e[0].get<std::uint64_t>(), b = e[1].get<std::uint64_t>();
    if (a >= kMaxPeers || b >= kMaxPeers)
      throw std::invalid_argument("topology: edge " + std::to_string(edges.size()) +
                                  " names a peer beyond the list");
    edges.emplace_back(static_cast<std::uint32_t>(a), static_cast<std::uint32_t>(b));
  }
  GossipTopology t = topology_from_edges(std::move(peers), edges);
  if (j.contains("kind")) {
    if (!j["kind"].is_string()) throw std::invalid_argument("topology: \"kind\" is not a string");
    t.kind = parse_topology_kind(j["kind"].get<std::string>());
  }
  return t;
}

GossipTopology read_topology_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read the topology file " + path);
  std::stringstream s;
  s << in.rdbuf();
  try {
    return parse_topology_json(s.str());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

std::vector<double> metropolis_weights(const GossipTopology& topology, std::uint32_t peer) {
  if (peer >= topology.size())
    throw std::invalid_argument("metropolis_weights: no peer " + std::to_string(peer));
  const auto& mine = topology.neighbours[peer];
  std::vector<double> weights;
  double sum = 0;
  for (std::uint32_t j : mine) {
    const double w =
        1.0 / (1.0 + static_cast<double>(std::max(mine.size(), topology.neighbours[j].size())));
    weights.push_back(w);
    sum += w;
  }
  weights.push_back(1.0 - sum);
  return weights;
}

WorkloadBalancer::WorkloadBalancer(BalanceOptions options)
    : options_(options), batch_(options.base_batch) {
  if (!(options_.target_seconds >= 0))
    throw std::invalid_argument("balance: the iteration time target must be >= 0");
  if (options_.min_batch < 1 || options_.min_batch > options_.base_batch ||
      options_.base_batch > options_.max_batch)
    throw std::invalid_argument("balance: needs 1 <= min batch <= base batch <= max batch");
  if (!(options_.smoothing > 0 && options_.smoothing <= 1))
    throw std::invalid_argument("balance: smoothing must be in (0, 1]");
  // A learning rate of 0 only without balancing: a run of mixing alone (simulator tests).
  if (!(options_.base_lr > 0 || (options_.base_lr == 0 && options_.target_seconds == 0)) ||
      !(options_.max_lr_factor >= 1))
    throw std::invalid_argument("balance: base lr must be > 0 and the lr cap >= 1");
}

void WorkloadBalancer::observe(int examples, double seconds) {
  if (examples <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double rate = examples / seconds;
  rate_ = rate_ == 0 ? rate : options_.smoothing * rate + (1 - options_.smoothing) * rate_;
  if (options_.target_seconds <= 0) return;
  const double wanted =
      std::clamp<double>(rate_ * options_.target_seconds, options_.min_batch, options_.max_batch);
  // Within a tenth of the batch held: keep it (a batch size costs its own kernels; the
  // ladder's steps are 19%, so this keeps a measurement's noise from flapping between two).
  if (std::fabs(wanted - batch_) <= 0.1 * batch_) return;
  batch_ = quantized_batch(wanted);
}

int WorkloadBalancer::quantized_batch(double wanted) const {
  // The ladder base_batch · 2^(k/4): a peer settles on few sizes, each within 19% of the next.
  const double steps = std::round(4 * std::log2(wanted / options_.base_batch));
  const double on_ladder = std::round(options_.base_batch * std::exp2(steps / 4));
  return static_cast<int>(std::clamp<double>(on_ladder, options_.min_batch, options_.max_batch));
}

double WorkloadBalancer::learning_rate() const {
  const double factor =
      std::min(static_cast<double>(batch_) / options_.base_batch, options_.max_lr_factor);
  return options_.base_lr * factor;
}

PlateauDetector::PlateauDetector(PlateauOptions options) : options_(options) {
  if (options_.patience < 0 || options_.max_decays < 0 || !(options_.min_delta >= 0))
    throw std::invalid_argument(
        "accuracy-aware training: patience, decays and min delta must be >= 0");
}

PlateauDetector::Verdict PlateauDetector::report(double accuracy) {
  if (stopped_) return Verdict::kStop;
  if (options_.patience == 0) return Verdict::kContinue;
  if (accuracy > best_ + options_.min_delta || best_ < 0) {
    best_ = std::max(best_, accuracy);
    since_best_ = 0;
    return Verdict::kContinue;
  }
  best_ = std::max(best_, accuracy);
  if (++since_best_ < options_.patience) return Verdict::kContinue;
  since_best_ = 0;
  if (decays_ < options_.max_decays) {
    ++decays_;
    lr_factor_ *= 0.5;
    return Verdict::kDecay;
  }
  stopped_ = true;
  return Verdict::kStop;
}

double default_consensus_step(double publish_fraction) {
  return publish_fraction < 1 ? kDefaultCompressedConsensusStep : 1.0;
}

void check_gossip_settings(const GossipSettings& s) {
  auto refuse = [](const std::string& what) { throw std::invalid_argument("gossip: " + what); };
  if (!(s.publish_fraction > 0 && s.publish_fraction <= 1))
    refuse("--publish-fraction must be in (0, 1]");
  if (!(s.consensus_step > 0 && s.consensus_step <= 1))
    refuse("--consensus-step must be in (0, 1]");
  if (s.algorithm == GossipAlgorithm::kAdpsgd && s.publish_fraction < 1)
    refuse(
        "--publish-fraction below 1 is for d-psgd: ad-psgd's pairwise midpoint exchanges dense "
        "models");
  if (s.algorithm == GossipAlgorithm::kAdpsgd && s.wait_steps > 0)
    refuse("--wait-steps is for d-psgd (ad-psgd has no barrier to wait at)");
  const BalanceOptions& b = s.balance;
  if (!(b.target_seconds >= 0) || !std::isfinite(b.target_seconds))
    refuse("--balance-target must be >= 0");
  if (b.min_batch < 1 || b.min_batch > b.base_batch || b.base_batch > b.max_batch)
    refuse("1 <= --min-batch <= --batch <= --max-batch must hold");
  if (!(b.base_lr >= 0) || !std::isfinite(b.base_lr)) refuse("--lr must be >= 0");
  if (b.target_seconds > 0 && !(b.base_lr > 0))
    refuse("--balance-target needs --lr > 0 (the lr scales with the batch)");
  if (!(b.max_lr_factor >= 1)) refuse("--max-lr-factor must be >= 1");
  if (!(b.smoothing > 0 && b.smoothing <= 1)) refuse("the balancer's smoothing must be in (0, 1]");
  if (s.plateau.patience < 0) refuse("--plateau-patience must be >= 0");
  if (s.plateau.max_decays < 0) refuse("--plateau-decays must be >= 0");
  if (!(s.plateau.min_delta >= 0)) refuse("the plateau's least gain must be >= 0");
  if (!(s.validation_fraction >= 0 && s.validation_fraction < 0.5))
    refuse("--validation-fraction must be in [0, 0.5)");
  if (s.plateau.patience > 0 && s.validation_fraction <= 0)
    refuse("accuracy-aware training (--plateau-patience) needs a validation split");
  if (s.validate_every == 0) refuse("--validate-every must be at least 1");
  if (!(s.max_neighbour_magnitude >= 0) || !std::isfinite(s.max_neighbour_magnitude))
    refuse("--max-neighbour-magnitude must be >= 0 (0: no bound)");
  if (!(s.neighbour_clip >= 0) || !std::isfinite(s.neighbour_clip))
    refuse("--neighbour-clip must be >= 0 (0: off)");
  if (s.algorithm == GossipAlgorithm::kAdpsgd && s.neighbour_clip > 0)
    refuse("--neighbour-clip is for d-psgd (ad-psgd's midpoint is not clipped)");
}

bool gossip_local_step(std::span<float> x, std::span<const float> gradient, float lr) {
  if (!std::all_of(gradient.begin(), gradient.end(), [](float v) { return std::isfinite(v); }))
    return false;
  for (std::size_t i = 0; i < x.size(); ++i) x[i] -= lr * gradient[i];
  return true;
}

void dpsgd_mix(std::span<float> x, std::span<const float> own, std::span<const MixTerm> neighbours,
               double consensus_step) {
  const auto gamma = static_cast<float>(consensus_step);
  for (const MixTerm& n : neighbours) {
    float w = static_cast<float>(n.weight) * gamma;
    if (n.clip_scale != 1) w *= static_cast<float>(n.clip_scale);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += w * (n.published[i] - own[i]);
  }
}

NeighbourVerdict check_neighbour_model(std::span<const float> values, double max_magnitude) {
  bool too_large = false;
  for (const float v : values) {
    if (!std::isfinite(v)) return NeighbourVerdict::kNonFinite;
    if (max_magnitude > 0 && std::fabs(static_cast<double>(v)) > max_magnitude) too_large = true;
  }
  return too_large ? NeighbourVerdict::kTooLarge : NeighbourVerdict::kAccepted;
}

const char* neighbour_verdict_reason(NeighbourVerdict verdict) {
  switch (verdict) {
    case NeighbourVerdict::kNonFinite:
      return "non-finite model from a neighbour";
    case NeighbourVerdict::kTooLarge:
      return "model above the magnitude bound from a neighbour";
    case NeighbourVerdict::kAccepted:
      break;
  }
  return "accepted";
}

double neighbour_clip_scale(std::span<const float> theirs, std::span<const float> own,
                            double clip) {
  if (!(clip > 0)) return 1;
  double sum = 0;
  for (std::size_t i = 0; i < theirs.size(); ++i) {
    const double d = static_cast<double>(theirs[i]) - static_cast<double>(own[i]);
    sum += d * d;
  }
  const double norm = std::sqrt(sum);
  return norm > clip ? clip / norm : 1;
}

namespace {
// The two sides' rules for one parameter (adpsgd_answer_average, adpsgd_take_average).
float answered_midpoint(float mine, float theirs) { return 0.5f * (mine + theirs); }
float taken_midpoint(float mine, float sent, float theirs) { return mine + 0.5f * (theirs - sent); }
}  // namespace

void adpsgd_answer_average(std::span<float> x, std::span<const float> theirs) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = answered_midpoint(x[i], theirs[i]);
}

void adpsgd_take_average(std::span<float> x, std::span<const float> sent,
                         std::span<const float> theirs) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = taken_midpoint(x[i], sent[i], theirs[i]);
}

void adpsgd_exchange(std::span<float> initiator, std::span<float> responder) {
  for (std::size_t i = 0; i < initiator.size(); ++i) {
    const float mine = initiator[i], theirs = responder[i];
    responder[i] = answered_midpoint(theirs, mine);
    initiator[i] = taken_midpoint(mine, mine, theirs);
  }
}

}  // namespace edgetrain::runtime
