// Compressor: exact top-k against a sort-based reference (ties included), the paper's k
// rule, dense ASGD, error-feedback conservation, bin-local selection against a direct
// reading of its rule, and that what comes out is something the codec will send; and for
// every setting of tests/support/compressor_variants.h, the properties all settings share.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "worker/compressor.h"
#include "tests/support/compressor_variants.h"

using namespace edgetrain::runtime;
using edgetrain::transport::SparseUpdate;

namespace {

const std::vector<std::uint32_t>& kPaperSizes = edgetrain::testing::kPaperCnnTensorSizes;

std::vector<TensorSlice> layout_of(const std::vector<std::uint32_t>& sizes) {
  std::vector<TensorSlice> layout;
  std::size_t offset = 0;
  for (auto n : sizes) {
    layout.push_back({offset, n});
    offset += n;
  }
  return layout;
}

std::size_t total(const std::vector<std::uint32_t>& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
}

// Values on a coarse grid of multiples of 1/8 so that ties are frequent and sums exact.
std::vector<float> grid_gradient(std::size_t n, std::mt19937& rng, int levels = 9) {
  std::vector<float> g(n);
  for (auto& v : g)
    v = static_cast<float>(static_cast<int>(rng() % (2 * levels + 1)) - levels) / 8.0f;
  return g;
}

// Top-k by sorting everything: |v| descending, index ascending on ties.
std::vector<std::uint32_t> reference_top_k(std::span<const float> v, std::uint32_t k) {
  std::vector<std::uint32_t> order(v.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](auto a, auto b) { return std::fabs(v[a]) > std::fabs(v[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

TEST(TopKCount, FollowsThePaperRule) {
  // max(1, floor(n·0.01)) for the paper CNN, worked by hand.
  const std::vector<std::uint32_t> expected = {2, 1, 184, 1, 4014, 1, 12, 1};
  for (std::size_t i = 0; i < kPaperSizes.size(); ++i)
    EXPECT_EQ(Compressor::top_k_count(kPaperSizes[i], 0.01), expected[i]);
  EXPECT_EQ(Compressor::top_k_count(1, 0.01), 1u);
  EXPECT_EQ(Compressor::top_k_count(1000, 1.0), 1000u);
  EXPECT_EQ(Compressor::top_k_count(1000, 0.5), 500u);
  EXPECT_EQ(Compressor::top_k_count(199, 0.01), 1u);
  EXPECT_EQ(Compressor::top_k_count(200, 0.01), 2u);
}

TEST(Compressor, TopKMatchesSortReferenceIncludingTies) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::uint32_t> sizes;
    for (int t = 0; t < 1 + static_cast<int>(rng() % 4); ++t) sizes.push_back(1 + rng() % 2000);
    const double rate = std::vector<double>{0.001, 0.01, 0.1, 0.37, 1.0}[rng() % 5];
    const int levels = trial % 2 ? 2 : 1000;  // many ties, or few
    CompressorOptions options;
    options.compression_rate = rate;
    Compressor compressor(layout_of(sizes), options);
    auto g = grid_gradient(total(sizes), rng, levels);
    SparseUpdate update;
    compressor.compress(g, update);
    ASSERT_EQ(update.tensors.size(), sizes.size());
    std::size_t offset = 0;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      std::span<const float> tensor(g.data() + offset, sizes[t]);
      const auto k = Compressor::top_k_count(sizes[t], rate);
      const auto expected = reference_top_k(tensor, k);
      ASSERT_EQ(update.tensors[t].tensor, t);
      ASSERT_EQ(update.tensors[t].size, sizes[t]);
      ASSERT_EQ(update.tensors[t].indices, expected) << "trial " << trial << " tensor " << t;
      for (std::size_t j = 0; j < k; ++j)
        EXPECT_EQ(update.tensors[t].values[j], tensor[expected[j]]);
      offset += sizes[t];
    }
    // The paper's method keeps nothing.
    EXPECT_TRUE(std::all_of(compressor.residual().begin(), compressor.residual().end(),
                            [](float r) { return r == 0.0f; }));
  }
}

TEST(Compressor, OutputIsAcceptedByTheCodec) {
  std::mt19937 rng(2);
  Compressor compressor(layout_of(kPaperSizes));
  auto g = grid_gradient(total(kPaperSizes), rng, 1000);
  SparseUpdate update;
  update.model_id = 7;
  compressor.compress(g, update);
  auto bytes = edgetrain::transport::encode_sparse_update(update);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  auto back = edgetrain::transport::decode_sparse_update(bytes.value(), {7, kPaperSizes});
  ASSERT_TRUE(back.ok()) << back.error().message;
  std::size_t sent = 0;
  for (const auto& t : back.value().tensors) sent += t.indices.size();
  EXPECT_EQ(sent, 2u + 1 + 184 + 1 + 4014 + 1 + 12 + 1);
}

TEST(Compressor, DenseSendsEveryEntry) {
  std::mt19937 rng(3);
  const std::vector<std::uint32_t> sizes = {5, 1, 300};
  CompressorOptions options;
  options.method = CompressionMethod::kNone;
  Compressor compressor(layout_of(sizes), options);
  auto g = grid_gradient(total(sizes), rng);
  SparseUpdate update;
  compressor.compress(g, update);
  std::size_t offset = 0;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    ASSERT_EQ(update.tensors[t].indices.size(), sizes[t]);
    for (std::uint32_t i = 0; i < sizes[t]; ++i) {
      EXPECT_EQ(update.tensors[t].indices[i], i);
      EXPECT_EQ(update.tensors[t].values[i], g[offset + i]);
    }
    offset += sizes[t];
  }
}

// Adds what `update` sends into `sum` (arena layout).
void scatter_add(const SparseUpdate& update, const std::vector<TensorSlice>& layout,
                 std::vector<double>& sum) {
  for (const auto& t : update.tensors)
    for (std::size_t j = 0; j < t.indices.size(); ++j)
      sum[layout[t.tensor].offset + t.indices[j]] += t.values[j];
}

// With residuals, nothing is lost: everything sent plus what is left equals every gradient
// summed. Grid values keep all float arithmetic exact, so the check is equality.
void expect_conservation(CompressorOptions options, int steps) {
  std::mt19937 rng(4);
  const std::vector<std::uint32_t> sizes = {288, 32, 1000, 10};
  const auto layout = layout_of(sizes);
  Compressor compressor(layout, options);
  std::vector<double> gradients(total(sizes), 0.0), sent(total(sizes), 0.0);
  SparseUpdate update;
  std::size_t sent_entries = 0;
  for (int step = 0; step < steps; ++step) {
    auto g = grid_gradient(total(sizes), rng);
    for (std::size_t i = 0; i < g.size(); ++i) gradients[i] += g[i];
    compressor.compress(g, update);
    scatter_add(update, layout, sent);
    for (const auto& t : update.tensors) sent_entries += t.indices.size();
  }
  for (std::size_t i = 0; i < gradients.size(); ++i)
    ASSERT_EQ(sent[i] + compressor.residual()[i], gradients[i]) << "entry " << i;
  // And it did leave entries out (top-k sends a fixed share; bin-local's share depends on
  // the data and is large for this uniform noise).
  EXPECT_LT(sent_entries, static_cast<std::size_t>(steps) * total(sizes));
  if (options.method == CompressionMethod::kTopK) {
    std::size_t per_step = 0;
    for (auto n : sizes) per_step += Compressor::top_k_count(n, options.compression_rate);
    EXPECT_EQ(sent_entries, per_step * static_cast<std::size_t>(steps));
  }
  EXPECT_GT(sent_entries, 0u);
}

TEST(Compressor, ErrorFeedbackConservesTheGradientSum) {
  CompressorOptions options;
  options.error_feedback = true;
  expect_conservation(options, 30);
  options.compression_rate = 0.1;
  expect_conservation(options, 30);
}

TEST(Compressor, BinLocalConservesTheGradientSum) {
  CompressorOptions options;
  options.method = CompressionMethod::kBinLocal;
  expect_conservation(options, 30);
  options.bin_size = 7;
  expect_conservation(options, 30);
}

TEST(Compressor, Fp16RoundingErrorIsFedBack) {
  // Values that fp16 cannot hold exactly, accumulated with error feedback: the rounding
  // error stays in the residual, so sent + residual still equals the float sum.
  const std::vector<std::uint32_t> sizes = {64};
  CompressorOptions options;
  options.error_feedback = true;
  options.value_encoding = edgetrain::transport::ValueEncoding::kFp16;
  options.compression_rate = 0.25;
  Compressor compressor(layout_of(sizes), options);
  std::vector<float> g(64);
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = 1.0f + static_cast<float>(i) * std::ldexp(1.0f, -18);  // below fp16 resolution
  SparseUpdate update;
  compressor.compress(g, update);
  for (std::size_t j = 0; j < update.tensors[0].indices.size(); ++j) {
    const auto i = update.tensors[0].indices[j];
    EXPECT_EQ(update.tensors[0].values[j], edgetrain::transport::round_to_fp16(g[i]));
    EXPECT_EQ(update.tensors[0].values[j] + compressor.residual()[i], g[i]);
  }
}

// Sign + scale: the entries top-k would send (minus exact zeros), each as ±(their mean |v|).
TEST(Compressor, SignScaleSendsPlusOrMinusTheMeanMagnitude) {
  std::mt19937 rng(6);
  const std::vector<std::uint32_t> sizes = {288, 32, 1000, 10};
  const auto layout = layout_of(sizes);
  for (auto method : {CompressionMethod::kTopK, CompressionMethod::kBinLocal}) {
    CompressorOptions plain;
    plain.method = method;
    plain.compression_rate = 0.05;
    CompressorOptions signs = plain;
    signs.value_encoding = edgetrain::transport::ValueEncoding::kSignScale;
    Compressor reference(layout, plain), compressor(layout, signs);
    SparseUpdate expected, update;
    for (int step = 0; step < 3; ++step) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> g(total(sizes));
      for (auto& v : g) v = rng() % 5 == 0 ? 0.0f : normal(rng);  // zeros: some get selected
      reference.compress(g, expected);
      compressor.compress(g, update);
      if (method == CompressionMethod::kBinLocal) break;  // the residuals differ from here on
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        const auto& want = expected.tensors[t];
        const auto& got = update.tensors[t];
        std::vector<std::uint32_t> nonzero;
        double sum = 0.0;
        for (std::size_t j = 0; j < want.indices.size(); ++j)
          if (want.values[j] != 0.0f) {
            nonzero.push_back(want.indices[j]);
            sum += std::fabs(want.values[j]);
          }
        ASSERT_EQ(got.indices, nonzero) << "tensor " << t;
        if (nonzero.empty()) continue;
        const float scale = static_cast<float>(sum / static_cast<double>(nonzero.size()));
        ASSERT_GT(scale, 0.0f);
        for (std::size_t j = 0, w = 0; j < got.indices.size(); ++j, ++w) {
          while (want.indices[w] != got.indices[j]) ++w;
          EXPECT_EQ(got.values[j], want.values[w] < 0 ? -scale : scale)
              << "tensor " << t << " index " << got.indices[j];
        }
      }
      // What it sends is what the sign + scale encoding carries, bit for bit.
      auto bytes = edgetrain::transport::encode_sparse_update(
          update, {edgetrain::transport::ValueEncoding::kSignScale});
      ASSERT_TRUE(bytes.ok()) << bytes.error().message;
      auto back = edgetrain::transport::decode_sparse_update(bytes.value(), {0, sizes});
      ASSERT_TRUE(back.ok()) << back.error().message;
      for (std::size_t t = 0; t < sizes.size(); ++t)
        EXPECT_EQ(back.value().tensors[t].values, update.tensors[t].values);
    }
  }
}

