// Prints how long compressing one paper-CNN gradient (421,642 entries) takes with each
// compressor setting of tests/support/compressor_variants.h (the list the unit test
// checks), next to one plain pass over the same bytes (summing |g|), the least any
// selection has to do: time per call, bytes/s over the gradient, the entries sent, and
// x_pass, the time per call as a multiple of the plain pass's (when the plain pass ran
// first, as it does unless a --benchmark_filter leaves it out).
// Then the top-k threshold alone on the largest tensor (the FC layer, 401,408 entries,
// k = 1 %): std::nth_element over a copy of the magnitudes (the compressor's rule until
// 2026-11-27) against worker/magnitude_select.h, side by side in one run.
// A program that prints figures, not a test: timings on a shared machine are noisy.
//
//   edgetrain-compressor-bench [--benchmark_repetitions=N] [--benchmark_filter=REGEX] ...
//   (Google Benchmark's flags; --help lists them)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "worker/compressor.h"
#include "worker/magnitude_select.h"
#include "tests/support/compressor_variants.h"

namespace {

using edgetrain::runtime::Compressor;
using edgetrain::runtime::TensorSlice;
using edgetrain::testing::CompressorVariant;

struct PaperGradient {
  std::vector<TensorSlice> layout;
  std::vector<float> values;
};

const PaperGradient& paper_gradient() {
  static const PaperGradient gradient = [] {
    PaperGradient g;
    std::size_t total = 0;
    for (auto n : edgetrain::testing::kPaperCnnTensorSizes) {
      g.layout.push_back({total, n});
      total += n;
    }
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1e-3f);
    g.values.resize(total);
    for (auto& v : g.values) v = dist(rng);
    return g;
  }();
  return gradient;
}

// Seconds per call of the plain pass in this run; 0 until it has run.
double plain_pass_seconds = 0;

// Times `call` per iteration by hand (UseManualTime), so that the mean is known here too.
template <typename Call>
double time_iterations(benchmark::State& state, Call&& call) {
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    call();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  const auto& g = paper_gradient();
  state.SetBytesProcessed(
      static_cast<std::int64_t>(state.iterations() * g.values.size() * sizeof(float)));
  return state.iterations() > 0 ? total / static_cast<double>(state.iterations()) : 0;
}

void plain_pass(benchmark::State& state) {
  const auto& g = paper_gradient();
  plain_pass_seconds = time_iterations(state, [&] {
    float sum = 0.0f;
    for (float v : g.values) sum += std::fabs(v);
    benchmark::DoNotOptimize(sum);
  });
  state.counters["x_pass"] = 1.0;
}

void compress(benchmark::State& state, const CompressorVariant& variant) {
  const auto& g = paper_gradient();
  Compressor compressor(g.layout, variant.setting);
  edgetrain::transport::SparseUpdate update;
  const double seconds = time_iterations(state, [&] {
    compressor.compress(g.values, update);
    benchmark::ClobberMemory();
  });
  std::size_t sent = 0;
  for (const auto& t : update.tensors) sent += t.indices.size();
  state.counters["entries"] = static_cast<double>(sent);
  if (plain_pass_seconds > 0) state.counters["x_pass"] = seconds / plain_pass_seconds;
  state.SetLabel(variant.description);
}

// The largest tensor of the gradient, and its k at c = 0.01.
std::span<const float> largest_tensor() {
  const auto& g = paper_gradient();
  const auto largest =
      std::max_element(g.layout.begin(), g.layout.end(),
                       [](const TensorSlice& a, const TensorSlice& b) { return a.size < b.size; });
  return std::span<const float>(g.values).subspan(largest->offset, largest->size);
}

void threshold_by_nth_element(benchmark::State& state) {
  const auto values = largest_tensor();
  const std::uint32_t k = Compressor::top_k_count(static_cast<std::uint32_t>(values.size()), 0.01);
  std::vector<float> magnitudes(values.size());
  time_iterations(state, [&] {
    for (std::size_t i = 0; i < values.size(); ++i) magnitudes[i] = std::fabs(values[i]);
    std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1), magnitudes.end(),
                     std::greater<float>());
    benchmark::DoNotOptimize(magnitudes[k - 1]);
  });
  state.SetLabel("std::nth_element, " + std::to_string(values.size()) + " entries, k " +
                 std::to_string(k));
}

void threshold_by_histogram(benchmark::State& state) {
  const auto values = largest_tensor();
  const std::uint32_t k = Compressor::top_k_count(static_cast<std::uint32_t>(values.size()), 0.01);
  edgetrain::runtime::MagnitudeSelector selector(values.size());
  time_iterations(state, [&] {
    auto rank = selector.select(values, k);
    benchmark::DoNotOptimize(rank);
  });
  state.SetLabel("MagnitudeSelector, " + std::to_string(values.size()) + " entries, k " +
                 std::to_string(k));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RegisterBenchmark("plain_pass_sum_abs", plain_pass)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  for (const CompressorVariant& variant : edgetrain::testing::compressor_variants())
    benchmark::RegisterBenchmark(("compress/" + variant.name).c_str(), compress, variant)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("threshold/nth_element", threshold_by_nth_element)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("threshold/histogram", threshold_by_histogram)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
