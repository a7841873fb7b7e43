// The cost of a round's close on the server (server::round_close_update: aggregation and the
// close's update) for each aggregation rule, on the paper CNN (421,642 parameters), with m
// devices' dense deltas (every entry; --mode rounds sends dense deltas unless the worker
// compresses them) and with top-k deltas at c = 0.01. The plain weighted mean (masked,
// fedavg) next to the robust rules (trimmed-mean, median: a sort of m values per
// coordinate), side by side in one run: their ratio is the figure; the times move with the
// machine. Prints the time per close and items_per_second (parameters of the devices' deltas
// aggregated per second).
//   edgetrain-aggregation-bench [--benchmark_filter=REGEX] [--benchmark_min_time=S]
// Host trees only; a program that prints figures, not a test.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "server/round_aggregation.h"
#include "tests/support/paper_cnn_tensor_sizes.h"

using namespace edgetrain;

namespace {

// m deltas, each tensor's entries all (dense) or a random ⌈n·rate⌉ of them, values ~ N(0, 0.01).
const std::vector<server::RoundDelta>& deltas_for(int devices, double rate) {
  static std::map<std::pair<int, double>, std::vector<server::RoundDelta>> cache;
  auto& deltas = cache[{devices, rate}];
  if (!deltas.empty()) return deltas;
  std::mt19937_64 rng(static_cast<std::uint64_t>(devices) * 7 + 1);
  std::normal_distribution<float> value(0.0f, 0.01f);
  const auto& sizes = testing::kPaperCnnTensorSizes;
  for (int d = 0; d < devices; ++d) {
    server::RoundDelta delta;
    delta.examples = 100 + rng() % 100;
    for (std::uint32_t t = 0; t < sizes.size(); ++t) {
      transport::SparseTensor tensor{t, sizes[t], {}, {}};
      if (rate >= 1) {
        for (std::uint32_t i = 0; i < sizes[t]; ++i) tensor.indices.push_back(i);
      } else {
        std::vector<bool> taken(sizes[t]);
        const auto k = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(sizes[t] * rate));
        for (std::uint32_t n = 0; n < k;) {
          const auto i = static_cast<std::uint32_t>(rng() % sizes[t]);
          if (!taken[i]) taken[i] = true, ++n;
        }
        for (std::uint32_t i = 0; i < sizes[t]; ++i)
          if (taken[i]) tensor.indices.push_back(i);
      }
      for (std::size_t i = 0; i < tensor.indices.size(); ++i) tensor.values.push_back(value(rng));
      delta.delta.tensors.push_back(std::move(tensor));
    }
    deltas.push_back(std::move(delta));
  }
  return deltas;
}

void close_round(benchmark::State& state, server::Aggregation rule, double rate) {
  const int devices = static_cast<int>(state.range(0));
  const auto& deltas = deltas_for(devices, rate);
  const auto& sizes = testing::kPaperCnnTensorSizes;
  std::uint64_t parameters = 0;
  for (std::uint32_t size : sizes) parameters += size;
  for (auto _ : state) {
    auto update = server::round_close_update(deltas, sizes, rule, 1.0f, 0.1f, 1, 0);
    benchmark::DoNotOptimize(update.tensors.data());
  }
  // items: a parameter of a device's delta, so items_per_second compares across m.
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(parameters) * devices);
}

void register_all() {
  for (const double rate : {1.0, 0.01})
    for (const auto rule : {server::Aggregation::kMasked, server::Aggregation::kFedAvg,
                            server::Aggregation::kTrimmedMean, server::Aggregation::kMedian}) {
      const std::string name = std::string(rate >= 1 ? "dense/" : "topk0.01/") +
                               server::aggregation_name(rule);
      benchmark::RegisterBenchmark(name.c_str(), close_round, rule, rate)
          ->Arg(8)
          ->Arg(32)
          ->Arg(100)
          ->Unit(benchmark::kMillisecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