TEST(Compressor, SignScaleErrorIsFedBackExactly) {
  // Grid values (multiples of 1/8) and power-of-two k per tensor keep every mean and every
  // v − sign(v)·s exact for a few steps, so sent + residual equals the gradients' sum in
  // exact arithmetic. (Bin-local's k depends on the data, so its means are not exact:
  // SignScaleFeedsTheErrorBackOverManySteps covers it.)
  const std::vector<std::uint32_t> sizes = {256, 32, 1024, 4};
  const auto layout = layout_of(sizes);
  {
    std::mt19937 rng(7);
    CompressorOptions options;
    options.error_feedback = true;
    options.compression_rate = 1.0 / 64;  // k = 4, 1 (at least one), 16, 1
    options.value_encoding = edgetrain::transport::ValueEncoding::kSignScale;
    Compressor compressor(layout, options);
    std::vector<double> gradients(total(sizes), 0.0), sent(total(sizes), 0.0);
    SparseUpdate update;
    std::vector<float> residual_before(total(sizes), 0.0f);
    for (int step = 0; step < 4; ++step) {
      auto g = grid_gradient(total(sizes), rng);
      for (std::size_t i = 0; i < g.size(); ++i) gradients[i] += g[i];
      compressor.compress(g, update);
      scatter_add(update, layout, sent);
      // Per step, per sent entry: residual + sent == residual before + gradient.
      for (const auto& t : update.tensors)
        for (std::size_t j = 0; j < t.indices.size(); ++j) {
          const std::size_t a = layout[t.tensor].offset + t.indices[j];
          EXPECT_EQ(double{compressor.residual()[a]} + double{t.values[j]},
                    double{residual_before[a] + g[a]})
              << "step " << step << " entry " << a;
          EXPECT_EQ(std::fabs(t.values[j]), std::fabs(t.values[0]));
        }
      std::copy(compressor.residual().begin(), compressor.residual().end(),
                residual_before.begin());
    }
    for (std::size_t i = 0; i < gradients.size(); ++i)
      ASSERT_EQ(sent[i] + compressor.residual()[i], gradients[i]) << "entry " << i;
  }
}

