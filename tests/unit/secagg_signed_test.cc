// Secure aggregation against an active server (privacy/secagg_signed.h, key_signing.h):
// SignedSecAggDevice objects run whole rounds with SecAggServer and ConsistencyRound through
// the message bytes, and a malicious server in the middle substitutes keys, forges or drops
// signatures, and tells two halves of the devices different survivor lists. The fleet's
// certificates (EC P-256, as boards/fleet-certificates.sh makes them) are made in memory with
// Mbed TLS's certificate writer, so the test needs no openssl and no files.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "privacy/key_signing.h"
#include "privacy/secagg.h"
#include "privacy/secagg_messages.h"
#include "privacy/secagg_signed.h"
#include "tests/support/in_memory_pki.h"

namespace edgetrain::privacy {
namespace {

using test_pki::Pk;
using test_pki::Pki;
using test_pki::certificate_pem;
using test_pki::fleet;
using test_pki::generate_p256;
using test_pki::key_pem;

constexpr std::uint64_t kSession = (7ull << 16) | 1;

std::string name(int i) { return "device-" + std::to_string(i); }

// ---- one round between honest devices, with hooks for the server to lie

struct SignedRound {
  int devices = 6;
  std::uint32_t threshold = 4;
  std::uint32_t length = 64;
  SecureRandom random;
  std::vector<std::shared_ptr<DeviceCredentials>> credentials;
  std::vector<std::unique_ptr<SignedSecAggDevice>> device;
  std::vector<std::vector<std::uint32_t>> input;
  std::unique_ptr<SecAggServer> server;
  std::map<std::string, SignedKeys> posted;  // what the server took, by identity
  SignedKeyDirectory directory;

  SignedRound() {
    static std::vector<std::shared_ptr<DeviceCredentials>> issued;  // certificates take a while: once
    for (int i = 0; i < devices; ++i) {
      if (static_cast<int>(issued.size()) <= i) issued.push_back(fleet().issue(name(i)));
      credentials.push_back(issued[i]);
      device.push_back(std::make_unique<SignedSecAggDevice>(name(i), kSession, random, credentials[i], fleet().ca));
      std::vector<std::uint32_t> x(length);
      for (std::uint32_t k = 0; k < length; ++k) x[k] = 1000u * i + k;
      input.push_back(std::move(x));
    }
    server = std::make_unique<SecAggServer>(RoundConfig{kSession, threshold, length});
  }

  // Step 0 as an honest server runs it: every SignedKeys checked, the signed directory.
  void advertise() {
    for (int i = 0; i < devices; ++i) {
      const SignedKeys keys = parse_signed_keys(serialize(device[i]->advertise_keys()));
      check_signed_keys(*fleet().ca, keys.keys, keys.credential);
      server->receive_keys(name(i), keys.keys);
      posted.emplace(name(i), keys);
    }
    directory.directory = server->close_key_advertisement();
    for (const AdvertiseKeys& entry : directory.directory.devices) directory.credentials.push_back(posted[entry.identity].credential);
  }

