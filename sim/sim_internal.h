// What the simulator's modes share and nothing outside sim/ needs: the seeded random
// numbers, the model checked against the data, a worker's shard, and the test accuracy of a
// parameter vector. Kept out of simulator.h so the asynchronous, rounds and gossip
// simulations draw and evaluate the same way without copies of each other.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/dataset.h"
#include "model/model.h"
#include "common/splitmix64.h"
#include "model/trainer.h"

namespace edgetrain::sim {

// splitmix64 with Box-Muller: the same numbers on every platform for a seed.
class Random {
 public:
  explicit Random(std::uint64_t seed) : generator_{seed} {}
  double uniform() { return generator_.uniform_double(); }  // [0, 1)
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Mean 1 whatever sigma (the −σ²/2 shift), so a jittered step time keeps its mean.
  double log_normal(double sigma) {
    return sigma > 0 ? std::exp(sigma * normal() - 0.5 * sigma * sigma) : 1.0;
  }
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }

 private:
  runtime::SplitMix64 generator_;
};

// The model named by `model_name` (built-in name or spec), checked against the data's image
// shape and classes, initialised from `seed`, or loaded from `init_from` when it names a
// safetensors file. Throws runtime::ModelError when it does not fit (or the file does not hold
// exactly the model's tensors), std::invalid_argument when there are fewer training examples
// than `workers`.
runtime::Model checked_model(const std::string& model_name, int workers, std::uint64_t seed,
                             const runtime::Dataset& train, const runtime::Dataset& test,
                             const std::string& init_from = {});

// Worker `worker`'s shard of `train` among `workers` (model/dataset.h's samplers): i.i.d.,
// or label-skewed. Throws std::invalid_argument for an empty shard.
std::vector<std::uint32_t> worker_shard(const runtime::Dataset& train, int worker, int workers,
                                        std::uint64_t seed, bool label_skewed,
                                        const runtime::LabelSkew& skew);

struct TestScore {
  double accuracy = 0;
  double loss = 0;  // mean cross-entropy
};

// Accuracy and loss of `parameters` on the first `count` examples of `data` (or on the
// examples listed in `indices`), in batches of the evaluator's max batch.
TestScore evaluate_parameters(runtime::Trainer& evaluator, std::span<const float> parameters,
                              const runtime::Dataset& data, std::size_t count);
TestScore evaluate_parameters(runtime::Trainer& evaluator, std::span<const float> parameters,
                              const runtime::Dataset& data, std::span<const std::uint32_t> indices);

}  // namespace edgetrain::sim
