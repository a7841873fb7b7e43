// MD-GAN and FL-GAN in one process (issue 16): N workers, each with its shard of the data and
// its own discriminator, on the GAN steps of model/gan_training.h, so the algorithms can be
// compared at the paper's settings before the CoAP/DTLS modes exist.
//
// MD-GAN (Hardy, Le Merrer, Sericola, IPDPS 2019), per iteration:
//   the server draws k batches X_1..X_k of b generated samples; worker n gets
//   X_g,n = X_((n mod k)+1) and X_d,n = X_(((n+1) mod k)+1); it runs L discriminator steps on a
//   real batch of its shard and X_d,n, then computes its error feedback F_n on X_g,n; the
//   server back-propagates the feedbacks through G (averaged over N·b) and takes an Adam step.
//   Every E epochs of a worker's shard the discriminators move peer to peer: each worker sends
//   its D to another one, chosen by a seeded random derangement, and takes one in return (ours:
//   a permutation without fixed points; Adam's moments travel with the parameters).
// FL-GAN (the baseline): every worker trains its own copy of G and D on its shard (one
//   generator step per iteration, after L discriminator steps); every E epochs a federated
//   round averages the copies of G and D (the server's FedAvg aggregation,
//   server/round_aggregation.h, with equal shards; Adam's moments stay local: ours).
// Traffic is counted in floats of 4 bytes as the paper counts it: per MD-GAN worker and
// iteration 2·b·d down and b·d up, |θ_D| per swap; per FL-GAN worker and round 2·(|θ_G|+|θ_D|).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/gan_training.h"

namespace edgetrain::sim {

enum class GanMode { kMdGan, kFlGan };

struct GanFleetSettings {
  GanMode mode = GanMode::kMdGan;
  int workers = 10;
  int k = 1;  // MD-GAN: generated batches per iteration (1 or ⌈log2 N⌉ in the paper)
  double epochs_between =
      1;                     // E: MD-GAN's swaps, FL-GAN's averaging, in epochs of a worker's shard
  runtime::GanSettings gan;  // batch b, L, Adam, seed, kernels
};

struct GanFleetTraffic {
  std::uint64_t down_bytes = 0, up_bytes = 0, peer_bytes = 0;  // summed over workers
  std::uint64_t swaps = 0, averagings = 0;
};

class GanFleet {
 public:
  // Shards `train` i.i.d. over the workers. Throws std::invalid_argument for bad settings.
  GanFleet(const GanFleetSettings& settings, const runtime::Dataset& train);
  ~GanFleet();
  // One generator iteration (MD-GAN: the server's step; FL-GAN: every worker's local step).
  void iterate();
  // Samples of the generator that is evaluated: the server's (MD-GAN) or the average (FL-GAN).
  void sample(int count, std::uint64_t seed, std::uint8_t* pixels, std::int32_t* labels);
  std::uint64_t iterations() const { return iterations_; }
  const GanFleetTraffic& traffic() const { return traffic_; }
  // Seconds of worker computation (discriminator and generator steps, feedback) per worker
  // and iteration, measured: what the paper halves against FL-GAN.
  double worker_seconds_per_iteration() const;
  std::size_t generator_parameters() const;
  std::size_t discriminator_parameters() const;

 private:
  struct Worker;
  void md_gan_iteration();
  void fl_gan_iteration();
  void exchange_discriminators();
  void average_models();
  GanFleetSettings settings_;
  std::unique_ptr<runtime::GanPart> server_g_;  // MD-GAN's G; FL-GAN's average, for sampling
  std::vector<float> round_start_g_,
      round_start_d_;  // FL-GAN: the models the current round started from
  std::vector<std::unique_ptr<Worker>> workers_;
  runtime::GaussianSampler noise_;
  runtime::SplitMix64 draws_;
  std::uint64_t iterations_ = 0, iterations_between_ = 1;
  GanFleetTraffic traffic_;
  double worker_seconds_ = 0;
  std::vector<float> batch_noise_, batch_inputs_, batch_fake_, feedback_sum_;
  std::vector<std::int32_t> batch_labels_;
};

}  // namespace edgetrain::sim