  // Steps 1 and 2; returns U3 as the server fixes it.
  SurvivorList shares_and_inputs() {
    const std::vector<std::uint8_t> bytes = serialize(directory);
    for (int i = 0; i < devices; ++i)
      server->receive_shares(name(i), device[i]->share_keys(parse_signed_key_directory(bytes)));
    server->close_share_keys();
    for (int i = 0; i < devices; ++i)
      server->receive_masked_input(name(i), device[i]->masked_input(server->shares_for(name(i)), input[i]));
    return server->close_masked_input();
  }
};

// ---- tests

TEST(SignedSecureAggregation, AnHonestRoundUnmasksTheSum) {
  SignedRound round;
  round.advertise();
  const SurvivorList u3 = round.shares_and_inputs();
  std::map<std::string, PeerCertificate> certificates;
  for (const auto& [identity, keys] : round.posted)
    certificates.emplace(identity, check_signed_keys(*fleet().ca, keys.keys, keys.credential));
  ConsistencyRound consistency(u3, round.threshold);
  for (int i = 0; i < round.devices; ++i) {
    const ConsistencySignature signature =
        parse_consistency_signature(serialize(round.device[i]->sign_survivors(parse_survivor_list(serialize(u3)))));
    consistency.receive(name(i), signature, certificates.at(name(i)));
  }
  const std::vector<std::uint8_t> gathered = serialize(consistency.close());
  for (int i = 0; i < round.devices; ++i)
    round.server->receive_unmasking_shares(name(i),
                                           round.device[i]->unmasking_shares(parse_consistency_signatures(gathered)));
  const std::vector<std::uint32_t> sum = round.server->unmask();
  for (std::uint32_t k = 0; k < round.length; ++k) {
    std::uint32_t expected = 0;
    for (const auto& x : round.input) expected += x[k];
    ASSERT_EQ(sum[k], expected) << "entry " << k;
  }
}

TEST(SignedSecureAggregation, ASubstitutedPublicKeyIsRefusedByEveryOtherDevice) {
  SignedRound round;
  round.advertise();
  // The server puts its own mask key in device-3's entry (a man in the middle of its pairs),
  // keeping device-3's certificate and signature.
  SecureRandom attacker;
  round.directory.directory.devices[3].mask_public_key = x25519_generate(attacker).public_key;
  const std::vector<std::uint8_t> bytes = serialize(round.directory);
  for (int i = 0; i < round.devices; ++i) {
    if (i == 3) continue;
    try {
      round.device[i]->share_keys(parse_signed_key_directory(bytes));
      FAIL() << name(i) << " took a substituted key";
    } catch (const SecAggError& e) {
      EXPECT_NE(std::string(e.what()).find("'device-3'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("does not verify"), std::string::npos) << e.what();
    }
  }
}

TEST(SignedSecureAggregation, AnEntrySignedByAnotherIdentityOrCaIsRefused) {
  SignedRound round;
  round.advertise();
  SecureRandom attacker;
  const X25519KeyPair fake_cipher = x25519_generate(attacker), fake_mask = x25519_generate(attacker);
  AdvertiseKeys forged{kSession, name(2), fake_cipher.public_key, fake_mask.public_key};
  // The server signs its keys for device-2 with a certificate of its own from the fleet's CA
  // (CN edgetrain-server), then with one named device-2 from a CA the devices do not trust.
  std::shared_ptr<DeviceCredentials> server_credentials = fleet().issue("edgetrain-server");
  Pki other("unrelated-ca");
  std::shared_ptr<DeviceCredentials> impostor = other.issue(name(2));
  for (const auto& [signer, expected] :
       {std::pair{server_credentials, std::string("'edgetrain-server''s (its subject CN)")},
        std::pair{impostor, std::string("is not one of the fleet's CA")}}) {
    SignedKeyDirectory directory = round.directory;
    directory.directory.devices[2] = forged;
    directory.credentials[2] = {signer->certificate_der(), signer->sign(signed_keys_bytes(forged), attacker)};
    SignedRound fresh;  // a device answers one directory: a fresh round for each try
    try {
      fresh.device[0]->share_keys(directory);
      FAIL() << "a device took keys signed by " << signer->common_name();
    } catch (const SecAggError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

TEST(SignedSecureAggregation, AForgedMissingOrReplayedSignatureIsRefused) {
  SignedRound round;
  round.advertise();
  auto refused = [&](const SignedKeyDirectory& directory, const std::string& expected) {
    SignedRound fresh;
    try {
      fresh.device[0]->share_keys(directory);
      ADD_FAILURE() << "taken; expected a refusal with: " << expected;
    } catch (const SecAggError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  SignedKeyDirectory flipped = round.directory;
  flipped.credentials[1].signature[10] ^= 1;
  refused(flipped, "'device-1'");
  SignedKeyDirectory swapped = round.directory;  // device-4's signature on device-1's entry
  swapped.credentials[1].signature = round.directory.credentials[4].signature;
  refused(swapped, "does not verify");
  SignedKeyDirectory missing = round.directory;
  missing.credentials.pop_back();
  refused(missing, "credentials for 6 devices");
  // An empty signature cannot even be sent (the format needs 1..1024 bytes).
  SignedKeyDirectory empty = round.directory;
  empty.credentials[1].signature.clear();
  EXPECT_THROW(serialize(empty), SecAggError);
  refused(empty, "'device-1'");
  // device-5's keys and signature of another session, replayed into this one: the session
  // is in what is signed.
  SignedRound other_session;
  SignedSecAggDevice earlier(name(5), kSession + 1, other_session.random, other_session.credentials[5], fleet().ca);
  const SignedKeys old = earlier.advertise_keys();
  SignedKeyDirectory replayed = round.directory;
  replayed.directory.devices[5].cipher_public_key = old.keys.cipher_public_key;
  replayed.directory.devices[5].mask_public_key = old.keys.mask_public_key;
  replayed.credentials[5] = old.credential;
  refused(replayed, "'device-5'");
  // The server's own check refuses the same at POST time.
  AdvertiseKeys claimed = old.keys;
  claimed.round = kSession;
  EXPECT_THROW(check_signed_keys(*fleet().ca, claimed, old.credential), SecAggError);
}

// Bonawitz et al.'s attack on the semi-honest protocol: the server tells devices 0-2 that
// device-3 dropped (they reveal its mask private key) and devices 3-5 that everyone survived
// (they reveal its self-mask seed), so that it can unmask device-3's input. With t = 4 of 6,
// neither list gathers t signatures: whatever the server forwards, nobody reveals anything.
TEST(SignedSecureAggregation, TwoSurvivorListsForTwoHalvesMakeNoDeviceReveal) {
  SignedRound round;
  round.advertise();
  const SurvivorList everyone = round.shares_and_inputs();
  const SurvivorList without_3{kSession, {name(0), name(1), name(2), name(4), name(5)}};
  std::vector<ConsistencySignature> signatures;
  for (int i = 0; i < round.devices; ++i)
    signatures.push_back(round.device[i]->sign_survivors(i < 3 ? without_3 : everyone));
  const auto over = [&](std::set<int> who) {
    ConsistencySignatures out{kSession, {}};
    for (int i : who) out.signatures.push_back(signatures[i]);
    return out;
  };
  std::vector<std::string> refusals;
  for (int i = 0; i < round.devices; ++i) {
    // What the server can forward: the signatures of each half (valid over the device's own
    // list but fewer than t), or all six (t of them, but some over the other list).
    for (const ConsistencySignatures& forwarded :
         {i < 3 ? over({0, 1, 2}) : over({3, 4, 5}), over({0, 1, 2, 3, 4, 5}),
          i < 3 ? over({0, 1, 2, 4}) : over({0, 3, 4, 5})}) {
      try {
        round.device[i]->unmasking_shares(forwarded);
        FAIL() << name(i) << " revealed its shares";
      } catch (const SecAggError& e) {
        refusals.push_back(e.what());
      }
    }
  }
  ASSERT_EQ(refusals.size(), 18u);
  for (int i = 0; i < round.devices; ++i) {
    EXPECT_NE(refusals[3 * i].find("fewer than t = 4"), std::string::npos) << refusals[3 * i];
    EXPECT_NE(refusals[3 * i + 1].find("the survivor list this device was given"), std::string::npos)
        << refusals[3 * i + 1];
  }
  // And the server's own step 3 refuses the other half's signatures.
  std::map<std::string, PeerCertificate> certificates;
  for (const auto& [identity, keys] : round.posted)
    certificates.emplace(identity, check_signed_keys(*fleet().ca, keys.keys, keys.credential));
  ConsistencyRound consistency(everyone, round.threshold);
  for (int i = 3; i < 6; ++i) consistency.receive(name(i), signatures[i], certificates.at(name(i)));
  EXPECT_THROW(consistency.receive(name(0), signatures[0], certificates.at(name(0))), SecAggError);
  EXPECT_THROW(consistency.close(), SecAggError);  // 3 < t
}

TEST(SignedSecureAggregation, SignaturesAreCountedOncePerSurvivorAndListsAreSignedOnce) {
  SignedRound round;
  round.advertise();
  const SurvivorList u3 = round.shares_and_inputs();
  std::vector<ConsistencySignature> signatures;
  for (int i = 0; i < round.devices; ++i) signatures.push_back(round.device[i]->sign_survivors(u3));
  EXPECT_THROW(round.device[0]->sign_survivors(u3), SecAggError);  // once
  // Three signers, one of them repeated to look like four.
  ConsistencySignatures padded{kSession, {signatures[0], signatures[1], signatures[2], signatures[2]}};
  EXPECT_THROW(round.device[0]->unmasking_shares(padded), SecAggError);
  // Refused before: the device still answers an honest set afterwards.
  ConsistencySignatures honest{kSession, signatures};
  EXPECT_NO_THROW(round.device[0]->unmasking_shares(honest));
  EXPECT_THROW(round.device[0]->unmasking_shares(honest), SecAggError);  // and once only
}

TEST(SignedSecureAggregation, DroppedDevicesCanStillBeUnmaskedWithTSignatures) {
  SignedRound round;
  round.advertise();
  const std::vector<std::uint8_t> bytes = serialize(round.directory);
  for (int i = 0; i < round.devices; ++i)
    round.server->receive_shares(name(i), round.device[i]->share_keys(parse_signed_key_directory(bytes)));
  round.server->close_share_keys();
  for (int i = 0; i < round.devices - 1; ++i)  // device-5 drops before its input
    round.server->receive_masked_input(name(i), round.device[i]->masked_input(round.server->shares_for(name(i)),
                                                                              round.input[i]));
  const SurvivorList u3 = round.server->close_masked_input();
  std::vector<ConsistencySignature> signatures;
  for (int i = 0; i < 4; ++i) signatures.push_back(round.device[i]->sign_survivors(u3));  // device-4 drops here
  const ConsistencySignatures gathered{kSession, signatures};
  for (int i = 0; i < 4; ++i) round.server->receive_unmasking_shares(name(i), round.device[i]->unmasking_shares(gathered));
  const std::vector<std::uint32_t> sum = round.server->unmask();
  for (std::uint32_t k = 0; k < round.length; ++k) {
    std::uint32_t expected = 0;
    for (int i = 0; i < 5; ++i) expected += round.input[i][k];
    ASSERT_EQ(sum[k], expected);
  }
}

TEST(SignedSecureAggregation, CredentialsMustBeTheDevicesOwn) {
  SecureRandom random;
  auto credentials = fleet().issue(name(1));
  EXPECT_THROW(SignedSecAggDevice(name(2), kSession, random, credentials, fleet().ca), SecAggError);
  // A private key that is not the certificate's.
  Pk other;
  generate_p256(other, fleet().random);
  Pk subject;
  generate_p256(subject, fleet().random);
  const std::string certificate =
      certificate_pem(subject, "device-9", fleet().ca_key, fleet().ca_cn, false, fleet().random, 999);
  EXPECT_THROW(DeviceCredentials::from_pem(certificate, key_pem(other)), std::invalid_argument);
  EXPECT_EQ(DeviceCredentials::from_pem(certificate, key_pem(subject))->common_name(), "device-9");
}

TEST(SignedSecureAggregationMessages, RoundTripAndRefuseDamagedBytes) {
  SignedRound round;
  round.advertise();
  const std::vector<std::uint8_t> directory = serialize(round.directory);
  const SignedKeyDirectory back = parse_signed_key_directory(directory);
  EXPECT_EQ(back.directory.devices, round.directory.directory.devices);
  EXPECT_EQ(back.credentials, round.directory.credentials);
  const ConsistencySignature one{kSession, name(1), {1, 2, 3}};
  const ConsistencySignatures many{kSession, {one, {kSession, name(2), {4, 5}}}};
  EXPECT_EQ(parse_consistency_signature(serialize(one)).signature, one.signature);
  EXPECT_EQ(parse_consistency_signatures(serialize(many)).signatures.size(), 2u);
  for (const std::vector<std::uint8_t>& bytes :
       {directory, serialize(round.posted.begin()->second), serialize(one), serialize(many)}) {
    for (std::size_t cut = 0; cut < bytes.size(); cut += 7) {
      const std::span<const std::uint8_t> prefix(bytes.data(), cut);
      EXPECT_THROW(parse_signed_key_directory(prefix), SecAggError);
      EXPECT_THROW(parse_signed_keys(prefix), SecAggError);
      EXPECT_THROW(parse_consistency_signature(prefix), SecAggError);
      EXPECT_THROW(parse_consistency_signatures(prefix), SecAggError);
    }
    std::vector<std::uint8_t> longer = bytes;
    longer.push_back(0);
    EXPECT_THROW(parse_signed_key_directory(longer), SecAggError);
    EXPECT_THROW(parse_consistency_signatures(longer), SecAggError);
  }
  // The plain parser does not take a signed message, nor the signed one a plain one.
  EXPECT_THROW(parse_advertise_keys(serialize(round.posted.begin()->second)), SecAggError);
  EXPECT_THROW(parse_signed_keys(serialize(round.posted.begin()->second.keys)), SecAggError);
}

// Untrusted bytes: randomly damaged messages of each kind parse or give a SecAggError, nothing
// else (and nothing the sanitizers see in the ASan tree).
TEST(SignedSecureAggregationMessages, RandomlyDamagedBytesParseOrAreRefused) {
  SignedRound round;
  round.advertise();
  const ConsistencySignatures many{kSession, {{kSession, name(1), std::vector<std::uint8_t>(70, 9)},
                                              {kSession, name(2), std::vector<std::uint8_t>(71, 8)}}};
  const std::vector<std::vector<std::uint8_t>> messages = {
      serialize(round.directory), serialize(round.posted.begin()->second),
      serialize(ConsistencySignature{kSession, name(3), std::vector<std::uint8_t>(72, 7)}), serialize(many)};
  std::mt19937 draw(11);
  int parsed = 0, refused = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::vector<std::uint8_t> bytes = messages[trial % messages.size()];
    const int damages = 1 + static_cast<int>(draw() % 4);
    for (int d = 0; d < damages; ++d) {
      switch (draw() % 3) {
        case 0: bytes[draw() % bytes.size()] = static_cast<std::uint8_t>(draw()); break;  // a byte, lengths included
        case 1: bytes.resize(draw() % (bytes.size() + 1)); break;                         // cut
        case 2: bytes.insert(bytes.begin() + static_cast<long>(draw() % (bytes.size() + 1)), static_cast<std::uint8_t>(draw())); break;
      }
      if (bytes.empty()) bytes.push_back(static_cast<std::uint8_t>(draw()));
    }
    for (const auto& parse : {+[](std::span<const std::uint8_t> b) { (void)parse_signed_key_directory(b); },
                              +[](std::span<const std::uint8_t> b) { (void)parse_signed_keys(b); },
                              +[](std::span<const std::uint8_t> b) { (void)parse_consistency_signature(b); },
                              +[](std::span<const std::uint8_t> b) { (void)parse_consistency_signatures(b); }}) {
      try {
        parse(bytes);
        ++parsed;
      } catch (const SecAggError&) {
        ++refused;
      }
    }
  }
  EXPECT_EQ(parsed + refused, 16000);
  EXPECT_GT(refused, 12000);  // most damage is caught; a changed key or signature byte still parses
}

}  // namespace
}  // namespace edgetrain::privacy
