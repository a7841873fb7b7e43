// What answering one GET /model?since=V costs the server on the paper CNN: the exact model
// delta (ParameterStore::last_changed(), transport::encode_changes_since: what
// edgetrain-server serves by default) against the cheap pull (server/replica_records.h,
// --pull-fraction), on the same pulls, timed one after the other for each pull (paired).
//
// The stream: N workers take turns (round robin); each posts an AdaComp-like update (per
// tensor ⌊n·c⌋ entries, at least one, half of them in a hot 5 % of the tensor; values 1e-3)
// computed from the version it holds, the store applies it, and the same worker pulls: once
// exactly since its exact copy's version, once from its cheap-pull record. Each worker's
// first pull is dense in both and not timed. Prints the mean CPU time and bytes per pull of
// each, and their ratio. Host trees only; a program that prints figures, not a test.
//   edgetrain-pull-bench [--workers N] [--updates U] [--rate C] [--fraction F] [--min-entries M]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "common/settings.h"
#include "server/model_changes.h"
#include "server/parameter_store.h"
#include "server/replica_records.h"
#include "tests/support/paper_cnn_tensor_sizes.h"
#include "transport/codec.h"

using namespace edgetrain;

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

transport::SparseUpdate make_update(std::mt19937_64& rng, const std::vector<std::uint32_t>& sizes,
                                    double rate, std::uint64_t sequence, std::uint64_t fetched) {
  transport::SparseUpdate update;
  update.model_id = 1;
  update.sequence = sequence;
  update.fetched_version = fetched;
  for (std::uint32_t t = 0; t < sizes.size(); ++t) {
    transport::SparseTensor tensor{t, sizes[t], {}, {}};
    const auto k = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(sizes[t] * rate));
    const std::uint32_t hot = std::max<std::uint32_t>(1, sizes[t] / 20);
    for (std::uint32_t j = 0; j < k; ++j)
      tensor.indices.push_back(static_cast<std::uint32_t>(rng() % 2 ? rng() % hot : rng() % sizes[t]));
    std::sort(tensor.indices.begin(), tensor.indices.end());
    tensor.indices.erase(std::unique(tensor.indices.begin(), tensor.indices.end()), tensor.indices.end());
    tensor.values.assign(tensor.indices.size(), 1e-3f);
    update.tensors.push_back(std::move(tensor));
  }
  return update;
}

}  // namespace

int main(int argc, char** argv) {
  settings::Table table("edgetrain-pull-bench",
                        "Server CPU per GET /model?since=V on the paper CNN: exact model deltas "
                        "against the cheap pull, on the same pulls");
  std::uint32_t workers = 10, updates = 2000, min_entries = 4096;
  double rate = 0.01, fraction = 0.004;
  table.add("workers", workers, "workers taking turns, each pulling after its update").range(1, 10000);
  table.add("updates", updates, "updates (and timed pulls) in the run").range(1, 1000000);
  table.add("rate", rate, "compression rate c of the updates").range(1e-6, 1.0);
  table.add("fraction", fraction, "the cheap pull's --pull-fraction").range(1e-6, 1.0);
  table.add("min-entries", min_entries, "the cheap pull's --pull-min-entries").range(1, 1u << 30);
  if (const auto status = table.parse(argc, argv)) return *status;

  const auto& sizes = testing::kPaperCnnTensorSizes;
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  server::ParameterStoreOptions store_options;
  store_options.max_staleness = std::max<std::uint32_t>(64, 4 * workers);
  server::ParameterStore store(1, sizes, std::vector<float>(total, 0.0f), store_options);
  server::ReplicaRecords records(1, sizes, {{fraction, min_entries}, workers});
  std::vector<std::uint64_t> exact_version(workers, 0), cheap_version(workers, 0);
  std::vector<std::string> names;
  for (std::uint32_t w = 0; w < workers; ++w) {
    names.push_back("w" + std::to_string(w));
    records.pull(names[w], std::nullopt, store.parameters(), 0);  // the first, dense pull
  }
  std::mt19937_64 rng(42);
  double exact_seconds = 0, cheap_seconds = 0;
  std::uint64_t exact_bytes = 0, cheap_bytes = 0, exact_dense = 0, cheap_dense = 0;
  for (std::uint32_t u = 0; u < updates; ++u) {
    const std::uint32_t w = u % workers;
    const auto result = store.apply(make_update(rng, sizes, rate, u + 1, exact_version[w]));
    if (!result.applied()) {
      std::fprintf(stderr, "edgetrain-pull-bench: update %u was refused\n", u);
      return 1;
    }
    // The exact delta, as ServerState::encoded_model_since() builds it (the digest once per
    // version, as it caches it).
    double started = thread_cpu_seconds();
    transport::ChangeRecord change = server::served_changes(1, sizes, store, nullptr);
    change.digest = transport::parameter_digest(change.parameters);
    const auto exact = transport::encode_changes_since(change, exact_version[w]);
    exact_seconds += thread_cpu_seconds() - started;
    exact_bytes += exact ? exact->size() : transport::dense_model_bytes(sizes);
    exact_dense += exact ? 0 : 1;
    exact_version[w] = store.version();
    started = thread_cpu_seconds();
    const auto cheap = records.pull(names[w], cheap_version[w], store.parameters(), store.version());
    cheap_seconds += thread_cpu_seconds() - started;
    cheap_bytes += cheap.body ? cheap.body->size() : transport::dense_model_bytes(sizes);
    cheap_dense += cheap.body ? 0 : 1;
    cheap_version[w] = store.version();
  }
  std::printf("paper CNN (%zu parameters), %u workers, %u updates at c = %g, a pull after each\n",
              total, workers, updates, rate);
  std::printf("%-34s %14s %14s %12s\n", "", "CPU µs / pull", "bytes / pull", "dense pulls");
  std::printf("%-34s %14.0f %14.0f %12llu\n", "exact model delta", exact_seconds / updates * 1e6,
              static_cast<double>(exact_bytes) / updates, static_cast<unsigned long long>(exact_dense));
  std::printf("%-34s %14.0f %14.0f %12llu\n",
              ("cheap pull " + std::to_string(fraction) + ":" + std::to_string(min_entries)).c_str(),
              cheap_seconds / updates * 1e6, static_cast<double>(cheap_bytes) / updates,
              static_cast<unsigned long long>(cheap_dense));
  std::printf("cheap / exact: CPU %.2fx, bytes %.3fx\n", cheap_seconds / exact_seconds,
              static_cast<double>(cheap_bytes) / static_cast<double>(exact_bytes));
  return 0;
}