TEST(Compressor, SignScaleFeedsTheErrorBackOverManySteps) {
  // Ordinary float gradients: v − sign(v)·s and residual + g are rounded float operations,
  // so over 50 steps sent + residual stays within float rounding of the gradients' sum.
  const std::vector<std::uint32_t> sizes = {288, 32, 18432, 64};
  const auto layout = layout_of(sizes);
  for (auto method : {CompressionMethod::kTopK, CompressionMethod::kBinLocal}) {
    std::mt19937 rng(8);
    CompressorOptions options;
    options.method = method;
    options.error_feedback = true;
    options.value_encoding = edgetrain::transport::ValueEncoding::kSignScale;
    Compressor compressor(layout, options);
    std::vector<double> gradients(total(sizes), 0.0), sent(total(sizes), 0.0);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    SparseUpdate update;
    for (int step = 0; step < 50; ++step) {
      std::vector<float> g(total(sizes));
      for (auto& v : g) v = normal(rng);
      for (std::size_t i = 0; i < g.size(); ++i) gradients[i] += g[i];
      compressor.compress(g, update);
      scatter_add(update, layout, sent);
    }
    for (std::size_t i = 0; i < gradients.size(); ++i)
      ASSERT_NEAR(sent[i] + compressor.residual()[i], gradients[i],
                  1e-4 * (1.0 + std::fabs(gradients[i])))
          << "method " << static_cast<int>(method) << " entry " << i;
  }
}

