#include "privacy/secagg.h"

#include <algorithm>
#include <utility>

#include <mbedtls/platform_util.h>

namespace edgetrain::privacy {
namespace {

std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

void put_length_prefixed(std::vector<std::uint8_t>& out, std::string_view text) {
  const auto length = static_cast<std::uint32_t>(text.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(length >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
}

void check_identity(std::string_view identity) {
  if (identity.empty() || identity.size() > kMaxIdentityBytes) {
    throw SecAggError("an identity must have 1 to " + std::to_string(kMaxIdentityBytes) + " bytes");
  }
}

constexpr std::size_t kSharePlaintextBytes = 1 + 2 * kKeyBytes;

void wipe(Key32& key) { mbedtls_platform_zeroize(key.data(), key.size()); }
void wipe(std::vector<std::uint8_t>& bytes) { mbedtls_platform_zeroize(bytes.data(), bytes.size()); }

// X25519 with a peer's key, a refusal naming the peer when the key is no curve point or a
// low-order one (the directory came through the server: a device's bad key is not ours).
Key32 agree_with(const Key32& private_key, const Key32& peer_public_key, std::string_view peer, SecureRandom& random) {
  try {
    return x25519_shared_secret(private_key, peer_public_key, random);
  } catch (const std::invalid_argument& error) {
    throw SecAggError("the public key of " + quoted(peer) + " is refused: " + error.what());
  }
}

Key32 to_key(const std::vector<std::uint8_t>& bytes) {
  if (bytes.size() != kKeyBytes) throw SecAggError("a reconstructed secret is not 32 bytes");
  Key32 key{};
  std::copy(bytes.begin(), bytes.end(), key.begin());
  return key;
}

}  // namespace

void check_threshold(std::uint32_t threshold, std::size_t devices) {
  if (devices > kMaxSecAggDevices) {
    throw SecAggError(std::to_string(devices) + " devices: a round holds at most " +
                      std::to_string(kMaxSecAggDevices) + " (Shamir over GF(2^8))");
  }
  if (threshold < 2 || threshold > devices || 2 * std::size_t{threshold} <= devices) {
    throw SecAggError("threshold " + std::to_string(threshold) + " for " + std::to_string(devices) +
                      " devices: it must be at least 2, at most the devices, and more than half of them");
  }
}

void check_round_threshold(const RoundConfig& config, std::size_t devices) {
  if (config.neighbours == 0 || std::size_t{config.neighbours} + 1 >= devices) {
    check_threshold(config.threshold, devices);
    return;
  }
  if (devices > kMaxNeighbourGraphDevices) {
    throw SecAggError(std::to_string(devices) + " devices: a round with neighbours holds at most " +
                      std::to_string(kMaxNeighbourGraphDevices));
  }
  if (config.neighbours % 2 != 0) {
    throw SecAggError(std::to_string(config.neighbours) + " neighbours for " + std::to_string(devices) +
                      " devices: below n − 1 the number must be even (a Harary graph)");
  }
  try {
    check_threshold(config.threshold, std::size_t{config.neighbours} + 1);
  } catch (const SecAggError& error) {
    throw SecAggError(std::string(error.what()) + " (the " + std::to_string(config.neighbours + 1) +
                      " holders of a neighbourhood)");
  }
}

const char* secret_kind_name(SecretKind kind) {
  return kind == SecretKind::kSelfMaskSeed ? "self-mask seed" : "mask private key";
}

// ---------------------------------------------------------------------------- the device

SecAggDevice::SecAggDevice(std::string identity, std::uint64_t round, SecureRandom& random)
    : identity_(std::move(identity)), round_(round), random_(random) {
  check_identity(identity_);
  cipher_keys_ = x25519_generate(random_);
  mask_keys_ = x25519_generate(random_);
  self_mask_seed_ = random_.key();
}

SecAggDevice::~SecAggDevice() {
  wipe(cipher_keys_.private_key);
  wipe(mask_keys_.private_key);
  wipe(self_mask_seed_);
  for (auto& [owner, held] : held_) {
    wipe(held.mask_private_key.y);
    wipe(held.self_mask_seed.y);
  }
}

AdvertiseKeys SecAggDevice::advertise_keys() const {
  return {round_, identity_, cipher_keys_.public_key, mask_keys_.public_key};
}

Nonce12 SecAggDevice::share_nonce(std::string_view sender, std::string_view recipient) const {
  Nonce12 nonce{};
  nonce[0] = sender < recipient ? 1 : 2;
  return nonce;
}

std::vector<std::uint8_t> SecAggDevice::share_aad(std::string_view sender, std::string_view recipient) const {
  static constexpr std::string_view kLabel = "edgetrain-secagg-v1 share";
  std::vector<std::uint8_t> aad(kLabel.begin(), kLabel.end());
  for (int i = 0; i < 8; ++i) aad.push_back(static_cast<std::uint8_t>(round_ >> (8 * i)));
  put_length_prefixed(aad, sender);
  put_length_prefixed(aad, recipient);
  return aad;
}

EncryptedShares SecAggDevice::share_keys(const KeyDirectory& directory) {
  if (step_ != Step::kAdvertised) throw SecAggError(identity_ + ": share_keys called out of order or twice");
  if (directory.config.round != round_) {
    throw SecAggError(identity_ + ": a key directory of round " + std::to_string(directory.config.round) +
                      " in round " + std::to_string(round_));
  }
  if (directory.config.vector_length == 0) throw SecAggError(identity_ + ": a round of zero-length vectors");
  const std::size_t n = directory.key_holder_count();
  check_round_threshold(directory.config, n);
  // Each listed device's index in U1: given with neighbours, implied by a whole directory.
  std::vector<std::uint32_t> positions = directory.positions;
  if (positions.empty()) {
    if (directory.devices.size() != n) {
      throw SecAggError(identity_ + ": a key directory of " + std::to_string(directory.devices.size()) + " of " +
                        std::to_string(n) + " devices without their positions");
    }
    for (std::uint32_t i = 0; i < n; ++i) positions.push_back(i);
  }
  if (positions.size() != directory.devices.size()) {
    throw SecAggError(identity_ + ": a key directory with " + std::to_string(positions.size()) + " positions for " +
                      std::to_string(directory.devices.size()) + " devices");
  }
  const AdvertiseKeys* self = nullptr;
  for (std::size_t i = 0; i < directory.devices.size(); ++i) {
    const AdvertiseKeys& entry = directory.devices[i];
    check_identity(entry.identity);
    if (entry.round != round_) throw SecAggError(identity_ + ": the keys of " + quoted(entry.identity) + " are of another round");
    if (i > 0 && !(directory.devices[i - 1].identity < entry.identity)) {
      throw SecAggError(identity_ + ": the key directory is not ordered by identity or repeats " + quoted(entry.identity));
    }
    // U1 is ordered by identity, so its indices ascend with the identities.
    if (positions[i] >= n || (i > 0 && positions[i - 1] >= positions[i])) {
      throw SecAggError(identity_ + ": the key directory gives " + quoted(entry.identity) + " the position " +
                        std::to_string(positions[i]) + " of " + std::to_string(n) + ", out of order or out of range");
    }
    if (entry.identity == identity_) {
      self = &entry;
      own_index_ = positions[i];
    }
  }
  if (self == nullptr) throw SecAggError(identity_ + ": the key directory leaves this device out");
  if (!(*self == advertise_keys())) throw SecAggError(identity_ + ": the key directory holds other keys for this device");
  try {
    graph_.emplace(static_cast<std::uint32_t>(n), directory.config.neighbours, directory.config.graph_seed);
  } catch (const std::invalid_argument& error) {
    throw SecAggError(identity_ + ": " + error.what());
  }
  // The holders of this device's shares: itself and its neighbours (everyone without
  // neighbours). The directory must list all of them; it may list more (a whole U1).
  const std::vector<std::uint32_t> holders = graph_->holders(own_index_);
  std::vector<const AdvertiseKeys*> holder_keys;
  for (std::size_t i = 0, h = 0; h < holders.size(); ++h) {
    while (i < positions.size() && positions[i] < holders[h]) ++i;
    if (i == positions.size() || positions[i] != holders[h]) {
      throw SecAggError(identity_ + ": the key directory leaves out the device at position " +
                        std::to_string(holders[h]) + ", a neighbour of this device");
    }
    holder_keys.push_back(&directory.devices[i]);
    index_[directory.devices[i].identity] = holders[h];
  }
  directory_ = directory;

  std::vector<std::uint8_t> points;  // 1 + rank among the holders (secagg_graph.h)
  for (std::size_t i = 0; i < holders.size(); ++i) points.push_back(static_cast<std::uint8_t>(i + 1));
  std::vector<ShamirShare> key_shares =
      shamir_split(mask_keys_.private_key, directory.config.threshold, points, random_);
  std::vector<ShamirShare> seed_shares = shamir_split(self_mask_seed_, directory.config.threshold, points, random_);

  EncryptedShares out;
  out.round = round_;
  for (std::size_t i = 0; i < holder_keys.size(); ++i) {
    const AdvertiseKeys& peer = *holder_keys[i];
    if (peer.identity == identity_) {  // this device keeps its own shares: they count towards t
      held_[identity_] = {key_shares[i], seed_shares[i]};
      continue;
    }
    Key32 secret = agree_with(cipher_keys_.private_key, peer.cipher_public_key, peer.identity, random_);
    Key32 key = derive_pair_seed(secret, SeedPurpose::kShareEncryption, round_, identity_, peer.identity);
    std::vector<std::uint8_t> plaintext;
    plaintext.reserve(kSharePlaintextBytes);
    plaintext.push_back(static_cast<std::uint8_t>(i + 1));
    plaintext.insert(plaintext.end(), key_shares[i].y.begin(), key_shares[i].y.end());
    plaintext.insert(plaintext.end(), seed_shares[i].y.begin(), seed_shares[i].y.end());
    out.shares.push_back({identity_, peer.identity,
                          aead_seal(key, share_nonce(identity_, peer.identity), share_aad(identity_, peer.identity),
                                    plaintext)});
    wipe(plaintext);
    wipe(secret);
    wipe(key);
  }
  for (ShamirShare& share : key_shares) wipe(share.y);
  for (ShamirShare& share : seed_shares) wipe(share.y);
  step_ = Step::kShared;
  return out;
}

MaskedInput SecAggDevice::masked_input(const EncryptedShares& received, std::span<const std::uint32_t> input) {
  if (step_ != Step::kShared) throw SecAggError(identity_ + ": masked_input called out of order or twice");
  if (received.round != round_) throw SecAggError(identity_ + ": shares of another round");
  if (input.size() != directory_.config.vector_length) {
    throw SecAggError(identity_ + ": an input of " + std::to_string(input.size()) + " values in a round of " +
                      std::to_string(directory_.config.vector_length));
  }
  std::map<std::string, const AdvertiseKeys*, std::less<>> u1;  // this device's holders only
  for (const AdvertiseKeys& entry : directory_.devices) {
    if (index_.count(entry.identity)) u1[entry.identity] = &entry;
  }
  // Decrypt everything before keeping anything: a refused message leaves the device as it was.
  std::map<std::string, Held, std::less<>> held;
  for (const EncryptedShare& share : received.shares) {
    if (share.recipient != identity_) {
      throw SecAggError(identity_ + ": a share addressed to " + quoted(share.recipient));
    }
    const auto sender = u1.find(share.sender);
    if (sender == u1.end() || share.sender == identity_) {
      throw SecAggError(identity_ + ": a share from " + quoted(share.sender) +
                        ", not another device of the round that is this device's neighbour");
    }
    if (held.count(share.sender)) throw SecAggError(identity_ + ": two shares from " + quoted(share.sender));
    Key32 secret = agree_with(cipher_keys_.private_key, sender->second->cipher_public_key, share.sender, random_);
    Key32 key = derive_pair_seed(secret, SeedPurpose::kShareEncryption, round_, identity_, share.sender);
    std::vector<std::uint8_t> plaintext;
    try {
      plaintext = aead_open(key, share_nonce(share.sender, identity_), share_aad(share.sender, identity_), share.sealed);
    } catch (const std::invalid_argument& error) {
      throw SecAggError(identity_ + ": the share from " + quoted(share.sender) + ": " + error.what());
    }
    wipe(secret);
    wipe(key);
    const std::uint8_t point = graph_->share_point(index_.find(share.sender)->second, own_index_);
    if (plaintext.size() != kSharePlaintextBytes || plaintext[0] != point) {
      throw SecAggError(identity_ + ": the share from " + quoted(share.sender) + " is not for this device's point");
    }
    Held& entry = held[share.sender];
    entry.mask_private_key = {point, {plaintext.begin() + 1, plaintext.begin() + 1 + kKeyBytes}};
    entry.self_mask_seed = {point, {plaintext.begin() + 1 + kKeyBytes, plaintext.end()}};
    wipe(plaintext);
  }
  if (held.size() + 1 < directory_.config.threshold) {
    throw SecAggError(identity_ + ": " + std::to_string(held.size() + 1) + " devices shared their keys, fewer than t = " +
                      std::to_string(directory_.config.threshold));
  }
  for (auto& [owner, entry] : held) held_[owner] = std::move(entry);

  MaskedInput out{round_, identity_, {input.begin(), input.end()}};
  add_mask(out.masked, self_mask_seed_);
  for (const auto& [peer, unused] : held_) {
    if (peer == identity_) continue;
    Key32 secret = agree_with(mask_keys_.private_key, u1[peer]->mask_public_key, peer, random_);
    Key32 seed = derive_pair_seed(secret, SeedPurpose::kPairwiseMask, round_, identity_, peer);
    // The pair's two devices add and subtract the same stream, so it cancels in the sum.
    if (identity_ < peer) {
      add_mask(out.masked, seed);
    } else {
      subtract_mask(out.masked, seed);
    }
    wipe(secret);
    wipe(seed);
  }
  step_ = Step::kMasked;
  return out;
}

UnmaskingShares SecAggDevice::unmasking_shares(const SurvivorList& survivors) {
  // Once only: a second list could name as dropped a device the first named as a survivor,
  // and the two answers together would reveal both of its secrets.
  if (step_ != Step::kMasked) throw SecAggError(identity_ + ": unmasking_shares called out of order or twice");
  if (survivors.round != round_) throw SecAggError(identity_ + ": a survivor list of another round");
  std::set<std::string, std::less<>> u3;
  for (const std::string& survivor : survivors.survivors) {
    if (!held_.count(survivor)) {
      throw SecAggError(identity_ + ": the survivor list names " + quoted(survivor) + ", which did not share its keys");
    }
    if (!u3.insert(survivor).second) throw SecAggError(identity_ + ": the survivor list repeats " + quoted(survivor));
  }
  if (!u3.count(identity_)) {
    // This device sent its masked input: revealing its mask private key would unmask it.
    throw SecAggError(identity_ + ": the survivor list leaves out this device, which sent its masked input");
  }
  if (u3.size() < directory_.config.threshold) {
    throw SecAggError(identity_ + ": " + std::to_string(u3.size()) + " survivors, fewer than t = " +
                      std::to_string(directory_.config.threshold));
  }
  UnmaskingShares out{round_, identity_, {}};
  for (const auto& [owner, held] : held_) {
    if (u3.count(owner)) {
      out.shares.push_back({owner, SecretKind::kSelfMaskSeed, held.self_mask_seed});
    } else {
      out.shares.push_back({owner, SecretKind::kMaskPrivateKey, held.mask_private_key});
    }
  }
  step_ = Step::kDone;
  return out;
}

// ---------------------------------------------------------------------------- the server

SecAggServer::SecAggServer(RoundConfig config) : config_(config) {
  if (config_.vector_length == 0) throw SecAggError("a round of zero-length vectors");
  if (config_.threshold < 2) throw SecAggError("a threshold below 2");
}

void SecAggServer::expect(Phase phase, const char* what) const {
  if (phase_ != phase) throw SecAggError(std::string(what) + " out of its phase");
}

void SecAggServer::expect_round(std::uint64_t round, const char* what) const {
  if (round != config_.round) {
    throw SecAggError(std::string(what) + " of round " + std::to_string(round) + " in round " +
                      std::to_string(config_.round));
  }
}

std::uint32_t SecAggServer::index_of(std::string_view device) const {
  return static_cast<std::uint32_t>(std::lower_bound(u1_.begin(), u1_.end(), device) - u1_.begin());
}

std::uint8_t SecAggServer::point_of(std::string_view holder, std::string_view owner) const {
  return graph_->share_point(index_of(owner), index_of(holder));
}

void SecAggServer::receive_keys(std::string_view from, const AdvertiseKeys& keys) {
  expect(Phase::kKeys, "keys");
  expect_round(keys.round, "keys");
  check_identity(keys.identity);
  if (keys.identity != from) throw SecAggError("keys for " + quoted(keys.identity) + " from " + quoted(from));
  if (keys_.count(keys.identity)) throw SecAggError(quoted(from) + " advertised its keys twice");
  const std::size_t most = config_.neighbours == 0 ? kMaxSecAggDevices : kMaxNeighbourGraphDevices;
  if (keys_.size() == most) throw SecAggError("more than " + std::to_string(most) + " devices");
  keys_.emplace(keys.identity, keys);
}

KeyDirectory SecAggServer::close_key_advertisement() {
  expect(Phase::kKeys, "closing the key advertisement");
  check_round_threshold(config_, keys_.size());
  KeyDirectory out{config_, {}};
  for (const auto& [identity, keys] : keys_) {  // a std::map: ordered by identity
    u1_.push_back(identity);
    out.devices.push_back(keys);
  }
  graph_.emplace(static_cast<std::uint32_t>(u1_.size()), config_.neighbours, config_.graph_seed);
  phase_ = Phase::kShares;
  return out;
}

void SecAggServer::receive_shares(std::string_view from, const EncryptedShares& shares) {
  expect(Phase::kShares, "shares");
  expect_round(shares.round, "shares");
  if (!keys_.count(from)) throw SecAggError("shares from " + quoted(from) + ", which advertised no keys");
  if (sent_shares_.count(from)) throw SecAggError(quoted(from) + " sent its shares twice");
  // Every neighbour of it in U1 (every other device without neighbours) must get exactly
  // one: the threshold counts on it.
  std::set<std::string_view> recipients;
  for (const EncryptedShare& share : shares.shares) {
    if (share.sender != from) throw SecAggError(quoted(from) + " sent a share as " + quoted(share.sender));
    if (share.recipient == from || !keys_.count(share.recipient) ||
        !graph_->adjacent(index_of(from), index_of(share.recipient)) || !recipients.insert(share.recipient).second) {
      throw SecAggError(quoted(from) + " sent a share to " + quoted(share.recipient) +
                        ": not a neighbour of it in the round, or twice");
    }
  }
  if (recipients.size() != graph_->degree()) {
    throw SecAggError(quoted(from) + " sent shares to " + std::to_string(recipients.size()) + " of its " +
                      std::to_string(graph_->degree()) + " neighbours");
  }
  sent_shares_.emplace(std::string(from), shares.shares);
}

void SecAggServer::close_share_keys() {
  expect(Phase::kShares, "closing the key sharing");
  if (sent_shares_.size() < config_.threshold) {
    throw SecAggError(std::to_string(sent_shares_.size()) + " devices shared their keys, fewer than t = " +
                      std::to_string(config_.threshold));
  }
  for (const auto& [sender, unused] : sent_shares_) u2_.insert(sender);
  sum_.assign(config_.vector_length, 0);
  phase_ = Phase::kMaskedInput;
}

EncryptedShares SecAggServer::shares_for(std::string_view device) const {
  if (phase_ == Phase::kKeys || phase_ == Phase::kShares) throw SecAggError("shares_for before the key sharing closed");
  if (!u2_.count(device)) throw SecAggError(quoted(device) + " did not share its keys");
  EncryptedShares out{config_.round, {}};
  for (const auto& [sender, shares] : sent_shares_) {
    if (sender == device) continue;
    for (const EncryptedShare& share : shares) {
      if (share.recipient == device) out.shares.push_back(share);
    }
  }
  return out;
}

KeyDirectory SecAggServer::directory_for(std::string_view device) const {
  if (phase_ == Phase::kKeys) throw SecAggError("directory_for before the key advertisement closed");
  if (!keys_.count(device)) throw SecAggError(quoted(device) + " advertised no keys");
  KeyDirectory out{config_, {}};
  if (graph_->complete()) {
    for (const std::string& identity : u1_) out.devices.push_back(keys_.find(identity)->second);
    return out;
  }
  out.key_holders = static_cast<std::uint32_t>(u1_.size());
  for (std::uint32_t index : graph_->holders(index_of(device))) {
    out.devices.push_back(keys_.find(u1_[index])->second);
    out.positions.push_back(index);
  }
  return out;
}

SurvivorList SecAggServer::survivors_for(std::string_view device) const {
  if (phase_ != Phase::kUnmasking && phase_ != Phase::kDone) throw SecAggError("survivors_for before U3 is fixed");
  if (!u3_.count(device)) throw SecAggError(quoted(device) + " sent no masked input");
  SurvivorList out{config_.round, {}};
  const std::uint32_t own = index_of(device);
  for (const std::string& survivor : u3_) {
    if (survivor == device || graph_->adjacent(own, index_of(survivor))) out.survivors.push_back(survivor);
  }
  return out;
}

void SecAggServer::receive_masked_input(std::string_view from, const MaskedInput& input) {
  expect(Phase::kMaskedInput, "a masked input");
  expect_round(input.round, "a masked input");
  if (input.identity != from) throw SecAggError("a masked input for " + quoted(input.identity) + " from " + quoted(from));
  if (!u2_.count(from)) throw SecAggError("a masked input from " + quoted(from) + ", which did not share its keys");
  if (u3_.count(from)) throw SecAggError(quoted(from) + " sent its masked input twice");
  if (input.masked.size() != config_.vector_length) {
    throw SecAggError("a masked input of " + std::to_string(input.masked.size()) + " values from " + quoted(from) +
                      " in a round of " + std::to_string(config_.vector_length));
  }
  for (std::size_t i = 0; i < sum_.size(); ++i) sum_[i] += input.masked[i];
  u3_.insert(std::string(from));
}

SurvivorList SecAggServer::close_masked_input() {
  expect(Phase::kMaskedInput, "closing the masked inputs");
  if (u3_.size() < config_.threshold) {
    throw SecAggError(std::to_string(u3_.size()) + " masked inputs, fewer than t = " + std::to_string(config_.threshold));
  }
  if (!graph_->complete()) {
    // Ours: masks cancel within each component of the survivors' graph, so unmasking a
    // split one would let the server read each component's sum. Refused before any secret
    // is revealed: the attempt starts again with fresh keys.
    std::vector<bool> present(u1_.size(), false);
    for (const std::string& survivor : u3_) present[index_of(survivor)] = true;
    if (const std::size_t groups = graph_->components(present); groups > 1) {
      throw SecAggError("the " + std::to_string(u3_.size()) + " masked inputs fall into " + std::to_string(groups) +
                        " groups with no neighbours between them: unmasking would reveal each group's sum");
    }
  }
  phase_ = Phase::kUnmasking;
  return {config_.round, {u3_.begin(), u3_.end()}};
}

SecretKind SecAggServer::allowed_secret(std::string_view owner) const {
  if (phase_ != Phase::kUnmasking && phase_ != Phase::kDone) {
    throw SecAggError("no secret may be revealed before the masked inputs closed");
  }
  if (!u2_.count(owner)) throw SecAggError(quoted(owner) + " shared no keys: it has no secret to reveal");
  return u3_.count(owner) ? SecretKind::kSelfMaskSeed : SecretKind::kMaskPrivateKey;
}

void SecAggServer::receive_unmasking_shares(std::string_view from, const UnmaskingShares& shares) {
  expect(Phase::kUnmasking, "unmasking shares");
  expect_round(shares.round, "unmasking shares");
  if (shares.identity != from) throw SecAggError("unmasking shares for " + quoted(shares.identity) + " from " + quoted(from));
  if (!u3_.count(from)) throw SecAggError("unmasking shares from " + quoted(from) + ", which sent no masked input");
  if (unmasking_senders_.count(from)) throw SecAggError(quoted(from) + " sent its unmasking shares twice");
  std::set<std::string_view> owners;
  for (const RevealedShare& revealed : shares.shares) {  // check all before keeping any
    const SecretKind allowed = allowed_secret(revealed.owner);
    if (revealed.kind != allowed) {
      throw SecAggError(quoted(from) + " revealed a share of the " + secret_kind_name(revealed.kind) + " of " +
                        quoted(revealed.owner) + ", whose " + secret_kind_name(allowed) +
                        " alone may be revealed (never both secrets of one device)");
    }
    if (!owners.insert(revealed.owner).second) {
      throw SecAggError(quoted(from) + " revealed two shares of " + quoted(revealed.owner));
    }
    if (revealed.share.x == 0 || revealed.share.x != point_of(from, revealed.owner) ||
        revealed.share.y.size() != kKeyBytes) {
      throw SecAggError(quoted(from) + " revealed a share of " + quoted(revealed.owner) + " that is not its own point's");
    }
  }
  for (const RevealedShare& revealed : shares.shares) revealed_[revealed.owner].push_back(revealed.share);
  unmasking_senders_.insert(std::string(from));
}

Key32 SecAggServer::reconstruct_secret(std::string_view owner, SecretKind kind) const {
  const SecretKind allowed = allowed_secret(owner);
  if (kind != allowed) {
    throw SecAggError("refused: the " + std::string(secret_kind_name(kind)) + " of " + quoted(owner) +
                      " may not be reconstructed, only its " + secret_kind_name(allowed) +
                      " (never both secrets of one device)");
  }
  const auto it = revealed_.find(owner);
  const std::size_t count = it == revealed_.end() ? 0 : it->second.size();
  if (count < config_.threshold) {
    throw SecAggError(quoted(owner) + ": " + std::to_string(count) + " shares of its " + secret_kind_name(kind) +
                      ", fewer than t = " + std::to_string(config_.threshold));
  }
  return to_key(shamir_reconstruct(it->second, config_.threshold));
}

bool SecAggServer::has_enough_shares() const {
  if (phase_ != Phase::kUnmasking) return false;
  for (const std::string& owner : u2_) {
    const auto it = revealed_.find(owner);
    if (it == revealed_.end() || it->second.size() < config_.threshold) return false;
  }
  return true;
}

std::vector<std::uint32_t> SecAggServer::unmask() {
  expect(Phase::kUnmasking, "unmasking");
  std::string short_of;
  for (const std::string& owner : u2_) {
    const auto it = revealed_.find(owner);
    const std::size_t count = it == revealed_.end() ? 0 : it->second.size();
    if (count < config_.threshold) {
      short_of += (short_of.empty() ? "" : ", ") + quoted(owner) + " (" + std::to_string(count) + ")";
    }
  }
  if (!short_of.empty()) {
    throw SecAggError("cannot unmask: fewer than t = " + std::to_string(config_.threshold) + " shares for " + short_of);
  }
  std::vector<std::uint32_t> sum = sum_;
  for (const std::string& owner : u2_) {
    if (u3_.count(owner)) {  // its input is in the sum: remove its self-mask
      Key32 seed = reconstruct_secret(owner, SecretKind::kSelfMaskSeed);
      subtract_mask(sum, seed);
      wipe(seed);
      continue;
    }
    // It shared its keys but sent no input: remove the pairwise masks the survivors added
    // for it. Survivor u added +PRG(s_uv) when u < v and −PRG(s_uv) when u > v.
    Key32 private_key = reconstruct_secret(owner, SecretKind::kMaskPrivateKey);
    if (x25519_public_key(private_key, random_) != keys_.find(owner)->second.mask_public_key) {
      throw SecAggError("the mask private key reconstructed for " + quoted(owner) +
                        " does not match its advertised public key: a share was wrong");
    }
    const std::uint32_t owner_index = index_of(owner);
    for (const std::string& survivor : u3_) {
      if (!graph_->adjacent(owner_index, index_of(survivor))) continue;  // it masked nothing with owner
      Key32 secret = agree_with(private_key, keys_.find(survivor)->second.mask_public_key, survivor, random_);
      Key32 seed = derive_pair_seed(secret, SeedPurpose::kPairwiseMask, config_.round, survivor, owner);
      if (survivor < owner) {
        subtract_mask(sum, seed);
      } else {
        add_mask(sum, seed);
      }
      wipe(secret);
      wipe(seed);
    }
    wipe(private_key);
  }
  phase_ = Phase::kDone;
  return sum;
}

}  // namespace edgetrain::privacy
