#include "sim/gan_simulation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "server/round_aggregation.h"

namespace edgetrain::sim {

using runtime::GanPart;
using runtime::kGanClasses;
using runtime::kGanImageSize;
using runtime::kGanNoiseSize;

namespace {

constexpr std::uint64_t kFloatBytes = 4;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// An MD-GAN worker: its shard and discriminator. An FL-GAN worker: a whole standalone GAN on
// its shard.
struct GanFleet::Worker {
  runtime::Dataset shard;
  std::unique_ptr<runtime::ShardSampler> sampler;
  std::unique_ptr<GanPart> d;
  std::unique_ptr<runtime::GanStandalone> local;  // FL-GAN
  std::vector<std::uint8_t> real_pixels;
  std::vector<float> real, feedback;
  std::vector<std::int32_t> real_labels;
};

GanFleet::GanFleet(const GanFleetSettings& settings, const runtime::Dataset& train)
    : settings_(settings), noise_(settings.gan.seed + 11), draws_{settings.gan.seed + 12} {
  const runtime::GanSettings& gan = settings.gan;
  if (settings.workers < 1) throw std::invalid_argument("gan fleet: at least one worker");
  if (settings.k < 1 || settings.k > settings.workers)
    throw std::invalid_argument("gan fleet: k must be 1..workers");
  if (!(settings.epochs_between > 0)) throw std::invalid_argument("gan fleet: E must be positive");
  if (train.size() < static_cast<std::size_t>(settings.workers) * gan.batch)
    throw std::invalid_argument("gan fleet: fewer than a batch of examples per worker");
  server_g_ = runtime::make_generator(gan, gan.seed);
  for (int n = 0; n < settings.workers; n++) {
    auto w = std::make_unique<Worker>();
    const auto indices = runtime::shard_iid(
        train.size(),
        {static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(settings.workers), gan.seed});
    w->shard = runtime::subset(train, indices);
    if (settings.mode == GanMode::kFlGan) {
      runtime::GanSettings local = gan;
      local.seed = gan.seed + 1000 * (n + 1);
      w->local = std::make_unique<runtime::GanStandalone>(local, w->shard);
      // Every copy starts from the same generator and discriminator, as FedAvg does.
      w->local->generator().params = server_g_->params;
      if (n > 0) w->local->discriminator().params = workers_[0]->local->discriminator().params;
      if (n == 0) {
        round_start_g_ = w->local->generator().params;
        round_start_d_ = w->local->discriminator().params;
      }
    } else {
      std::vector<std::uint32_t> all(w->shard.size());
      for (std::uint32_t i = 0; i < all.size(); i++) all[i] = i;
      w->sampler =
          std::make_unique<runtime::ShardSampler>(w->shard, all, gan.seed + 2000 * (n + 1));
      w->d = runtime::make_discriminator(gan, gan.seed + 3000 * (n + 1));
      w->real_pixels.resize(static_cast<std::size_t>(gan.batch) * kGanImageSize);
      w->real.resize(w->real_pixels.size());
      w->feedback.resize(w->real_pixels.size());
      w->real_labels.resize(gan.batch);
    }
    workers_.push_back(std::move(w));
  }
  const double shard_size = static_cast<double>(train.size()) / settings.workers;
  iterations_between_ =
      std::max<std::uint64_t>(1, std::llround(settings.epochs_between * shard_size / gan.batch));
  const std::size_t images = static_cast<std::size_t>(settings.k) * gan.batch;
  batch_noise_.resize(images * kGanNoiseSize);
  batch_inputs_.resize(images * (kGanNoiseSize + kGanClasses));
  batch_fake_.resize(images * kGanImageSize);
  feedback_sum_.resize(images * kGanImageSize);
  batch_labels_.resize(images);
}

GanFleet::~GanFleet() = default;

void GanFleet::iterate() {
  if (settings_.mode == GanMode::kMdGan) {
    md_gan_iteration();
  } else {
    fl_gan_iteration();
  }
  ++iterations_;
  if (iterations_ % iterations_between_ == 0) {
    if (settings_.mode == GanMode::kMdGan) {
      exchange_discriminators();
    } else {
      average_models();
    }
  }
}

void GanFleet::md_gan_iteration() {
  const int b = settings_.gan.batch, k = settings_.k, N = settings_.workers;
  const std::size_t input_width = kGanNoiseSize + kGanClasses;
  // The server's k batches.
  noise_.fill(batch_noise_.data(), batch_noise_.size());
  for (auto& label : batch_labels_) label = static_cast<std::int32_t>(draws_.next() % kGanClasses);
  runtime::generator_inputs(batch_inputs_.data(), batch_noise_.data(), batch_labels_.data(), k * b);
  for (int j = 0; j < k; j++)
    runtime::generate(*server_g_,
                      batch_inputs_.data() + static_cast<std::size_t>(j) * b * input_width, b,
                      batch_fake_.data() + static_cast<std::size_t>(j) * b * kGanImageSize);
  std::fill(feedback_sum_.begin(), feedback_sum_.end(), 0.0f);
  const std::size_t batch_floats = static_cast<std::size_t>(b) * kGanImageSize;
  for (int n = 0; n < N; n++) {
    Worker& w = *workers_[n];
    const int g_batch = n % k, d_batch = (n + 1) % k;
    const float* x_g = batch_fake_.data() + g_batch * batch_floats;
    const float* x_d = batch_fake_.data() + d_batch * batch_floats;
    const std::int32_t* labels_g = batch_labels_.data() + static_cast<std::size_t>(g_batch) * b;
    const std::int32_t* labels_d = batch_labels_.data() + static_cast<std::size_t>(d_batch) * b;
    const auto started = std::chrono::steady_clock::now();
    for (int l = 0; l < settings_.gan.discriminator_steps; l++) {
      w.sampler->next_batch(b, w.real_pixels, w.real_labels);
      runtime::pixels_to_gan(w.real.data(), w.real_pixels.data(), w.real_pixels.size());
      runtime::discriminator_step(*w.d, w.real.data(), w.real_labels.data(), x_d, labels_d, b);
    }
    runtime::generator_feedback(*w.d, x_g, labels_g, b, w.feedback.data());
    worker_seconds_ += seconds_since(started);
    // F_n is the gradient of worker n's mean over b; the server's loss is the mean over N·b.
    float* sum = feedback_sum_.data() + g_batch * batch_floats;
    for (std::size_t i = 0; i < batch_floats; i++) sum[i] += w.feedback[i] / static_cast<float>(N);
    traffic_.down_bytes += 2 * batch_floats * kFloatBytes;
    traffic_.up_bytes += batch_floats * kFloatBytes;
  }
  // G's gradient: every batch's summed feedback back-propagated through G, then one Adam step.
  GanPart& g = *server_g_;
  for (int j = 0; j < k; j++) {
    g.network->forward(g.params,
                       batch_inputs_.data() + static_cast<std::size_t>(j) * b * input_width, b);
    g.network->backward(g.params, feedback_sum_.data() + j * batch_floats,
                        j == 0 ? std::span<float>(g.grad) : g.grad_scratch, nullptr);
    if (j > 0)
      for (std::size_t i = 0; i < g.grad.size(); i++) g.grad[i] += g.grad_scratch[i];
  }
  g.adam.apply(g.params, g.grad, g.settings);
}

void GanFleet::fl_gan_iteration() {
  for (auto& w : workers_) {
    const auto started = std::chrono::steady_clock::now();
    w->local->iterate();
    worker_seconds_ += seconds_since(started);
  }
}

// A random cyclic permutation (Sattolo's algorithm): no worker keeps its own discriminator,
// each sends one and receives one.
void GanFleet::exchange_discriminators() {
  const int N = settings_.workers;
  if (N < 2) return;
  std::vector<int> next(N);
  for (int n = 0; n < N; n++) next[n] = n;
  for (int i = N - 1; i > 0; --i)
    std::swap(next[i], next[draws_.next() % static_cast<std::uint64_t>(i)]);
  std::vector<std::unique_ptr<GanPart>> moved(N);
  for (int n = 0; n < N; n++) moved[next[n]] = std::move(workers_[n]->d);
  for (int n = 0; n < N; n++) workers_[n]->d = std::move(moved[n]);
  traffic_.peer_bytes += static_cast<std::uint64_t>(N) * discriminator_parameters() * kFloatBytes;
  ++traffic_.swaps;
}

// One federated round of FL-GAN through the server's own aggregation (server/round_aggregation.h,
// as --mode rounds and edgetrain-sim --mode rounds aggregate): each worker's delta from the
// round's start model, FedAvg-weighted by the examples it trained on (equal shards: equal
// weights), added to the start model, which every worker then continues from.
void GanFleet::average_models() {
  const int N = settings_.workers;
  const std::uint64_t examples =
      iterations_between_ * static_cast<std::uint64_t>(settings_.gan.batch);
  for (const bool generator : {true, false}) {
    auto part = [&](int n) -> GanPart& {
      return generator ? workers_[n]->local->generator() : workers_[n]->local->discriminator();
    };
    std::vector<float>& start = generator ? round_start_g_ : round_start_d_;
    const auto size = static_cast<std::uint32_t>(start.size());
    std::vector<server::RoundDelta> deltas(N);
    for (int n = 0; n < N; n++) {
      transport::SparseTensor t{0, size, std::vector<std::uint32_t>(size),
                                std::vector<float>(size)};
      const auto& params = part(n).params;
      for (std::uint32_t i = 0; i < size; i++) {
        t.indices[i] = i;
        t.values[i] = params[i] - start[i];
      }
      deltas[n].examples = examples;
      deltas[n].delta.tensors.push_back(std::move(t));
    }
    const std::uint32_t sizes[1] = {size};
    const std::vector<float> delta =
        server::aggregate_deltas(deltas, sizes, server::Aggregation::kFedAvg);
    for (std::uint32_t i = 0; i < size; i++) start[i] += delta[i];
    for (int n = 0; n < N; n++) part(n).params = start;
  }
  // Up: each worker's G and D; down: the averages.
  traffic_.up_bytes += static_cast<std::uint64_t>(N) *
                       (generator_parameters() + discriminator_parameters()) * kFloatBytes;
  traffic_.down_bytes += static_cast<std::uint64_t>(N) *
                         (generator_parameters() + discriminator_parameters()) * kFloatBytes;
  ++traffic_.averagings;
}

void GanFleet::sample(int count, std::uint64_t seed, std::uint8_t* pixels, std::int32_t* labels) {
  if (settings_.mode == GanMode::kFlGan) {
    // The generator a round would publish now: the mean of the workers' copies.
    std::fill(server_g_->params.begin(), server_g_->params.end(), 0.0f);
    for (auto& w : workers_)
      for (std::size_t i = 0; i < server_g_->params.size(); i++)
        server_g_->params[i] +=
            w->local->generator().params[i] / static_cast<float>(settings_.workers);
  }
  runtime::sample_generator(*server_g_, count, seed, pixels, labels);
}

double GanFleet::worker_seconds_per_iteration() const {
  return iterations_ ? worker_seconds_ / static_cast<double>(iterations_) / settings_.workers : 0.0;
}

std::size_t GanFleet::generator_parameters() const { return server_g_->params.size(); }

std::size_t GanFleet::discriminator_parameters() const {
  return settings_.mode == GanMode::kMdGan ? workers_[0]->d->params.size()
                                           : workers_[0]->local->discriminator().params.size();
}

}  // namespace edgetrain::sim
