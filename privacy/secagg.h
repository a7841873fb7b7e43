// Secure aggregation of one federated round (Bonawitz et al. 2017, "Practical Secure
// Aggregation for Privacy-Preserving Machine Learning", the semi-honest protocol of their
// §4 with its rounds 0, 1, 2 and 4; privacy/README.md has the protocol, the messages and
// their sizes, and what is ours). No I/O: a device's side (SecAggDevice) and the server's
// (SecAggServer) as state machines over plain messages, each of which serializes to bytes
// (secagg_messages.h) so that the rounds mode can carry them as CoAP resources.
//
//   0 AdvertiseKeys    device → server   two X25519 public keys: c (share encryption), s (masks)
//                      server → devices  KeyDirectory: the round's parameters and every
//                                        device's keys (U1, ordered by identity)
//   1 ShareKeys        device → server   EncryptedShares: for every other v of U1, a share of
//                                        its s private key and of its self-mask seed b,
//                                        sealed with a key only u and v can derive
//                      server → device   EncryptedShares: those addressed to it (senders = U2)
//   2 MaskedInput      device → server   y_u = x_u + PRG(b_u) + Σ_{v∈U2, v>u} PRG(s_uv)
//                                                           − Σ_{v∈U2, v<u} PRG(s_uv)  (mod 2^32)
//                      server → devices  SurvivorList: U3, the devices whose y arrived
//   4 Unmasking        device → server   UnmaskingShares: for every v of U2, its share of b_v
//                                        if v ∈ U3, else its share of v's s private key
//                      server            with ≥ t shares for every v of U2: the sum of x over U3
//
// The rule that protects a device that is merely slow (never reveal both b_u and s_u's private
// key, or x_u = y_u − masks is in the clear) is enforced at both ends:
//   - a device answers the unmasking request once, computes from that one survivor list which
//     secret of each v it reveals, and refuses a list that leaves itself out (it sent y_u);
//   - the server fixes U3 when it closes the masked-input phase; from then on, for every
//     device, one kind of secret is allowed (SecAggServer::allowed_secret): it refuses shares
//     of the other kind and never reconstructs it.
// Against a server that lies (sends different survivor lists to different devices) this is not
// enough: that is the active-adversary version (their round 3, signatures), not built.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "privacy/secagg_crypto.h"
#include "privacy/secagg_graph.h"
#include "privacy/shamir.h"

