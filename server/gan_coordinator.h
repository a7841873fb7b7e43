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
//                        closed or future iteration; 4.00 malformed (wrong run, sizes);
//                        4.22 a value that is not finite or beyond ±max_feedback_magnitude
//                        (issue 37); 4.03 from a quarantined device.
//
// Bad feedback (issue 37, ours): feedback is checked before it is acknowledged; refusals are
// counted per device and, with quarantine_after, a device with that many bad feedbacks in
// a row (4.22 or 4.00) is quarantined (its requests get 4.03; an iteration stops waiting for
// it). Before a step is logged the server computes it; a step that would leave G or Adam's
// moments non-finite (or whose averaged feedback is) is refused as a whole: G stays as it
// was, the iteration closes without a step, and the log says so with a "#gan-refused-step"
// record that replay skips the same way.
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
// identity "#gan-step", sequence = feedbacks averaged; "#gan-refused-step" and no values for
// an iteration that closed without a step) and fdatasyncs it before the next iteration opens
// (the step is computed first, to be checked, and put back if the write fails); every
// checkpoint_every iterations G and Adam's moments are checkpointed (sealed
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
#include "server/wal_repair.h"
#include "server/write_ahead_log.h"
#include "transport/codec.h"
#include "transport/coap_dtls.h"

namespace edgetrain::server {

// The default bound on one feedback value. Honest feedback is the gradient of the mean
// loss over b samples with respect to each pixel, so it shrinks with b: its largest value
// was 0.023 in e2e_gan_fleet (b = 8), 0.052 over 1,500 in-process MD-GAN iterations at
// b = 10 and 0.38 over 3,000 at b = 1 (server/README.md, "MD-GAN"). 1000 leaves a margin of
// more than 2,500 at b = 1, and feedback within it keeps the generator's gradients (and
// Adam's squares of them) many orders of magnitude from float overflow.
inline constexpr float kDefaultMaxGanFeedbackMagnitude = 1000.0f;

struct GanServerOptions {
  runtime::GanSettings gan;      // b (batch), architecture, Adam, seed, kernels; L is the workers'
  std::uint32_t workers = 1;     // N: the feedbacks an iteration waits for, and the slots
  std::uint32_t k = 1;           // generated batches per iteration (the paper: 1 or ⌈log2 N⌉)
  double deadline_seconds = 10;  // an iteration closes this long after it opened
  std::uint32_t swap_every = 0;  // iterations between discriminator swaps; 0: none
  transport::ValueEncoding encoding = transport::ValueEncoding::kFp32;  // of the batches sent
  std::uint32_t checkpoint_every = 100;                                 // iterations
  // A feedback holding a value beyond ±this is refused (4.22); non-finite ones always are.
  float max_feedback_magnitude = kDefaultMaxGanFeedbackMagnitude;
  // Per-device norm clipping (--gan-clip-feedback, ours; issue 37): an accepted feedback
  // whose L2 norm is above this is scaled down to it before it is summed, so the logged
  // averaged feedback (and replay) holds the clipped one; 0: off.
  double clip_feedback_norm = 0;
  // As the server's --quarantine-after / --quarantine-seconds (server/README.md, "Bad
  // updates"): after this many bad feedbacks in a row; 0: never. 0 s: until a restart.
  std::uint32_t quarantine_after = 0;
  double quarantine_seconds = 0;
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
// An iteration that closed without a step (its step would have been non-finite): an empty
// record, so that replay closes the iteration the same way.
inline constexpr const char* kGanRefusedStepIdentity = "#gan-refused-step";

// What `repair-wal --skip-damaged` puts in gan.wal where damage hid an iteration: one closed
// without a step, which replay closes the same way (the lost step's change is lost).
WalPlaceholder gan_wal_placeholder();

struct GanRecovery {
  std::uint64_t checkpoint_iteration = 0;  // 0: no checkpoint (a fresh G, or the log alone)
  std::uint64_t replayed = 0;              // logged iterations applied after it
  std::uint64_t replayed_refused = 0;      // of those, iterations closed without a step
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
  // Takes the step of the open iteration and returns true, or, when the averaged feedback
  // or the step's result is not finite, leaves G and Adam as they were and returns false.
  // The iteration advances either way.
  bool apply_step(std::span<const float> averaged_feedback);
  void undo_step();  // puts back G and Adam as apply_step() found them
  // Per device: bad feedbacks (4.22, 4.00) and quarantine, as the server does for updates.
  struct DeviceRefusals {
    std::uint64_t out_of_bounds = 0, malformed = 0, quarantined_refused = 0, quarantines = 0;
    std::uint64_t clipped = 0;  // accepted feedbacks scaled down (--gan-clip-feedback)
    std::uint32_t consecutive_bad = 0;
    bool quarantined = false;
    std::optional<std::chrono::steady_clock::time_point> quarantined_until;  // none: restart
  };
  // Counts a bad feedback of `identity`; returns what to add to the refusal's reason.
  std::string note_bad(const std::string& identity, bool out_of_bounds);
  // The reason `identity` is quarantined, or nullopt (a timed quarantine that ran out ends).
  std::optional<std::string> quarantine_reason(const std::string& identity);
  std::size_t quarantined_slotted() const;
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
  std::uint64_t feedbacks_clipped_ = 0;
  std::uint64_t feedbacks_ = 0, dropped_ = 0, late_ = 0, malformed_ = 0, duplicates_ = 0,
                empty_iterations_ = 0;
  std::uint64_t refused_no_slot_ = 0, swap_rounds_ = 0, batches_sent_ = 0;
  std::uint64_t out_of_bounds_ = 0, quarantine_refused_ = 0, steps_refused_ = 0,
                batches_not_encodable_ = 0;
  std::map<std::string, DeviceRefusals> devices_;  // by identity; only slotted ones post
  // Scratch for apply_step(): G and Adam before the step, put back when it is refused.
  std::vector<float> saved_params_, saved_m_, saved_v_;
  std::uint64_t saved_steps_ = 0;
  double last_step_seconds_ = 0;
};

}  // namespace edgetrain::server
