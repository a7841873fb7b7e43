// The worker loop of DESIGN.md, over CoAP/DTLS: pull the model, train one minibatch,
// compress, push; repeat. Survives a server that goes away (exponential backoff with
// jitter, then a fresh DTLS handshake), re-pulls when the server answers 4.09 (wrong model
// or too stale), and stops cleanly when asked.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/compressor.h"
#include "runtime/dataset.h"
#include "transport/codec.h"
#include "transport/coap_dtls.h"

namespace edgetrain::runtime {

struct WorkerConfig {
  std::string server_host = "127.0.0.1";
  std::uint16_t server_port = 5684;
  std::string identity;
  std::vector<std::uint8_t> key;
  std::string model = "paper-cnn";
  std::uint32_t worker_id = 0;
  std::uint32_t worker_count = 1;
  bool label_skewed = false;
  int batch = 10;
  int threads = 1;
  CompressorOptions compressor;  // the paper's AdaComp by default; its value_encoding is the wire's
  int pull_every = 1;           // steps per model pull; 1 is the paper's (pull before every step)
  // false (default): after the first pull, ask only for the parameters changed since the
  // version held (GET /model?since=V) and overwrite those; the result is the server's model
  // bit for bit, checked by its digest. true: always download the dense model.
  bool dense_pull = false;
  std::uint64_t max_steps = 0;  // 0: until stopped
  double max_seconds = 0;       // 0: until stopped
  int request_timeout_ms = 60000;
  // Emulates a slower device: after each step, sleep this many times the step's own
  // compute time (0: full speed; 3: a device four times slower).
  double slowdown = 0;
  std::uint64_t seed = 1;
  // Transport: X.509 instead of PSK (identity = the certificate's CN; `identity` is then
  // only for logs); or INSECURE plain CoAP (`identity` declared, unproven; no key).
  std::optional<transport::CertificateFiles> certificates;
  bool insecure_plaintext = false;
  transport::CoapTiming timing = transport::CoapTiming::wan();
};

// "coaps://host:port" (port defaults to 5684) into host and port; throws std::invalid_argument.
void parse_server_uri(const std::string& uri, std::string& host, std::uint16_t& port);
// The same, also accepting "coap://host:port" (plain CoAP, port defaults to 5683), which
// sets `plaintext`.
void parse_server_uri(const std::string& uri, std::string& host, std::uint16_t& port, bool& plaintext);
// Hex text (whitespace ignored) into bytes; throws std::invalid_argument.
std::vector<std::uint8_t> parse_hex_key(const std::string& text);

struct WorkerStats {
  std::uint64_t steps = 0;            // minibatches trained
  std::uint64_t updates_accepted = 0;
  std::uint64_t updates_refused = 0;  // 4.09: re-pulled
  std::uint64_t updates_rejected = 0; // other 4.xx: a bug or a misconfiguration, logged
  std::uint64_t pulls = 0;
  std::uint64_t delta_pulls = 0;      // pulls answered with a model delta
  std::uint64_t delta_mismatches = 0; // deltas that did not reproduce the server's model (re-pulled dense)
  std::uint64_t bytes_sent = 0;       // encoded update payloads
  std::uint64_t bytes_received = 0;   // encoded model payloads
  std::uint64_t server_version = 0;   // as last reported by the server
  std::uint64_t retries = 0;          // transport failures survived
  std::uint64_t non_finite_steps = 0; // skipped: the gradient was NaN or infinite
  float last_loss = 0;
};

using WorkerLog = std::function<void(const std::string& line)>;

// Runs until `stop` becomes true, max_steps or max_seconds is reached. Throws only for
// problems retrying cannot fix (bad configuration, data, a model the server does not
// serve); network trouble is retried forever (with backoff) until stopped.
WorkerStats run_worker(const WorkerConfig& config, const Dataset& train, const std::atomic<bool>& stop,
                       const WorkerLog& log = {}, const std::function<void(const WorkerStats&)>& progress = {});

}  // namespace edgetrain::runtime