namespace edgetrain::privacy {

// A refusal by the protocol: a message that breaks its rules, a phase out of order, too few
// devices or shares. The text names the rule and the device.
class SecAggError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The most devices a round can hold: Shamir over GF(2^8) has 255 nonzero points (shamir.h).
inline constexpr std::size_t kMaxSecAggDevices = 255;
// The longest identity (ours: certificate common names and PSK identities are shorter).
inline constexpr std::size_t kMaxIdentityBytes = 255;

// What the server announces for the round: its number, the threshold t and the length P of
// the ring vectors. Checked by check_threshold against the number n of devices in U1.
// SecAgg+ (Bell et al. 2020, secagg_graph.h): with neighbours = k > 0 (below n − 1) each device
// masks and shares with its k neighbours on the graph drawn from graph_seed once U1 is fixed,
// and t is checked against a neighbourhood's k + 1 holders instead of n; a round may then hold
// up to kMaxNeighbourGraphDevices devices. k = 0 is every device (Bonawitz et al.).
struct RoundConfig {
  std::uint64_t round = 0;
  std::uint32_t threshold = 0;
  std::uint32_t vector_length = 0;
  std::uint32_t neighbours = 0;
  std::uint64_t graph_seed = 0;
};
// Ours: 2 ≤ t ≤ n and t > n/2. A majority threshold means two disjoint groups of devices can
// never both reach t, so the shares of one device's two secrets cannot both be collected from
// honest devices that were told different survivor lists. Throws SecAggError.
void check_threshold(std::uint32_t threshold, std::size_t devices);
// check_threshold for a round of n devices in U1: against n without neighbours (or with k ≥
// n − 1), against a neighbourhood's k + 1 holders with them (and k even, n ≤
// kMaxNeighbourGraphDevices: secagg_graph.h). Throws SecAggError.
void check_round_threshold(const RoundConfig& config, std::size_t devices);

struct AdvertiseKeys {
  std::uint64_t round = 0;
  std::string identity;
  Key32 cipher_public_key{};  // c_u^PK
  Key32 mask_public_key{};    // s_u^PK
  bool operator==(const AdvertiseKeys&) const = default;
};

struct KeyDirectory {
  RoundConfig config;
  std::vector<AdvertiseKeys> devices;  // U1, ordered by identity (byte order)
  // With neighbours, the directory the server sends device u lists u and its neighbours only
  // (SecAggServer::directory_for): key_holders is |U1| and positions each listed device's index
  // in U1 (ascending, as the identities are). Both empty/0: `devices` is the whole of U1.
  std::uint32_t key_holders = 0;
  std::vector<std::uint32_t> positions = {};
  std::size_t key_holder_count() const { return key_holders != 0 ? key_holders : devices.size(); }
};

// Device u's shares for device v, sealed: plaintext x_v (1 byte) ‖ share of s_u^SK (32) ‖
// share of b_u (32), ChaCha20-Poly1305 under HKDF(X25519(c_u, c_v), kShareEncryption), nonce
// first byte 1 when u < v else 2 (the pair's one key seals one message each way: ours), AAD
// "edgetrain-secagg-v1 share" ‖ round ‖ u ‖ v.
struct EncryptedShare {
  std::string sender;
  std::string recipient;
  std::vector<std::uint8_t> sealed;  // 65 + 16 bytes
  bool operator==(const EncryptedShare&) const = default;
};
struct EncryptedShares {
  std::uint64_t round = 0;
  std::vector<EncryptedShare> shares;
};

struct MaskedInput {
  std::uint64_t round = 0;
  std::string identity;
  std::vector<std::uint32_t> masked;  // y_u, P values
};

struct SurvivorList {
  std::uint64_t round = 0;
  std::vector<std::string> survivors;  // U3, ordered by identity
};

enum class SecretKind : std::uint8_t {
  kSelfMaskSeed = 1,    // b_u: revealed for a device whose masked input arrived
  kMaskPrivateKey = 2,  // s_u^SK: revealed for a device that shared its keys but sent no input
};
const char* secret_kind_name(SecretKind kind);

struct RevealedShare {
  std::string owner;  // whose secret
  SecretKind kind = SecretKind::kSelfMaskSeed;
  ShamirShare share;  // x = the sender's point
  bool operator==(const RevealedShare&) const = default;
};
struct UnmaskingShares {
  std::uint64_t round = 0;
  std::string identity;  // the sender
  std::vector<RevealedShare> shares;
};

// One device's side of one round. Each step is called once, in order; a step out of order
// or a second call throws SecAggError, as does any message that breaks the rules (each
// refusal says which). Secrets are wiped when the object goes.
class SecAggDevice {
 public:
  SecAggDevice(std::string identity, std::uint64_t round, SecureRandom& random);
  ~SecAggDevice();
  SecAggDevice(const SecAggDevice&) = delete;
  SecAggDevice& operator=(const SecAggDevice&) = delete;

  const std::string& identity() const { return identity_; }
  // Round 0.
  AdvertiseKeys advertise_keys() const;
  // Round 1: refuses a directory of another round, without this device or with other keys
  // for it, with repeated or unordered identities, more than 255 devices, or a threshold
  // check_threshold refuses.
  EncryptedShares share_keys(const KeyDirectory& directory);
  // Round 2: `input` is x_u (P ring values, privacy/quantize.h). Refuses shares that fail
  // authentication, come from outside U1, are addressed to another device or repeat a sender,
  // and fewer than t devices in U2 (the senders and this device).
  MaskedInput masked_input(const EncryptedShares& received, std::span<const std::uint32_t> input);
  // Round 4: refuses a list with a device outside U2, a repeated one, without this device,
  // or shorter than t.
  UnmaskingShares unmasking_shares(const SurvivorList& survivors);

 private:
  enum class Step { kAdvertised, kShared, kMasked, kDone };
  struct Held {  // this device's shares of another device's secrets
    ShamirShare mask_private_key;
    ShamirShare self_mask_seed;
  };
  Nonce12 share_nonce(std::string_view sender, std::string_view recipient) const;
  std::vector<std::uint8_t> share_aad(std::string_view sender, std::string_view recipient) const;

