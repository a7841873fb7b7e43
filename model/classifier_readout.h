// What a trained classifier says about images, for judging a generator (issue 16): class
// probabilities and the features its last layer sees, then the two scores the MD-GAN paper
// reports, computed with that classifier:
//   MNIST score      the Inception score with an MNIST classifier: exp(E_x KL(p(y|x) ‖ p(y)))
//                    over the samples (1 when the classifier cannot tell them apart, 10 for
//                    confident, evenly spread digits)
//   Fréchet distance between the Gaussians fitted to two sets of features (FID's formula on the
//                    classifier's penultimate layer): |μa − μb|² + Tr(Σa + Σb − 2 (Σa^½ Σb Σa^½)^½)
// The readout runs the model's layers with the reference kernels (the same definition the
// trainer's ops are tested against), in batches, allocation-free after construction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace edgetrain::runtime {

class ClassifierReadout {
 public:
  // `model` must outlive the readout; its last layer is a fully connected layer (the logits).
  explicit ClassifierReadout(const Model& model, int max_batch = 64);
  int classes() const { return model_.num_classes(); }
  int feature_size() const { return feature_size_; }
  // probs [count][classes()] and features [count][feature_size()]; either may be null.
  // `pixels` holds raw grey values (0..255), standardized per image as the trainer does.
  void read(std::span<const float> params, const std::uint8_t* pixels, int count, float* probs,
            float* features);

 private:
  const Model& model_;
  int max_batch_, feature_size_ = 0;
  std::vector<std::vector<float>> buffers_;  // one per layer output, [max_batch][size]
  std::vector<float> input_;
  std::vector<std::uint32_t> argmax_;
  std::vector<float> group_mean_, group_invstd_;  // groupnorm's statistics, [max_batch][G]
};

// A generator's samples judged by a trained classifier, as the MD-GAN paper scores them: the
// MNIST score, the Fréchet distance of the classifier's features to those of `reference`
// images (the test set's first ones), and the share of samples the classifier reads as the
// class they were conditioned on. Used by edgetrain-gan and the server's GAN mode.
struct GanScores {
  double mnist_score = 0, frechet_distance = 0, conditional_accuracy = 0;
};
class GanJudge {
 public:
  // `classifier` (with its trained parameters) is copied. Features of the first
  // `reference_count` images of `reference` are computed here, once.
  GanJudge(const Model& classifier, const std::uint8_t* reference_pixels, int reference_count);
  // `count` ≥ 2 samples (raw grey values) and the classes they were conditioned on.
  GanScores score(const std::uint8_t* pixels, const std::int32_t* labels, int count);

 private:
  Model model_;
  ClassifierReadout readout_;
  std::vector<float> reference_features_, probs_, features_;
};

// exp of the mean KL divergence of each row of probs [count][classes] from their mean.
double mnist_score(const float* probs, int count, int classes);

// The Fréchet distance between the Gaussians fitted (mean, sample covariance) to two sets of
// `dim`-dimensional rows. Throws std::invalid_argument for fewer than two rows in a set.
double frechet_distance(const float* a, int count_a, const float* b, int count_b, int dim);

// Eigenvalues and eigenvectors of a symmetric matrix (row-major, n × n) by cyclic Jacobi
// rotations: `values` [n], `vectors` [n][n] with eigenvector j in column j.
void symmetric_eigen(std::vector<double> matrix, int n, std::vector<double>& values,
                     std::vector<double>& vectors);

}  // namespace edgetrain::runtime
