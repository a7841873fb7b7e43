// Proves the train step does not touch the heap, both the paper CNN composed from the fast
// ops (tests/support) and runtime::Trainer on either backend, nor does the top-k
// compressor after its first call (every value option): this binary
// replaces the global operator new (counting every call), and XNNPACK's allocator counts
// its trips to the system (kernels/xnnpack_setup.h). After one warm-up step, whose
// recreated operators fill the recycling allocator, further steps must leave both unchanged.
#include <gtest/gtest.h>
#include <pthreadpool.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "kernels/xnnpack_setup.h"
#include "worker/compressor.h"
#include "model/model.h"
#include "model/filter_dropout.h"
#include "model/trainer.h"
#include "tests/support/paper_cnn.h"

namespace {
std::atomic<long> g_operator_new_calls{0};
}

void* operator new(std::size_t size) {
  g_operator_new_calls.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using edgetrain::testing::PaperCnn;

void expect_steps_do_not_allocate(pthreadpool_t pool) {
  const int B = 4;
  PaperCnn model(B, PaperCnn::Path::fast, pool);
  model.init_parameters(1);
  edgetrain::testing::SyntheticDigits data(2);
  std::vector<float> images(B * 784);
  std::vector<std::int32_t> labels(B);
  data.batch(images.data(), labels.data(), B);
  model.forward_backward(images.data(), labels.data(), nullptr);  // warm-up
  model.sgd_step(0.01f);

  const long new_before = g_operator_new_calls.load();
  const std::size_t xnn_before = edgetrain::kernels::xnnpack_system_allocations();
  for (int step = 0; step < 3; step++) {
    model.forward_backward(images.data(), labels.data(), nullptr);
    model.sgd_step(0.01f);
  }
  const long new_after = g_operator_new_calls.load();
  const std::size_t xnn_after = edgetrain::kernels::xnnpack_system_allocations();
  EXPECT_EQ(new_after, new_before) << "operator new called during train steps";
  EXPECT_EQ(xnn_after, xnn_before) << "XNNPACK asked the system for memory during train steps";
}

TEST(NoAllocation, CountersSeeAllocations) {
  // The instruments work: a vector allocates, and constructing a fast model creates operators.
  const long before = g_operator_new_calls.load();
  auto* v = new std::vector<int>(10);
  delete v;
  EXPECT_GE(g_operator_new_calls.load(), before + 2);
  const std::size_t xnn_before = edgetrain::kernels::xnnpack_system_allocations();
  { PaperCnn model(2, PaperCnn::Path::fast, nullptr); }
  EXPECT_GT(edgetrain::kernels::xnnpack_system_allocations(), xnn_before);
}

TEST(NoAllocation, PaperCnnTrainStepOnCallingThread) { expect_steps_do_not_allocate(nullptr); }

TEST(NoAllocation, PaperCnnTrainStepOnTwoThreads) {
  pthreadpool_t pool = pthreadpool_create(2);
  ASSERT_NE(pool, nullptr);
  expect_steps_do_not_allocate(pool);
  pthreadpool_destroy(pool);
}

using edgetrain::runtime::KernelBackend;

// Trainer::compute_gradient on the paper CNN after one warm-up call, with a full batch
// and a partial (zero-padded) one; with filter dropout when `drop_rates` is not empty
// (every step draws new filters, the shapes stay fixed).
void expect_trainer_steps_do_not_allocate(KernelBackend backend, pthreadpool_t pool,
                                          const std::vector<float>& drop_rates = {},
                                          const char* model_name = "paper-cnn") {
  const int max_batch = 4;
  edgetrain::runtime::Model model(edgetrain::runtime::model_spec_from_argument(model_name));
  model.initialize(1);
  edgetrain::runtime::Trainer trainer(model, max_batch, backend, pool);
  if (!drop_rates.empty()) {
    edgetrain::runtime::DropoutConfig dropout;
    dropout.conv_drop_rates = drop_rates;
    trainer.set_dropout(dropout);
  }
  std::vector<std::uint8_t> pixels(max_batch * model.input_shape().size());
  for (std::size_t i = 0; i < pixels.size(); i++) pixels[i] = static_cast<std::uint8_t>(i * 37);
  std::vector<std::int32_t> labels = {1, 7, 3, 0};
  std::vector<float> grad(model.parameter_count());
  trainer.compute_gradient(model.parameters(), pixels.data(), labels.data(), max_batch,
                           grad);  // warm-up
  // With dropout, evaluate() runs the full model's operators, which compute_gradient() did not
  // warm.
  if (!drop_rates.empty())
    trainer.evaluate(model.parameters(), pixels.data(), labels.data(), max_batch);

  const long new_before = g_operator_new_calls.load();
  const std::size_t xnn_before = edgetrain::kernels::xnnpack_system_allocations();
  for (int count : {max_batch, max_batch - 1, max_batch}) {
    trainer.compute_gradient(model.parameters(), pixels.data(), labels.data(), count, grad);
    trainer.evaluate(model.parameters(), pixels.data(), labels.data(), count);
  }
  EXPECT_EQ(g_operator_new_calls.load(), new_before)
      << "operator new called by Trainer::compute_gradient";
  EXPECT_EQ(edgetrain::kernels::xnnpack_system_allocations(), xnn_before)
      << "XNNPACK asked the system for memory during Trainer::compute_gradient";
}

TEST(NoAllocation, TrainerXnnpackOnCallingThread) {
  expect_trainer_steps_do_not_allocate(KernelBackend::kXnnpack, nullptr);
}

TEST(NoAllocation, TrainerXnnpackOnTwoThreads) {
  pthreadpool_t pool = pthreadpool_create(2);
  ASSERT_NE(pool, nullptr);
  expect_trainer_steps_do_not_allocate(KernelBackend::kXnnpack, pool);
  pthreadpool_destroy(pool);
}

TEST(NoAllocation, TrainerReference) {
  expect_trainer_steps_do_not_allocate(KernelBackend::kReference, nullptr);
}

// Issue 35's layers: mobilenet-mini (strided conv, depthwise and pointwise convs, global
// average pooling), and average pooling, serial and on two threads, on both backends.
constexpr const char* kAvgPoolSpec =
    "input 28x28x1; conv 8 3x3 stride 2 same relu; dwconv 3x3 same relu; conv 16 1x1 relu; "
    "avgpool 2; dwconv 3x3 stride 2 same; globalavgpool; dropout 0.2; fc 10";

TEST(NoAllocation, TrainerOnDepthwiseAndAveragePoolingLayers) {
  pthreadpool_t pool = pthreadpool_create(2);
  ASSERT_NE(pool, nullptr);
  for (const char* model : {"mobilenet-mini", kAvgPoolSpec}) {
    SCOPED_TRACE(model);
    expect_trainer_steps_do_not_allocate(KernelBackend::kXnnpack, nullptr, {}, model);
    expect_trainer_steps_do_not_allocate(KernelBackend::kXnnpack, pool, {}, model);
    expect_trainer_steps_do_not_allocate(KernelBackend::kReference, nullptr, {}, model);
  }
  pthreadpool_destroy(pool);
}

// Group and batch normalization (issue 35), on both backends: their statistics and scratch
// are made with the Trainer.
TEST(NoAllocation, TrainerOnNormalizationLayers) {
  const char* spec =
      "input 28x28x1; conv 8 3x3 stride 2 same; groupnorm 4 relu; conv 16 3x3 same; "
      "batchnorm relu; globalavgpool; fc 10";
  expect_trainer_steps_do_not_allocate(KernelBackend::kXnnpack, nullptr, {}, spec);
  expect_trainer_steps_do_not_allocate(KernelBackend::kReference, nullptr, {}, spec);
}

// Residual graphs (a skip's gradient summed through the trainer's scratch) and conv1d:
// resnet-8 and cnn1d, serial and on two threads, on both backends.
TEST(NoAllocation, TrainerOnResidualAndConv1dModels) {
  pthreadpool_t pool = pthreadpool_create(2);
  ASSERT_NE(pool, nullptr);
  for (const char* model : {"resnet-8", "cnn1d"}) {
    SCOPED_TRACE(model);
    expect_trainer_steps_do_not_allocate(KernelBackend::kXnnpack, nullptr, {}, model);
    expect_trainer_steps_do_not_allocate(KernelBackend::kXnnpack, pool, {}, model);
    expect_trainer_steps_do_not_allocate(KernelBackend::kReference, nullptr, {}, model);
  }
  pthreadpool_destroy(pool);
}

TEST(NoAllocation, TrainerWithFilterDropout) {
  expect_trainer_steps_do_not_allocate(KernelBackend::kXnnpack, nullptr, {0.5f, 0.25f});
  pthreadpool_t pool = pthreadpool_create(2);
  ASSERT_NE(pool, nullptr);
  expect_trainer_steps_do_not_allocate(KernelBackend::kXnnpack, pool, {0.75f, 0.5f});
  pthreadpool_destroy(pool);
}

// Compressor::compress on the paper CNN's layout at c = 0.01 with each value option: after
// the first call has sized the update's vectors, further calls reuse them. (Bin-local is
// left out: how many entries it sends depends on the data, so a later call may need more
// room than any before.)
TEST(NoAllocation, TopKCompressorAfterTheFirstCall) {
  using namespace edgetrain::runtime;
  edgetrain::runtime::Model model(edgetrain::runtime::builtin_model_spec("paper-cnn"));
  std::vector<TensorSlice> layout;
  for (const auto& t : model.tensors())
    layout.push_back({t.offset, static_cast<std::uint32_t>(t.size)});
  std::vector<float> gradient(model.parameter_count());
  for (std::size_t i = 0; i < gradient.size(); i++)
    gradient[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) / 997.0f;
  for (int variant = 0; variant < 4; variant++) {
    CompressorOptions options;
    options.error_feedback = variant > 0;
    if (variant == 2) options.value_encoding = edgetrain::transport::ValueEncoding::kFp16;
    if (variant == 3) options.value_encoding = edgetrain::transport::ValueEncoding::kSignScale;
    Compressor compressor(layout, options);
    edgetrain::transport::SparseUpdate update;
    compressor.compress(gradient, update);
    const long new_before = g_operator_new_calls.load();
    for (int step = 0; step < 3; step++) compressor.compress(gradient, update);
    EXPECT_EQ(g_operator_new_calls.load(), new_before)
        << "operator new called by Compressor::compress, variant " << variant;
  }
}

}  // namespace