TEST(Compressor, BinLocalSelectsByTheBinRule) {
  std::mt19937 rng(5);
  const std::vector<std::uint32_t> sizes = {1000, 37};
  const auto layout = layout_of(sizes);
  CompressorOptions options;
  options.method = CompressionMethod::kBinLocal;
  options.bin_size = 50;
  Compressor compressor(layout, options);
  std::vector<float> residual(total(sizes), 0.0f);
  SparseUpdate update;
  for (int step = 0; step < 5; ++step) {
    auto g = grid_gradient(total(sizes), rng, 50);
    compressor.compress(g, update);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const auto& sent = update.tensors[t].indices;
      for (std::size_t start = 0; start < sizes[t]; start += options.bin_size) {
        const std::size_t end = std::min<std::size_t>(sizes[t], start + options.bin_size);
        float bin_max = 0.0f;
        for (std::size_t i = start; i < end; ++i)
          bin_max = std::max(bin_max,
                             std::fabs(residual[layout[t].offset + i] + g[layout[t].offset + i]));
        for (std::size_t i = start; i < end; ++i) {
          const std::size_t a = layout[t].offset + i;
          const float accumulated = residual[a] + g[a];
          const bool expect_sent = accumulated != 0.0f && std::fabs(accumulated + g[a]) >= bin_max;
          const bool was_sent =
              std::binary_search(sent.begin(), sent.end(), static_cast<std::uint32_t>(i));
          ASSERT_EQ(was_sent, expect_sent) << "step " << step << " tensor " << t << " index " << i;
          residual[a] = was_sent ? 0.0f : accumulated;
        }
      }
    }
  }
}

TEST(Compressor, RefusesBadInput) {
  Compressor compressor(layout_of({10, 10}));
  SparseUpdate update;
  std::vector<float> short_gradient(19, 0.0f);
  EXPECT_THROW(compressor.compress(short_gradient, update), std::invalid_argument);
  std::vector<float> g(20, 1.0f);
  g[13] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(compressor.compress(g, update), std::invalid_argument);
  g[13] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(compressor.compress(g, update), std::invalid_argument);
  CompressorOptions zero_rate;
  zero_rate.compression_rate = 0.0;
  EXPECT_THROW(Compressor(layout_of({10}), zero_rate), std::invalid_argument);
  EXPECT_THROW(Compressor(layout_of({10, 0})), std::invalid_argument);
}

