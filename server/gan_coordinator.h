// MD-GAN on the server (edgetrain-server --mode gan; server/README.md "MD-GAN"; Hardy, Le
// Merrer, Sericola, IPDPS 2019). The generator G and its Adam state live here; every worker
// keeps a discriminator.
//
//   GET  /gan/batches    2.05: the worker's two batches of the open iteration i
//                        (transport/gan_codec.h): X_g,n = X_(n mod k), X_d,n = X_((n+1) mod k),
//                        n being the worker's slot, and, every swap_every iterations, the
//                        peer it sends its discriminator to. 5.03 when this worker already
//                        answered iteration i (the next opens when the others answer or at
//                        the deadline: ask again shortly). 4.03 when all N slots are taken.
//   POST /gan/feedback   the worker's error feedback F_n for iteration i. 2.04 once counted
//                        (the same identity again: 2.04, not counted twice); 4.09 for a
//                        closed or future iteration; 4.00 malformed (wrong run, sizes, NaN).
//
// An iteration closes when all N workers answered or at the deadline (a worker that missed
// it is dropped from that iteration and counted; ours). The server then averages the
// feedbacks (each already the gradient of the worker's mean over b) over the m that came,
// back-propagates them through G at the iteration's inputs and takes one Adam step.
//
// Slots (ours): identities get slots 0..N−1 in the order they first ask; slots are not
// durable. Swaps (ours): the server announces a random cycle over the slotted identities
// (Sattolo's algorithm, seeded by the round), so each worker sends one discriminator and
// receives one, peer to peer; the workers do the exchange themselves.
//
// Durability (ours): the iteration's inputs are a function of (seed, iteration), so an
// iteration is fully described by its averaged feedback. Each close appends that to
// gan.wal (server/write_ahead_log.h's format: version = the iteration it completes,
// identity "#gan-step", sequence = feedbacks averaged) and fdatasyncs it before the step;
// every checkpoint_every iterations G and Adam's moments are checkpointed (sealed
// safetensors in checkpoint-<iteration>/, written aside and renamed) and the log emptied.
// Recovery loads the newest intact checkpoint and replays the log after it: G is bit for bit
// what it was after the last completed iteration.
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

#include "model/gan_training.h"
#include "server/write_ahead_log.h"
#include "transport/codec.h"
#include "transport/coap_dtls.h"

namespace edgetrain::server {

struct GanServerOptions {
  runtime::GanSettings gan;      // b (batch), architecture, Adam, seed, kernels; L is the workers'
  std::uint32_t workers = 1;     // N: the feedbacks an iteration waits for, and the slots
  std::uint32_t k = 1;           // generated batches per iteration (the paper: 1 or ⌈log2 N⌉)
  double deadline_seconds = 10;  // an iteration closes this long after it opened
  std::uint32_t swap_every = 0;  // iterations between discriminator swaps; 0: none
  transport::ValueEncoding encoding = transport::ValueEncoding::kFp32;  // of the batches sent
  std::uint32_t checkpoint_every = 100;                                 // iterations
  std::filesystem::path directory;  // gan.wal and checkpoint-<i>/ (created if missing)
  std::function<std::chrono::steady_clock::time_point()> now = [] {
    return std::chrono::steady_clock::now();
  };
  std::function<void(const std::string&)> log;
};
// Throws std::invalid_argument naming the setting.
void check_gan_server_options(const GanServerOptions& options);

// Raised when the directory holds another run's state, or state that cannot be trusted.
class GanStateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr const char* kGanStepIdentity = "#gan-step";

struct GanRecovery {
  std::uint64_t checkpoint_iteration = 0;  // 0: no checkpoint (a fresh G, or the log alone)
  std::uint64_t replayed = 0;              // logged iterations applied after it
  bool fresh = true;                       // nothing was there
};

class GanCoordinator {
 public:
  // Recovers from `options.directory` (or starts a new run there). Throws GanStateError.
  explicit GanCoordinator(GanServerOptions options);
  ~GanCoordinator();
  GanCoordinator(const GanCoordinator&) = delete;
  GanCoordinator& operator=(const GanCoordinator&) = delete;

  transport::CoapResponse get_batches(const transport::CoapRequest& request);
  transport::CoapResponse post_feedback(const transport::CoapRequest& request);
  // Closes the open iteration when it is due (every worker answered, or the deadline).
  // Called after each feedback and from the serving loop. Returns true when it closed one.
  bool poll();
  void attach(transport::CoapDtlsServer& server,
              std::function<void(const transport::CoapRequest&)> note = {});
  // Writes a checkpoint of the completed iterations now (also done every checkpoint_every).
  void checkpoint();

  std::uint64_t iteration() const { return iteration_; }  // the open one = iterations completed
  std::uint64_t run_id() const { return run_id_; }
  const GanRecovery& recovery() const { return recovery_; }
  const runtime::GanPart& generator() const { return *g_; }
  runtime::GanPart& generator() { return *g_; }
  // The "gan" keys of /status and the stats file.
  std::string status_json() const;

 private:
  void recover();
  void draw_inputs();  // the open iteration's noise and labels into inputs_ and labels_
  void open_iteration();
  void close_iteration();
  void apply_step(std::span<const float> averaged_feedback);
  std::vector<std::uint8_t> encode_step(std::span<const float> averaged_feedback) const;
  void log(const std::string& line) const;

  GanServerOptions options_;
  std::unique_ptr<runtime::GanPart> g_;  // its largest batch is k·b
  std::uint64_t run_id_ = 0;
  std::uint64_t iteration_ = 0;
  GanRecovery recovery_;
  std::optional<WalWriter> wal_;
  std::filesystem::path wal_path_;
  // The open iteration: its inputs [k·b][110], labels [k·b], generated samples [k·b][784].
  std::vector<float> inputs_, samples_, feedback_sum_;
  std::vector<std::int32_t> labels_;
  std::chrono::steady_clock::time_point opened_;
  std::map<std::string, std::uint32_t> slots_;  // identity (as updates are keyed) → n
  std::vector<std::string> slot_names_;         // n → the name peers know (swap instructions)
  std::set<std::string> answered_;
  std::map<std::string, std::string> swap_to_;  // this iteration's swap instructions, by peer name
  std::uint64_t feedbacks_ = 0, dropped_ = 0, late_ = 0, malformed_ = 0, duplicates_ = 0,
                empty_iterations_ = 0;
  std::uint64_t refused_no_slot_ = 0, swap_rounds_ = 0, batches_sent_ = 0;
  double last_step_seconds_ = 0;
};

}  // namespace edgetrain::server
