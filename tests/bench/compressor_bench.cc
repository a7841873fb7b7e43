// Prints how long compressing one paper-CNN gradient (421,642 entries) takes with each
// compressor setting, in µs per call (median of many calls) and as a multiple of one plain
// pass over the same bytes (summing |g|), the least any selection has to do.
// A program that prints figures, not a test: timings on a shared machine are noisy.
//
//   edgetrain-compressor-bench [--repetitions N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/compressor.h"

using namespace edgetrain::runtime;

namespace {

const std::vector<std::uint32_t> kPaperSizes = {288, 32, 18432, 64, 401408, 128, 1280, 10};

double median_microseconds(int repetitions, const std::function<void()>& call) {
  for (int i = 0; i < 3; ++i) call();  // warm caches and let buffers reach their size
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(repetitions));
  for (int i = 0; i < repetitions; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int repetitions = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repetitions") == 0 && i + 1 < argc) repetitions = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--repetitions N]\n", argv[0]);
      return 2;
    }
  }
  std::vector<TensorSlice> layout;
  std::size_t total = 0;
  for (auto n : kPaperSizes) {
    layout.push_back({total, n});
    total += n;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1e-3f);
  std::vector<float> gradient(total);
  for (auto& g : gradient) g = dist(rng);

  volatile float sink = 0.0f;
  const double plain_pass = median_microseconds(repetitions, [&] {
    float sum = 0.0f;
    for (float g : gradient) sum += std::fabs(g);
    sink = sum;
  });
  std::printf("paper CNN gradient: %zu entries (%zu bytes), %d repetitions, median\n", total, total * sizeof(float), repetitions);
  std::printf("%-40s %10s %8s %10s\n", "setting", "us/call", "x pass", "entries");
  std::printf("%-40s %10.1f %8.2f %10s\n", "plain pass (sum of |g|)", plain_pass, 1.0, "-");

  struct Setting {
    const char* name;
    CompressorOptions options;
  };
  auto with = [](auto change) {
    CompressorOptions o;
    change(o);
    return o;
  };
  const std::vector<Setting> settings = {
      {"top-k c=0.01 (paper default)", {}},
      {"top-k c=0.1", with([](auto& o) { o.compression_rate = 0.1; })},
      {"top-k c=0.01 + error feedback", with([](auto& o) { o.error_feedback = true; })},
      {"top-k c=0.01 + error feedback + fp16", with([](auto& o) { o.error_feedback = true; o.value_encoding = edgetrain::transport::ValueEncoding::kFp16; })},
      {"top-k c=0.01 + EF + sign-scale", with([](auto& o) { o.error_feedback = true; o.value_encoding = edgetrain::transport::ValueEncoding::kSignScale; })},
      {"bin-local T=50 (Chen et al.)", with([](auto& o) { o.method = CompressionMethod::kBinLocal; })},
      {"bin-local T=500", with([](auto& o) { o.method = CompressionMethod::kBinLocal; o.bin_size = 500; })},
      {"none (dense ASGD)", with([](auto& o) { o.method = CompressionMethod::kNone; })},
  };
  for (const Setting& setting : settings) {
    Compressor compressor(layout, setting.options);
    edgetrain::transport::SparseUpdate update;
    const double us = median_microseconds(repetitions, [&] { compressor.compress(gradient, update); });
    std::size_t sent = 0;
    for (const auto& t : update.tensors) sent += t.indices.size();
    std::printf("%-40s %10.1f %8.2f %10zu\n", setting.name, us, us / plain_pass, sent);
  }
  return sink == -1.0f;  // keeps the plain pass from being optimised away
}
