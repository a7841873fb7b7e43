// What secure aggregation (privacy/secagg.h) costs a device and the server, in CPU time and
// bytes, for one round of N devices (default 20: 19 neighbours each) at the model sizes of
// the paper's MLP (101,770 parameters) and CNN (421,642). Prints figures; not a test.
//   edgetrain-secagg-bench [--devices N] [--threshold T] [--parameters P,P,...] [--repeat R]
// The server's unmasking is timed twice per size: with 30% of the devices dropping after
// their masked input (their self-mask seeds are reconstructed: N PRG expansions) and with 30%
// dropping before it (their mask keys are reconstructed and each pairwise mask with every
// survivor expanded again: 0.3·N·0.7·N more).
// Then what keys signed by the devices' certificates and the consistency round add
// (privacy/secagg_signed.h, --secagg-signed-keys), side by side with the same round unsigned:
// a device's CPU per step, its bytes and requests, and the server's checks (EC P-256
// certificates as boards/fleet-certificates.sh makes them, written in memory).
//
// SecAgg+ against everyone (privacy/secagg_graph.h; docs/privacy.md, "SecAgg+"), side by side:
//   edgetrain-secagg-bench --compare --devices 20,100,500 --neighbours auto,12 --dropout 0.1
//       [--parameters P] [--repeat R]
// For each N: a round with every device (N ≤ 255: Shamir over GF(2^8)) and a round per k of
// --neighbours ("auto": choose_neighbour_parameters(N, dropout); k ≥ N − 1 is everyone and is
// skipped), each timed with ⌈dropout·N⌉ devices (never device 0) leaving after their masked
// input and again before it; device 0's CPU (the sum of its four steps), bytes and messages,
// the server's unmasking.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "privacy/quantize.h"
#include "privacy/secagg.h"
#include "privacy/secagg_graph.h"
#include "privacy/secagg_messages.h"
#include "privacy/secagg_signed.h"
#include "tests/support/in_memory_pki.h"