// What every setting of the shared list must do, on the paper CNN's tensors over a few
// steps of Gaussian gradients (no exact zeros, so sign + scale leaves nothing out): one
// entry per tensor in layout order with increasing indices in range, the paper's k for
// top-k and every entry for dense, values that the setting's wire encoding carries bit for
// bit, and nothing lost: with a residual, sent + residual is the sum of the gradients;
// without one, the residual stays zero and plain values are the gradient's own.
class EveryCompressorVariant
    : public ::testing::TestWithParam<edgetrain::testing::CompressorVariant> {};

TEST_P(EveryCompressorVariant, SendsWhatTheWireCarriesAndLosesNothing) {
  const CompressorOptions& options = GetParam().setting;
  const auto& sizes = kPaperSizes;
  const auto layout = layout_of(sizes);
  Compressor compressor(layout, options);
  const bool keeps_residual =
      options.error_feedback || options.method == CompressionMethod::kBinLocal;
  const bool plain_values = options.value_encoding == edgetrain::transport::ValueEncoding::kFp32;
  const edgetrain::transport::EncodeOptions encoding{edgetrain::testing::wire_encoding_of(options)};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<double> gradients(total(sizes), 0.0), sent(total(sizes), 0.0);
  SparseUpdate update;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(total(sizes));
    for (auto& v : g) v = normal(rng);
    for (std::size_t i = 0; i < g.size(); ++i) gradients[i] += g[i];
    compressor.compress(g, update);
    ASSERT_EQ(update.tensors.size(), sizes.size());
    for (std::uint32_t t = 0; t < sizes.size(); ++t) {
      const auto& tensor = update.tensors[t];
      ASSERT_EQ(tensor.tensor, t);
      ASSERT_EQ(tensor.size, sizes[t]);
      ASSERT_EQ(tensor.values.size(), tensor.indices.size());
      ASSERT_EQ(
          std::adjacent_find(tensor.indices.begin(), tensor.indices.end(), std::greater_equal<>()),
          tensor.indices.end())
          << "tensor " << t << ": indices not strictly increasing";
      ASSERT_TRUE(tensor.indices.empty() || tensor.indices.back() < sizes[t]) << "tensor " << t;
      if (options.method == CompressionMethod::kTopK) {
        EXPECT_EQ(tensor.indices.size(),
                  Compressor::top_k_count(sizes[t], options.compression_rate))
            << "tensor " << t;
      }
      if (options.method == CompressionMethod::kNone) {
        EXPECT_EQ(tensor.indices.size(), sizes[t]) << "tensor " << t;
      }
      if (!keeps_residual && plain_values) {
        for (std::size_t j = 0; j < tensor.indices.size(); ++j)
          ASSERT_EQ(tensor.values[j], g[layout[t].offset + tensor.indices[j]]) << "tensor " << t;
      }
    }
    auto bytes = edgetrain::transport::encode_sparse_update(update, encoding);
    ASSERT_TRUE(bytes.ok()) << bytes.error().message;
    auto back = edgetrain::transport::decode_sparse_update(bytes.value(), {0, sizes});
    ASSERT_TRUE(back.ok()) << back.error().message;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      EXPECT_EQ(back.value().tensors[t].indices, update.tensors[t].indices) << "tensor " << t;
      EXPECT_EQ(back.value().tensors[t].values, update.tensors[t].values) << "tensor " << t;
    }
    scatter_add(update, layout, sent);
  }
  const auto residual = compressor.residual();
  if (!keeps_residual) {
    // Nothing kept (the residual may be left unallocated), so everything selected was sent.
    EXPECT_TRUE(std::all_of(residual.begin(), residual.end(), [](float r) { return r == 0.0f; }));
    return;
  }
  ASSERT_EQ(residual.size(), gradients.size());
  for (std::size_t i = 0; i < gradients.size(); ++i)
    ASSERT_NEAR(sent[i] + residual[i], gradients[i], 1e-5 * (1.0 + std::fabs(gradients[i])))
        << "entry " << i;
}

INSTANTIATE_TEST_SUITE_P(CompressorVariants, EveryCompressorVariant,
                         ::testing::ValuesIn(edgetrain::testing::compressor_variants()),
                         edgetrain::testing::VariantName());

}  // namespace
