// The parameter store's apply (σ + update + history) on the paper CNN, per update, for each
// staleness rule of tests/support/staleness_rules.h (the list the unit test checks): the
// AdaComp rule (per-parameter σ) next to Zhang et al.'s per-update delay rule (no history:
// the cost of applying the values alone), on the same stream of updates.
//
// The stream: each tensor's k = ⌊n·c⌋ entries (at least one), half drawn from a hot 5 % of
// the tensor (top-k sets of workers overlap in practice, and overlap is what makes σ > 1),
// delays uniform in 0..D. One iteration applies the whole stream to a fresh store; prints
// the time per update (s_per_update) and the divisor's mean (mean_divisor: σ's mean for
// the σ rule). reserve/ runs the same stream the server's way: reserve() a group of updates
// (--group, as one WAL sync covers them), then apply_reserved() them in order. --replay WAL
// replaces the synthetic stream with real workers' updates (read_stream below).
// Host trees only; a program that prints figures, not a test.
//   edgetrain-apply-bench [--updates N] [--rate C] [--max-staleness D] [--benchmark_repetitions=R]
//   ... (Google Benchmark's --benchmark_* flags are taken first; --help lists the others)
#include <benchmark/benchmark.h>

#include "common/settings.h"

#include <algorithm>
#include <string>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "server/parameter_store.h"
#include "server/write_ahead_log.h"
#include "tests/support/paper_cnn_tensor_sizes.h"
#include "tests/support/staleness_rules.h"

using namespace edgetrain;

namespace {

std::vector<transport::SparseUpdate> make_stream(const std::vector<std::uint32_t>& sizes,
                                                 int updates, double rate,
                                                 std::uint32_t max_staleness) {
  std::mt19937_64 rng(42);
  std::vector<transport::SparseUpdate> stream;
  for (int u = 0; u < updates; ++u) {
    transport::SparseUpdate update;
    update.model_id = 1;
    update.sequence = static_cast<std::uint64_t>(u);
    const std::uint64_t max_delay =
        std::min<std::uint64_t>(static_cast<std::uint64_t>(u), max_staleness);
    update.fetched_version = static_cast<std::uint64_t>(u) - rng() % (max_delay + 1);
    for (std::uint32_t t = 0; t < sizes.size(); ++t) {
      transport::SparseTensor tensor{t, sizes[t], {}, {}};
      const auto k = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(sizes[t] * rate));
      const std::uint32_t hot = std::max<std::uint32_t>(1, sizes[t] / 20);
      for (std::uint32_t j = 0; j < k; ++j)
        tensor.indices.push_back(
            static_cast<std::uint32_t>(rng() % 2 ? rng() % hot : rng() % sizes[t]));
      std::sort(tensor.indices.begin(), tensor.indices.end());
      tensor.indices.erase(std::unique(tensor.indices.begin(), tensor.indices.end()),
                           tensor.indices.end());
      tensor.values.assign(tensor.indices.size(), 1e-3f);
      update.tensors.push_back(std::move(tensor));
    }
    stream.push_back(std::move(update));
  }
  return stream;
}

