// MD-GAN on a worker (edgetrain-worker --mode gan; worker/README.md "MD-GAN"; the server
// side is server/gan_coordinator.h). The worker keeps a discriminator D_n and its shard of
// the real data. Each iteration:
//   1. GET /gan/batches: the iteration's X_g,n and X_d,n with their class labels (5.03: it
//      already answered the open iteration; it asks again after poll_seconds);
//   2. if the batches open a swap round: POST its D to the peer named there
//      (/gan/discriminator on that peer's endpoint, X.509 identities as for gossip), then
//      wait up to swap_wait_seconds for the D another peer sends it, and train on that one
//      (none came: it keeps its own, counted);
//   3. L discriminator steps on a real batch of its shard and X_d,n;
//   4. POST /gan/feedback: F_n = ∂(generator loss)/∂x on X_g,n.
// Only D's parameters travel in a swap; Adam's moments stay on the board (ours: the paper
// counts |θ_D| per swap).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/gan_training.h"
#include "worker/gossip.h"
#include "worker/gossip_peer.h"
#include "worker/server_channel.h"
#include "worker/worker.h"
#include "transport/codec.h"

namespace edgetrain::runtime {

struct GanWorkerConfig {
  WorkerConfig worker;  // server, identity, shard (worker_id of worker_count), seed, backoff,
                        // limits, max_seconds
  GanSettings gan;      // b (must be the server's), L, architecture, Adam, kernels
  transport::ValueEncoding feedback_encoding = transport::ValueEncoding::kFp32;
  std::uint64_t max_iterations = 0;  // feedbacks accepted before the run ends; 0: until stopped
  double poll_seconds = 0.02;     // between GET /gan/batches while the iteration waits for others
  double swap_wait_seconds = 10;  // how long to wait for a peer's discriminator in a swap round
};

struct GanWorkerStats {
  std::uint64_t iterations = 0;         // feedbacks accepted (2.04)
  std::uint64_t feedbacks_refused = 0;  // 4.09: the iteration closed before this worker answered
  // 4.22: the server found a value non-finite or beyond its --gan-max-feedback (issue 37)
  std::uint64_t feedbacks_out_of_bounds = 0;
  // Not sent: this worker's feedback (or, in a swap, its discriminator) held a non-finite
  // value, which the encoder refuses; the worker goes on with the next iteration.
  std::uint64_t feedbacks_not_sent = 0, swaps_not_sent = 0;
  std::uint64_t waits = 0;  // 5.03 answers: the others had not answered yet
  std::uint64_t retries = 0;
  std::uint64_t swaps_sent = 0, swaps_received = 0, swaps_missed = 0;
  std::uint64_t peer_requests_refused =
      0;  // bodies peers sent that were not a discriminator, or not a peer's
  std::uint64_t bytes_sent = 0, bytes_received = 0;            // with the server (payloads)
  std::uint64_t peer_bytes_sent = 0, peer_bytes_received = 0;  // discriminators
  std::uint64_t last_iteration = 0;
  float d_loss_real = 0, d_loss_fake = 0, g_loss = 0;
  double compute_seconds = 0;  // discriminator steps and feedback
};

class GanWorker {
 public:
  // `peers` and `topology` may be null (no swaps: a swap instruction is then counted as missed).
  GanWorker(const GanWorkerConfig& config, const Dataset& train, ServerChannel& server,
            PeerChannel* peers, const GossipTopology* topology, const std::atomic<bool>& stop,
            WorkerLog log = {});
  ~GanWorker();
  GanWorker(const GanWorker&) = delete;
  GanWorker& operator=(const GanWorker&) = delete;

  // POST /gan/discriminator from a peer: its D for a swap round (the dense model codec, the
  // round as its version). Safe to call from another thread than run().
  transport::CoapResponse post_discriminator(const transport::CoapRequest& request);
  void attach(transport::CoapDtlsServer& server);

  // One GET and, with batches, the iteration. Returns true when a feedback was accepted.
  // Throws WorkerFailure when it gives up.
  bool run_once();
  GanWorkerStats run(const std::function<void(const GanWorkerStats&)>& progress = {});
  GanWorkerStats stats() const;
  const GanPart& discriminator() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

struct GanWorkerRun {
  GanWorkerStats stats;
  WorkerExit exit = WorkerExit::kStopped;
  std::string reason;
};

}  // namespace edgetrain::runtime