namespace {

using namespace edgetrain::privacy;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string name(int i) {
  char text[16];
  std::snprintf(text, sizeof text, "device-%03d", i);  // byte order = index order up to 999
  return text;
}

struct Figures {
  double keygen = 0, share_keys = 0, masked_input = 0, unmasking = 0;  // device 0, ms
  double receive_inputs = 0, unmask = 0;                                // server, ms
  std::size_t sent = 0, received = 0;                                   // device 0, bytes
};

// One round; `dropped` devices (never device 0) leave before or after their masked input.
// With neighbours = k > 0 each device gets the server's directory and survivor list for it.
Figures run_round(int devices, std::uint32_t threshold, std::uint32_t length, const std::set<int>& dropped,
                  bool drop_before_input, SecureRandom& random, std::uint32_t neighbours = 0) {
  Figures f;
  std::vector<std::unique_ptr<SecAggDevice>> device;
  std::vector<std::vector<std::uint32_t>> input(devices);
  std::mt19937 draw(1);
  for (int i = 0; i < devices; ++i) {
    const auto start = Clock::now();
    device.push_back(std::make_unique<SecAggDevice>(name(i), 1, random));
    if (i == 0) f.keygen = ms_since(start);
    input[i].resize(length);
    for (std::uint32_t& v : input[i]) v = draw();
  }
  std::uint64_t graph_seed = 0;
  random.fill(std::span(reinterpret_cast<std::uint8_t*>(&graph_seed), sizeof graph_seed));
  SecAggServer server({1, threshold, length, neighbours, graph_seed});
  for (int i = 0; i < devices; ++i) {
    const std::vector<std::uint8_t> bytes = serialize(device[i]->advertise_keys());
    if (i == 0) f.sent += bytes.size();
    server.receive_keys(name(i), parse_advertise_keys(bytes));
  }
  const std::vector<std::uint8_t> whole = serialize(server.close_key_advertisement());
  for (int i = 0; i < devices; ++i) {
    const std::vector<std::uint8_t> directory = neighbours == 0 ? whole : serialize(server.directory_for(name(i)));
    if (i == 0) f.received += directory.size();
    const auto start = Clock::now();
    const EncryptedShares shares = device[i]->share_keys(parse_key_directory(directory));
    if (i == 0) f.share_keys = ms_since(start);
    const std::vector<std::uint8_t> bytes = serialize(shares);
    if (i == 0) f.sent += bytes.size();
    server.receive_shares(name(i), parse_encrypted_shares(bytes));
  }
  server.close_share_keys();
  double receiving = 0;
  for (int i = 0; i < devices; ++i) {
    if (drop_before_input && dropped.count(i)) continue;
    const std::vector<std::uint8_t> mine = serialize(server.shares_for(name(i)));
    if (i == 0) f.received += mine.size();
    const auto start = Clock::now();
    const MaskedInput masked = device[i]->masked_input(parse_encrypted_shares(mine), input[i]);
    if (i == 0) f.masked_input = ms_since(start);
    const std::vector<std::uint8_t> bytes = serialize(masked);
    if (i == 0) f.sent += bytes.size();
    const auto received = Clock::now();
    server.receive_masked_input(name(i), parse_masked_input(bytes));
    receiving += ms_since(received);
  }
  f.receive_inputs = receiving;
  const std::vector<std::uint8_t> all_survivors = serialize(server.close_masked_input());
  for (int i = 0; i < devices; ++i) {
    if (dropped.count(i)) continue;
    const std::vector<std::uint8_t> survivors =
        neighbours == 0 ? all_survivors : serialize(server.survivors_for(name(i)));
    if (i == 0) f.received += survivors.size();
    const auto start = Clock::now();
    const UnmaskingShares shares = device[i]->unmasking_shares(parse_survivor_list(survivors));
    if (i == 0) f.unmasking = ms_since(start);
    const std::vector<std::uint8_t> bytes = serialize(shares);
    if (i == 0) f.sent += bytes.size();
    server.receive_unmasking_shares(name(i), parse_unmasking_shares(bytes));
  }
  const auto start = Clock::now();
  const std::vector<std::uint32_t> sum = server.unmask();
  f.unmask = ms_since(start);
  // Check the work was real: the sum over the inputs that arrived.
  std::vector<std::uint32_t> expected(length, 0);
  for (int i = 0; i < devices; ++i) {
    if (drop_before_input && dropped.count(i)) continue;
    for (std::uint32_t k = 0; k < length; ++k) expected[k] += input[i][k];
  }
  if (sum != expected) {
    std::fprintf(stderr, "secagg-bench: the unmasked sum is wrong\n");
    std::exit(1);
  }
  return f;
}

// One whole round without dropouts, signed or not; device 0's time per step and bytes, the
// server's checks of the signatures (signed only).
struct StepFigures {
  double keys = 0, share_keys = 0, masked_input = 0, consistency = 0, unmasking = 0;  // device 0, ms
  double server_checks = 0;                                                         // ms, all devices
  std::size_t sent = 0, received = 0, requests = 0;                                 // device 0
};

StepFigures run_step_round(int devices, std::uint32_t threshold, std::uint32_t length, bool with_signatures,
                           SecureRandom& random) {
  static std::vector<std::shared_ptr<DeviceCredentials>> credentials;  // made once
  test_pki::Pki& pki = test_pki::fleet();
  while (static_cast<int>(credentials.size()) < devices) credentials.push_back(pki.issue(name(credentials.size())));
  StepFigures f;
  std::vector<std::unique_ptr<SecAggDevice>> plain;
  std::vector<std::unique_ptr<SignedSecAggDevice>> signer;
  std::vector<std::vector<std::uint32_t>> input(devices, std::vector<std::uint32_t>(length, 3));
  for (int i = 0; i < devices; ++i) {
    if (with_signatures) {
      signer.push_back(std::make_unique<SignedSecAggDevice>(name(i), 1, random, credentials[i], pki.ca));
    } else {
      plain.push_back(std::make_unique<SecAggDevice>(name(i), 1, random));
    }
  }
  SecAggServer server({1, threshold, length});
  std::map<std::string, KeyCredential> posted;
  std::map<std::string, PeerCertificate> certificates;
  for (int i = 0; i < devices; ++i) {
    auto start = Clock::now();
    std::vector<std::uint8_t> bytes;
    if (with_signatures) {
      bytes = serialize(signer[i]->advertise_keys());
    } else {
      bytes = serialize(plain[i]->advertise_keys());
    }
    if (i == 0) f.keys = ms_since(start), f.sent += bytes.size(), f.requests += 2;  // POST keys, GET directory
    if (with_signatures) {
      SignedKeys keys = parse_signed_keys(bytes);
      start = Clock::now();
      certificates.emplace(name(i), check_signed_keys(*pki.ca, keys.keys, keys.credential));
      f.server_checks += ms_since(start);
      server.receive_keys(name(i), keys.keys);
      posted.emplace(name(i), keys.credential);
    } else {
      server.receive_keys(name(i), parse_advertise_keys(bytes));
    }
  }
  const KeyDirectory directory = server.close_key_advertisement();
  SignedKeyDirectory signed_directory{directory, {}};
  for (const AdvertiseKeys& entry : directory.devices) signed_directory.credentials.push_back(posted[entry.identity]);
  const std::vector<std::uint8_t> directory_bytes =
      with_signatures ? serialize(signed_directory) : serialize(directory);
  f.received += directory_bytes.size();
  for (int i = 0; i < devices; ++i) {
    const auto start = Clock::now();
    const EncryptedShares shares = with_signatures ? signer[i]->share_keys(parse_signed_key_directory(directory_bytes))
                                                   : plain[i]->share_keys(parse_key_directory(directory_bytes));
    if (i == 0) f.share_keys = ms_since(start);
    const std::vector<std::uint8_t> bytes = serialize(shares);
    if (i == 0) f.sent += bytes.size(), f.requests += 2;  // POST shares, GET shares
    server.receive_shares(name(i), parse_encrypted_shares(bytes));
  }
  server.close_share_keys();
  for (int i = 0; i < devices; ++i) {
    const std::vector<std::uint8_t> mine = serialize(server.shares_for(name(i)));
    if (i == 0) f.received += mine.size();
    const auto start = Clock::now();
    const MaskedInput masked = with_signatures ? signer[i]->masked_input(parse_encrypted_shares(mine), input[i])
                                               : plain[i]->masked_input(parse_encrypted_shares(mine), input[i]);
    if (i == 0) f.masked_input = ms_since(start);
    const std::vector<std::uint8_t> bytes = serialize(masked);
    if (i == 0) f.sent += bytes.size(), f.requests += 2;  // POST input, GET survivors
    server.receive_masked_input(name(i), parse_masked_input(bytes));
  }
  const SurvivorList u3 = server.close_masked_input();
  const std::vector<std::uint8_t> survivors = serialize(u3);
  f.received += survivors.size();
  std::vector<std::uint8_t> signatures_bytes;
  if (with_signatures) {
    ConsistencyRound consistency(u3, threshold);
    for (int i = 0; i < devices; ++i) {
      const auto start = Clock::now();
      const std::vector<std::uint8_t> bytes = serialize(signer[i]->sign_survivors(parse_survivor_list(survivors)));
      if (i == 0) f.consistency = ms_since(start), f.sent += bytes.size(), f.requests += 2;  // POST, GET consistency
      const auto checked = Clock::now();
      consistency.receive(name(i), parse_consistency_signature(bytes), certificates.at(name(i)));
      f.server_checks += ms_since(checked);
    }
    signatures_bytes = serialize(consistency.close());
    f.received += signatures_bytes.size();
  }
  for (int i = 0; i < devices; ++i) {
    const auto start = Clock::now();
    const UnmaskingShares shares = with_signatures
                                       ? signer[i]->unmasking_shares(parse_consistency_signatures(signatures_bytes))
                                       : plain[i]->unmasking_shares(parse_survivor_list(survivors));
    if (i == 0) f.unmasking = ms_since(start);
    const std::vector<std::uint8_t> bytes = serialize(shares);
    if (i == 0) f.sent += bytes.size(), f.requests += 1;  // POST unmask
    server.receive_unmasking_shares(name(i), parse_unmasking_shares(bytes));
  }
  const std::vector<std::uint32_t> sum = server.unmask();
  if (sum != std::vector<std::uint32_t>(length, 3u * static_cast<std::uint32_t>(devices))) {
    std::fprintf(stderr, "secagg-bench: the unmasked sum of the %s round is wrong\n",
                 with_signatures ? "signed" : "unsigned");
    std::exit(1);
  }
  return f;
}

template <typename F>
double best_ms(int repeat, F&& body) {
  double best = 1e300;
  for (int r = 0; r < repeat; ++r) {
    const auto start = Clock::now();
    body();
    best = std::min(best, ms_since(start));
  }
  return best;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t start = 0; start <= text.size();) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

[[noreturn]] void usage_error(const char* program, const std::string& why) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s [--devices N] [--threshold T] [--parameters P,P,...] [--repeat R]\n"
               "       %s --compare [--devices N,N,...] [--neighbours auto|K,...] [--dropout D] [--parameters P] "
               "[--repeat R]\n",
               program, why.c_str(), program, program);
  std::exit(2);
}

