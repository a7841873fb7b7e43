// The parameter store's apply (σ + update + history) on the paper CNN, per update, for the
// AdaComp rule (per-parameter σ) next to Zhang et al.'s per-update delay rule (no history:
// the cost of applying the values alone), on the same stream of updates.
//
// The stream: each tensor's k = ⌊n·c⌋ entries (at least one), half drawn from a hot 5 % of
// the tensor (top-k sets of workers overlap in practice, and overlap is what makes σ > 1),
// delays uniform in 0..D. Prints µs per update and σ's mean. Host trees only; not a test.
//   edgetrain-apply-bench [--updates N] [--rate C] [--max-staleness D] [--repeat R]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "server/parameter_store.h"

using namespace edgetrain;

namespace {

std::vector<transport::SparseUpdate> make_stream(const std::vector<std::uint32_t>& sizes, int updates, double rate,
                                                 std::uint32_t max_staleness) {
  std::mt19937_64 rng(42);
  std::vector<transport::SparseUpdate> stream;
  for (int u = 0; u < updates; ++u) {
    transport::SparseUpdate update;
    update.model_id = 1;
    update.sequence = static_cast<std::uint64_t>(u);
    const std::uint64_t max_delay = std::min<std::uint64_t>(static_cast<std::uint64_t>(u), max_staleness);
    update.fetched_version = static_cast<std::uint64_t>(u) - rng() % (max_delay + 1);
    for (std::uint32_t t = 0; t < sizes.size(); ++t) {
      transport::SparseTensor tensor{t, sizes[t], {}, {}};
      const auto k = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(sizes[t] * rate));
      const std::uint32_t hot = std::max<std::uint32_t>(1, sizes[t] / 20);
      for (std::uint32_t j = 0; j < k; ++j) tensor.indices.push_back(static_cast<std::uint32_t>(rng() % 2 ? rng() % hot : rng() % sizes[t]));
      std::sort(tensor.indices.begin(), tensor.indices.end());
      tensor.indices.erase(std::unique(tensor.indices.begin(), tensor.indices.end()), tensor.indices.end());
      tensor.values.assign(tensor.indices.size(), 1e-3f);
      update.tensors.push_back(std::move(tensor));
    }
    stream.push_back(std::move(update));
  }
  return stream;
}

// µs per update over the stream (every update must apply), and the mean divisor.
std::pair<double, double> run(const std::vector<std::uint32_t>& sizes, const std::vector<transport::SparseUpdate>& stream,
                              server::ParameterStoreOptions options) {
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  server::ParameterStore store(1, sizes, std::vector<float>(total, 0.0f), options);
  double divisor_sum = 0, entries = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& update : stream) {
    if (!store.apply(update).applied()) {
      std::fprintf(stderr, "apply-bench: an update was refused\n");
      std::exit(1);
    }
    for (auto d : store.last_divisors()) divisor_sum += d;
    entries += static_cast<double>(store.last_divisors().size());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {seconds * 1e6 / static_cast<double>(stream.size()), divisor_sum / entries};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Parameter-store apply per update on the paper CNN: AdaComp's σ rule next to the per-update delay rule"};
  int updates = 3000, repeat = 3;
  double rate = 0.01;
  std::uint32_t max_staleness = 64;
  app.add_option("--updates", updates, "updates per run")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--rate", rate, "compression rate c")->check(CLI::Range(1e-6, 1.0))->capture_default_str();
  app.add_option("--max-staleness", max_staleness, "D; delays are drawn from 0..D")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--repeat", repeat, "runs of each rule, alternating")->check(CLI::Range(1, 100))->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::vector<std::uint32_t> sizes = {288, 32, 18432, 64, 401408, 128, 1280, 10};  // the paper CNN
  const auto stream = make_stream(sizes, updates, rate, max_staleness);
  std::size_t entries = 0;
  for (const auto& t : stream.back().tensors) entries += t.indices.size();
  std::printf("paper CNN, %d updates of ~%zu entries (c = %g), delays 0..%u\n", updates, entries, rate, max_staleness);
  std::printf("| run | σ rule (AdaComp) µs/update | delay rule (Zhang) µs/update | mean σ |\n|---|---|---|---|\n");
  for (int r = 1; r <= repeat; ++r) {
    server::ParameterStoreOptions sigma_rule;
    sigma_rule.max_staleness = max_staleness;
    server::ParameterStoreOptions delay_rule = sigma_rule;
    delay_rule.rule = server::StalenessRule::kPerUpdateDelay;
    const auto [sigma_us, mean_sigma] = run(sizes, stream, sigma_rule);
    const auto [delay_us, unused] = run(sizes, stream, delay_rule);
    std::printf("| %d | %.1f | %.1f | %.2f |\n", r, sigma_us, delay_us, mean_sigma);
  }
  return 0;
}