  std::string identity_;
  std::uint64_t round_;
  SecureRandom& random_;
  Step step_ = Step::kAdvertised;
  std::optional<NeighbourGraph> graph_;  // over U1's indices; complete without neighbours
  std::map<std::string, std::uint32_t, std::less<>> index_;  // listed devices → index in U1
  std::uint32_t own_index_ = 0;
  X25519KeyPair cipher_keys_;  // c_u
  X25519KeyPair mask_keys_;    // s_u
  Key32 self_mask_seed_{};     // b_u
  KeyDirectory directory_;
  std::map<std::string, Held> held_;         // U2 (this device included) → its shares
};

// The server's side of one round: collects messages, forwards shares, and unmasks the sum.
// `from` is the identity the transport authenticated (DTLS PSK identity or certificate); a
// message that claims another identity is refused. Masked inputs are added to the running sum
// as they come and not kept, so the server's state never holds one device's y alone after
// the call (nor, ever, an unmasked x).
class SecAggServer {
 public:
  explicit SecAggServer(RoundConfig config);

  const RoundConfig& config() const { return config_; }
  void receive_keys(std::string_view from, const AdvertiseKeys& keys);
  KeyDirectory close_key_advertisement();                        // fixes U1
  void receive_shares(std::string_view from, const EncryptedShares& shares);
  void close_share_keys();                                       // fixes U2
  EncryptedShares shares_for(std::string_view device) const;     // for each v of U2
  // With neighbours: the directory for one device of U1 (itself and its neighbours), and U3
  // restricted to its holders' neighbourhood (itself and its neighbours in U3). Without, the
  // whole directory and U3, as close_key_advertisement and close_masked_input return them.
  KeyDirectory directory_for(std::string_view device) const;
  SurvivorList survivors_for(std::string_view device) const;
  const std::optional<NeighbourGraph>& graph() const { return graph_; }  // set when U1 is fixed
  void receive_masked_input(std::string_view from, const MaskedInput& input);
  SurvivorList close_masked_input();                             // fixes U3
  void receive_unmasking_shares(std::string_view from, const UnmaskingShares& shares);
  // The one secret of `owner` that may be reconstructed, once U3 is fixed: its self-mask
  // seed if its masked input arrived, its mask private key otherwise.
  SecretKind allowed_secret(std::string_view owner) const;
  // Reconstructs one secret from the shares received. Refuses the kind allowed_secret does
  // not allow (never both secrets of a device) and fewer than t shares.
  Key32 reconstruct_secret(std::string_view owner, SecretKind kind) const;
  // Σ_{u∈U3} x_u mod 2^32. Refuses, naming them, when some devices of U2 have fewer than t
  // shares, or when a reconstructed mask private key does not match its advertised public key.
  std::vector<std::uint32_t> unmask();
  // Whether every device of U2 has t shares in (unmask() would not be short of any): with
  // neighbours, t answers do not give every secret t shares, as they do without.
  bool has_enough_shares() const;

  const std::vector<std::string>& key_holders() const { return u1_; }   // U1
  const std::set<std::string, std::less<>>& share_senders() const { return u2_; }  // U2
  const std::set<std::string, std::less<>>& survivors() const { return u3_; }      // U3

 private:
  enum class Phase { kKeys, kShares, kMaskedInput, kUnmasking, kDone };
  void expect(Phase phase, const char* what) const;
  void expect_round(std::uint64_t round, const char* what) const;
  std::uint32_t index_of(std::string_view device) const;  // in U1
  std::uint8_t point_of(std::string_view holder, std::string_view owner) const;

  RoundConfig config_;
  mutable SecureRandom random_;  // X25519's blinding when the server recomputes pair seeds
  Phase phase_ = Phase::kKeys;
  std::map<std::string, AdvertiseKeys, std::less<>> keys_;
  std::vector<std::string> u1_;
  std::optional<NeighbourGraph> graph_;
  std::map<std::string, std::vector<EncryptedShare>, std::less<>> sent_shares_;  // by sender
  std::set<std::string, std::less<>> u2_;
  std::vector<std::uint32_t> sum_;  // Σ y_u over the masked inputs received
  std::set<std::string, std::less<>> u3_;
  std::set<std::string, std::less<>> unmasking_senders_;
  std::map<std::string, std::vector<ShamirShare>, std::less<>> revealed_;  // by owner
};

}  // namespace edgetrain::privacy