// The updates a server's WAL recorded from real workers (tests/bench/record_updates.sh),
// with the delays they had (or --delay for every one: a loaded server's delays are as many as
// the posts in flight): update u of the stream was fetched min(delay, u) versions before it
// is applied. Real top-k sets overlap far more than the synthetic ones, so σ's
// chains are longer. At most `limit` records; exits 2 with a message for an unusable log.
std::vector<transport::SparseUpdate> read_stream(const std::string& path, std::size_t limit,
                                                 std::uint32_t max_staleness,
                                                 std::optional<std::uint32_t> fixed_delay) {
  const auto& sizes = testing::kPaperCnnTensorSizes;
  auto refuse = [&](const std::string& why) -> std::vector<transport::SparseUpdate> {
    std::fprintf(stderr, "edgetrain-apply-bench: --replay %s: %s\n", path.c_str(), why.c_str());
    std::exit(2);
  };
  server::WalContents wal;
  try {
    wal = server::read_wal(path);
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
  if (!wal.damage.empty())
    return refuse("damaged in the middle (edgetrain-server repair-wal lists it)");
  const transport::ModelLayout layout{wal.header.model_id, sizes};
  std::vector<transport::SparseUpdate> stream;
  for (const server::WalRecord& record : wal.records) {
    if (stream.size() >= limit) break;
    auto decoded = transport::decode_sparse_update(record.update, layout);
    if (!decoded)
      return refuse("record of version " + std::to_string(record.version) +
                    " is no paper-CNN update: " + decoded.error().message);
    transport::SparseUpdate update = std::move(decoded).value();
    if (update.tensors.empty()) continue;  // repair-wal's stand-ins
    const std::uint64_t recorded =
        record.version - 1 - std::min(update.fetched_version, record.version - 1);
    const std::uint64_t delay =
        std::min<std::uint64_t>(fixed_delay.value_or(recorded), max_staleness);
    const auto u = static_cast<std::uint64_t>(stream.size());
    update.model_id = 1;
    update.fetched_version = u - std::min(delay, u);
    stream.push_back(std::move(update));
  }
  if (stream.empty()) return refuse("no updates in it");
  return stream;
}

// Applies the whole stream to a fresh store per iteration (every update must apply).
void apply_stream(benchmark::State& state, const std::vector<transport::SparseUpdate>& stream,
                  server::ParameterStoreOptions options, const std::string& description) {
  state.SetLabel(description);
  const auto& sizes = testing::kPaperCnnTensorSizes;
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  double divisor_sum = 0, entries = 0;
  bool refused = false;
  for (auto _ : state) {
    state.PauseTiming();
    server::ParameterStore store(1, sizes, std::vector<float>(total, 0.0f), options);
    divisor_sum = entries = 0;
    state.ResumeTiming();
    for (const auto& update : stream) {
      if (!store.apply(update).applied()) {
        refused = true;
        break;
      }
      for (auto d : store.last_divisors()) divisor_sum += d;
      entries += static_cast<double>(store.last_divisors().size());
    }
    if (refused) {
      state.SkipWithError("an update was refused");
      break;
    }
  }
  state.counters["s_per_update"] = benchmark::Counter(
      static_cast<double>(stream.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["mean_divisor"] = divisor_sum / entries;
}

// The server's path (group commit): the stream reserved `group` updates at a time, then
// applied in order, as ServerState does while a WAL sync runs (every update must apply).
void reserve_stream(benchmark::State& state, const std::vector<transport::SparseUpdate>& stream,
                    server::ParameterStoreOptions options, std::size_t group,
                    const std::string& description) {
  state.SetLabel(description + ", " + std::to_string(group) + " reserved per sync");
  const auto& sizes = testing::kPaperCnnTensorSizes;
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  for (auto _ : state) {
    state.PauseTiming();
    server::ParameterStore store(1, sizes, std::vector<float>(total, 0.0f), options);
    state.ResumeTiming();
    for (std::size_t first = 0; first < stream.size(); first += group) {
      const std::size_t end = std::min(stream.size(), first + group);
      for (std::size_t u = first; u < end; ++u) {
        if (!store.reserve(stream[u]).applied()) {
          state.SkipWithError("an update was refused");
          return;
        }
      }
      while (store.reserved() > 0) store.apply_reserved();
    }
  }
  state.counters["s_per_update"] = benchmark::Counter(
      static_cast<double>(stream.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  edgetrain::settings::Table table(
      "edgetrain-apply-bench",
      "Parameter-store apply per update on the paper CNN, per staleness rule");
  int updates = 3000;
  double rate = 0.01;
  std::uint32_t max_staleness = 64;
  table.add("updates", updates, "updates per run").range(1, 1000000);
  table.add("rate", rate, "compression rate c").range(1e-6, 1.0);
  std::uint64_t group = 8;
  table
      .add("group", group,
           "updates reserved per WAL sync in the reserve/ runs (the server's group commit)")
      .range(1, 1000);
  table.add("max-staleness", max_staleness, "D; delays are drawn from 0..D").range(1, 100000);
  std::string replay;
  table.add("replay", replay,
            "a server's WAL of real paper-CNN updates (tests/bench/record_updates.sh): its first "
            "--updates records, with their recorded delays, instead of the synthetic stream");
  std::uint32_t delay = 0;
  table
      .add("delay", delay,
           "with --replay: this delay for every update instead of the recorded ones (default: as "
           "recorded)")
      .range(0, 100000);
  if (const auto status = table.parse(argc, argv)) return *status;
  const std::optional<std::uint32_t> fixed_delay =
      table.was_set("delay") ? std::optional<std::uint32_t>(delay) : std::nullopt;

  const auto stream =
      replay.empty()
          ? make_stream(testing::kPaperCnnTensorSizes, updates, rate, max_staleness)
          : read_stream(replay, static_cast<std::size_t>(updates), max_staleness, fixed_delay);
  std::size_t entries = 0;
  for (const auto& t : stream.back().tensors) entries += t.indices.size();
  if (replay.empty())
    std::printf("paper CNN, %d updates of ~%zu entries (c = %g), delays 0..%u\n", updates, entries,
                rate, max_staleness);
  else
    std::printf("paper CNN, %zu updates of ~%zu entries replayed from %s, delays %s (at most %u)\n",
                stream.size(), entries, replay.c_str(),
                fixed_delay ? std::to_string(*fixed_delay).c_str() : "as recorded", max_staleness);
  for (const auto& variant : testing::staleness_rules()) {
    server::ParameterStoreOptions options;
    options.max_staleness = max_staleness;
    options.rule = variant.setting;
    benchmark::RegisterBenchmark(("apply/" + variant.name).c_str(), [&stream, options, &variant](
                                                                        benchmark::State& state) {
      apply_stream(state, stream, options, variant.description);
    })->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("reserve/" + variant.name).c_str(), [&stream, options, &variant,
                                                                       group](
                                                                          benchmark::State& state) {
      reserve_stream(state, stream, options, group, variant.description);
    })->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
