// Offline training (issue 38 part 1): what an asynchronous worker keeps while its server is
// unreachable. Ours, not the AdaComp paper's, whose worker has nothing to do without its
// server.
//
// The choice: local SGD from the last model held, W_0 (the server's model at version V).
// Each local step computes g_j on the local copy W_j and moves it, W_{j+1} = W_j − lr·g_j,
// and the accumulator keeps the sum S = Σ g_j. When the server answers again, S goes
// through the worker's compressor (same rate, same residual) as ONE update with fetched
// version V. The server applies it as any update, W ← W − lr_server·S_sent / σ, so with
// lr = the server's learning rate the update carries the local trajectory's delta
// (W_0 − W_N = lr·S), scaled down by the server's staleness rule for the updates others
// made meanwhile, or refused as too stale. Plain Σ g at the fixed W_0 (a large minibatch)
// was the alternative; it makes no progress along the way, so N steps offline would be
// worth one step online.
//
// Allocates two arena-sized buffers (the local copy and S) at the first begin() and keeps
// them (3.4 MB for the paper CNN); add_step() allocates nothing. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace edgetrain::runtime {

class OfflineAccumulator {
 public:
  // `learning_rate`: the local SGD step (> 0; throws std::invalid_argument otherwise).
  explicit OfflineAccumulator(float learning_rate);

  // Starts a new accumulation from `parameters`, the model at `version`: the local copy is
  // set to them, the sum to zero. Throws std::logic_error while steps are buffered (they
  // would be lost: hand them over with take() first).
  void begin(std::span<const float> parameters, std::uint64_t version);
  bool started() const { return started_; }

  // What the next local step computes its gradient on.
  std::span<const float> local_parameters() const { return local_; }

  // One local step's gradient (arena-sized): S += g, local −= lr·g. Returns false, changing
  // nothing, when g has a value that is not finite or would make S or the local copy not
  // finite (a diverged step must not be sent). Throws std::invalid_argument on a wrong
  // length.
  bool add_step(std::span<const float> gradient);

  std::uint64_t steps() const { return steps_; }           // buffered since begin()
  std::uint64_t from_version() const { return version_; }  // V, what the steps started from
  std::span<const float> sum() const { return sum_; }      // S (zero after begin())
  float learning_rate() const { return learning_rate_; }

  // Ends the accumulation (after S was compressed into an update): no steps buffered,
  // started() false. The buffers are kept for the next one.
  void clear();

 private:
  float learning_rate_;
  bool started_ = false;
  std::uint64_t steps_ = 0;
  std::uint64_t version_ = 0;
  std::vector<float> local_;
  std::vector<float> sum_;
};

// The compression rate of an update that carries `steps` offline steps (the worker's
// --offline-max-rate; ours): c·s, at least the online c and at most max(c, max_rate), so
// that the sum keeps what the steps would have sent one by one; max_rate 0: the online c.
// The worker and the simulator both take it from here.
double offline_compression_rate(double online_rate, std::uint64_t steps, double max_rate);

}  // namespace edgetrain::runtime