// --compare: everyone against k neighbours, one table.
int compare(int argc, char** argv) {
  std::vector<int> fleet = {20, 100, 500};
  std::vector<std::string> choices = {"auto"};
  double dropout = 0.1;
  std::uint32_t length = 101770;
  int repeat = 1;
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage_error(argv[0], flag + " needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--devices") {
      fleet.clear();
      for (const std::string& n : split_list(value)) fleet.push_back(std::atoi(n.c_str()));
    } else if (flag == "--neighbours") {
      choices = split_list(value);
    } else if (flag == "--dropout") {
      dropout = std::atof(value.c_str());
    } else if (flag == "--parameters") {
      length = static_cast<std::uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
    } else if (flag == "--repeat") {
      repeat = std::max(1, std::atoi(value.c_str()));
    } else {
      usage_error(argv[0], "unknown flag " + flag);
    }
  }
  for (int n : fleet) {
    if (n < 3 || n > 999) usage_error(argv[0], "--devices: each between 3 and 999, not " + std::to_string(n));
  }
  if (!(dropout >= 0 && dropout < 0.5)) usage_error(argv[0], "--dropout must be in [0, 0.5)");
  if (length == 0) usage_error(argv[0], "--parameters must be a positive count");
  SecureRandom random;
  std::printf("secure aggregation, everyone against k neighbours (SecAgg+), P = %u, %.0f%% dropping "
              "(after their input / before it), device 0's figures, best of %d\n\n",
              length, dropout * 100, repeat);
  std::printf("| devices n | neighbours k | t | device CPU ms (keys, shares, input, unmask) | device bytes sent "
              "(of which the masked input) | received | messages sent / received | server unmask ms, dropped "
              "after / before input |\n|---|---|---|---|---|---|---|---|\n");
  for (int n : fleet) {
    std::set<int> dropped;
    std::mt19937 draw(static_cast<std::uint32_t>(n));
    const auto count = static_cast<std::size_t>(std::ceil(dropout * n - 1e-9));
    while (dropped.size() < count) dropped.insert(1 + static_cast<int>(draw() % static_cast<std::uint32_t>(n - 1)));
    std::vector<std::pair<std::uint32_t, std::uint32_t>> rows;  // (k, t); k = 0: everyone
    std::string notes;  // rows that are everyone again, printed after the measured ones
    if (n <= static_cast<int>(kMaxSecAggDevices)) rows.push_back({0, static_cast<std::uint32_t>(n / 2 + 1)});
    for (const std::string& choice : choices) {
      NeighbourParameters p;
      if (choice == "auto") {
        p = choose_neighbour_parameters(static_cast<std::uint32_t>(n), dropout);
      } else {
        p.neighbours = static_cast<std::uint32_t>(std::atoi(choice.c_str()));
        p.threshold = neighbourhood_majority(p.neighbours);
      }
      if (p.neighbours == 0 || p.neighbours + 1 >= static_cast<std::uint32_t>(n)) {
        notes += "| " + std::to_string(n) + " | " + choice + " → " + std::to_string(p.neighbours) +
                 " | | everyone (the row of everyone)" +
                 (n > static_cast<int>(kMaxSecAggDevices) ? ": not possible above 255 devices" : "") + " | | | | |\n";
        continue;
      }
      if (p.neighbours % 2 != 0) usage_error(argv[0], "--neighbours: an even k, not " + choice);
      rows.push_back({p.neighbours, p.threshold});
    }
    if (n > static_cast<int>(kMaxSecAggDevices)) {
      std::printf("| %d | everyone (%d) | | not possible: a round of everyone holds at most 255 devices (Shamir over "
                  "GF(2^8)) | | | | |\n", n, n - 1);
    }
    struct PrintNotes {  // after the rows, whichever way the loop ends
      const std::string& text;
      ~PrintNotes() { std::fputs(text.c_str(), stdout); }
    } print_notes{notes};
    for (const auto& [k, t] : rows) {
      Figures after{}, before{};
      after.masked_input = before.unmask = 1e300;
      try {
        for (int r = 0; r < repeat; ++r) {
          const Figures a = run_round(n, t, length, dropped, false, random, k);
          const Figures b = run_round(n, t, length, dropped, true, random, k);
          if (a.masked_input < after.masked_input) after = a;
          if (b.unmask < before.unmask) before = b;
        }
      } catch (const SecAggError& error) {
        // A neighbourhood kept fewer than t: the attempt would be redone (secagg_graph.h).
        std::printf("| %d | %u | %u | the round failed: %s | | | | |\n", n, k, t, error.what());
        continue;
      }
      const double cpu = after.keygen + after.share_keys + after.masked_input + after.unmasking;
      std::printf("| %d | %s | %u | %.1f (%.1f, %.1f, %.1f, %.2f) | %zu (%zu) | %zu | 4 / 3 | %.0f / %.0f |\n", n,
                  k == 0 ? (std::to_string(n - 1) + " (everyone)").c_str() : std::to_string(k).c_str(), t, cpu,
                  after.keygen, after.share_keys, after.masked_input, after.unmasking, after.sent,
                  std::size_t{14} + 1 + name(0).size() + std::size_t{4} * length, after.received, after.unmask,
                  before.unmask);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--compare") return compare(argc, argv);
  int devices = 20;
  std::uint32_t threshold = 0;
  std::vector<std::uint32_t> sizes = {101770, 421642};
  int repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--devices") {
      devices = std::atoi(argv[i + 1]);
    } else if (flag == "--threshold") {
      threshold = static_cast<std::uint32_t>(std::atoi(argv[i + 1]));
    } else if (flag == "--repeat") {
      repeat = std::max(1, std::atoi(argv[i + 1]));
    } else if (flag == "--parameters") {
      sizes.clear();
      for (char* p = argv[i + 1]; *p;) {
        sizes.push_back(static_cast<std::uint32_t>(std::strtoul(p, &p, 10)));
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--devices N] [--threshold T] [--parameters P,P,...] [--repeat R]\n", argv[0]);
      return 2;
    }
  }
  if (argc % 2 == 0 || devices < 3) {
    std::fprintf(stderr, "usage: %s [--devices N] [--threshold T] [--parameters P,P,...] [--repeat R]\n", argv[0]);
    return 2;
  }
  if (threshold == 0) threshold = static_cast<std::uint32_t>(devices / 2 + 1);
  SecureRandom random;

  // The primitives, best of `repeat` (of 100 calls for the cheap ones).
  const X25519KeyPair u = x25519_generate(random);
  const X25519KeyPair v = x25519_generate(random);
  const double agreement = best_ms(repeat, [&] {
    for (int i = 0; i < 100; ++i) {
      const Key32 secret = x25519_shared_secret(u.private_key, v.public_key, random);
      (void)derive_pair_seed(secret, SeedPurpose::kPairwiseMask, 1, "a", "b");
    }
  }) / 100;
  std::vector<std::uint8_t> points(devices);
  for (int i = 0; i < devices; ++i) points[i] = static_cast<std::uint8_t>(i + 1);
  const Key32 secret = random.key();
  const double split = best_ms(repeat, [&] {
    for (int i = 0; i < 100; ++i) (void)shamir_split(secret, threshold, points, random);
  }) / 100;
  std::printf("secure aggregation, %d devices (%d neighbours each), t = %u, best of %d\n", devices, devices - 1,
              threshold, repeat);
  std::printf("  one X25519 agreement + HKDF: %.3f ms; one Shamir split of 32 bytes into %d shares: %.3f ms\n",
              agreement, devices, split);

  for (std::uint32_t length : sizes) {
    const Key32 seed = random.key();
    std::vector<std::uint32_t> ring(length, 0);
    const double expansion = best_ms(repeat, [&] { add_mask(ring, seed); });
    std::vector<float> delta(length, 0.5f / std::sqrt(static_cast<float>(length)));
    const double quantizing = best_ms(repeat, [&] { (void)quantize(delta, 1, devices, Rounding::kNearest); });
    const double quantizing_stochastic =
        best_ms(repeat, [&] { (void)quantize(delta, 1, devices, Rounding::kStochastic, &random); });
    std::set<int> dropped;
    for (int i = 1; static_cast<int>(dropped.size()) < devices * 3 / 10; i += 3) dropped.insert(i % devices);
    Figures after{}, before{};
    after.unmask = before.unmask = after.masked_input = 1e300;
    for (int r = 0; r < repeat; ++r) {
      const Figures a = run_round(devices, threshold, length, dropped, false, random);
      const Figures b = run_round(devices, threshold, length, dropped, true, random);
      if (a.masked_input < after.masked_input) after = a;
      if (b.unmask < before.unmask) before = b;
    }
    std::printf("\nP = %u parameters (%.2f MB of ring values)\n", length, length * 4 / 1e6);
    std::printf("  device: one mask expansion (ChaCha20) %.2f ms; quantization %.2f ms (stochastic %.2f ms)\n",
                expansion, quantizing, quantizing_stochastic);
    std::printf("  device: key generation %.2f ms; share keys (%d agreements, 2 Shamir splits, %d seals) %.2f ms;\n"
                "          masked input (%d opens, %d agreements, %d expansions) %.2f ms; unmasking shares %.3f ms\n",
                after.keygen, devices - 1, devices - 1, after.share_keys, devices - 1, devices - 1, devices,
                after.masked_input, after.unmasking);
    std::printf("  device: sent %zu bytes (plain dense delta: %zu), received %zu bytes, in 4 requests\n", after.sent,
                static_cast<std::size_t>(length) * 4, after.received);
    std::printf("  server: adding %d masked inputs %.2f ms; unmask, %zu dropped after input: %.2f ms; "
                "%zu dropped before input: %.2f ms\n",
                devices, after.receive_inputs, dropped.size(), after.unmask, dropped.size(), before.unmask);
  }

  // Signed keys and the consistency round against the same round unsigned, on the first size
  // (what they add does not depend on P), best of `repeat` by the device's whole time.
  const std::uint32_t length = sizes.front();
  StepFigures plain{}, with{};
  double plain_total = 1e300, with_total = 1e300;
  for (int r = 0; r < repeat; ++r) {
    const StepFigures p = run_step_round(devices, threshold, length, false, random);
    const StepFigures s = run_step_round(devices, threshold, length, true, random);
    const auto total = [](const StepFigures& f) {
      return f.keys + f.share_keys + f.masked_input + f.consistency + f.unmasking;
    };
    if (total(p) < plain_total) plain = p, plain_total = total(p);
    if (total(s) < with_total) with = s, with_total = total(s);
  }
  std::printf("\nsigned keys and the consistency round (EC P-256 certificates), P = %u, no dropouts\n", length);
  std::printf("  %-48s %12s %12s %12s\n", "device 0", "unsigned", "signed", "added");
  const auto row = [](const char* what, double a, double b) {
    std::printf("  %-48s %9.2f ms %9.2f ms %9.2f ms\n", what, a, b, b - a);
  };
  row("keys (signed: + one signature)", plain.keys, with.keys);
  row("share keys (signed: + checks of n certificates)", plain.share_keys, with.share_keys);
  row("masked input", plain.masked_input, with.masked_input);
  row("consistency (sign U3)", plain.consistency, with.consistency);
  row("unmasking (signed: + checks of the signatures)", plain.unmasking, with.unmasking);
  row("all steps", plain_total, with_total);
  std::printf("  %-48s %12zu %12zu %12zd\n", "bytes sent", plain.sent, with.sent,
              static_cast<std::ptrdiff_t>(with.sent) - static_cast<std::ptrdiff_t>(plain.sent));
  std::printf("  %-48s %12zu %12zu %12zd\n", "bytes received", plain.received, with.received,
              static_cast<std::ptrdiff_t>(with.received) - static_cast<std::ptrdiff_t>(plain.received));
  std::printf("  %-48s %12zu %12zu %12zd\n", "requests (without 5.03 polls)", plain.requests, with.requests,
              static_cast<std::ptrdiff_t>(with.requests) - static_cast<std::ptrdiff_t>(plain.requests));
  std::printf("  server: checking %d signed keys and %d consistency signatures: %.2f ms\n", devices, devices,
              with.server_checks);
  return 0;
}
