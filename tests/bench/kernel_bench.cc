// Benchmark program (prints figures; not a test): one training step (forward, backward,
// SGD) of the paper CNN, fast or reference path of the kernel-level composition
// (tests/support/paper_cnn.h) or runtime::Trainer (`--path trainer`, XNNPACK backend, from
// raw pixels as the worker calls it), at a given batch and thread count, and
// the GEMM peak of this machine measured with a large XNNPACK fully-connected operator.
// One configuration per process, so the peak RSS printed belongs to that configuration.
// tests/bench/run_kernel_bench.sh runs it next to PyTorch.
#include <pthreadpool.h>
#include <sys/resource.h>
#include <xnnpack.h>

#include "common/settings.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/normalization.h"
#include "kernels/reference.h"
#include "kernels/training_xnn.h"
#include "kernels/xnnpack_setup.h"
#include "model/model.h"
#include "model/filter_dropout.h"
#include "model/trainer.h"
#include "tests/support/paper_cnn.h"

namespace {

using Clock = std::chrono::steady_clock;
using edgetrain::testing::PaperCnn;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // Linux reports KiB
}

// Multiply-adds x2 of one step: every layer's forward GEMM, and the same again for each of
// its input and weight gradients (conv1 has no input gradient). Pooling, ReLU, softmax and
// SGD are not counted.
double step_flops(int B) {
  const double conv1 = 2.0 * B * 28 * 28 * 32 * 9, conv2 = 2.0 * B * 14 * 14 * 64 * 288;
  const double fc1 = 2.0 * B * 3136 * 128, fc2 = 2.0 * B * 128 * 10;
  return 2 * conv1 + 3 * (conv2 + fc1 + fc2);
}

// Best GFLOP/s of 20 512 x 1024 x 1024 XNNPACK fully-connected runs (weights packed once;
// the best of many, so that other processes on a shared machine rarely lower it).
double gemm_peak_gflops(pthreadpool_t pool) {
  edgetrain::kernels::ensure_xnnpack_initialized();
  const std::size_t M = 512, K = 1024, N = 1024;
  std::vector<float> a(M * K, 0.5f), w(N * K, 0.25f), c(M * N);
  xnn_operator_t op = nullptr;
  const float inf = std::numeric_limits<float>::infinity();
  if (xnn_create_fully_connected_nc_f32(K, N, K, N, w.data(), nullptr, -inf, inf, 0, &op) !=
          xnn_status_success ||
      xnn_setup_fully_connected_nc_f32(op, M, a.data(), c.data(), pool) != xnn_status_success) {
    std::fprintf(stderr, "GEMM peak: XNNPACK set-up failed\n");
    return 0;
  }
  double best = 1e9;
  for (int rep = 0; rep < 20; rep++) {
    const auto start = Clock::now();
    xnn_run_operator(op, pool);
    best = std::min(best, seconds_since(start));
  }
  xnn_delete_operator(op);
  return 2.0 * M * K * N / best / 1e9;
}

// Time to create (= pack) and delete, once each, every operator the fast paper-CNN step
// recreates because its packed operand changed; conv/deconv set-up (indirection buffer)
// included. The recycling allocator is warm after the first round, as in training.
double repack_ms_per_step(int B) {
  edgetrain::kernels::ensure_xnnpack_initialized();
  const float inf = std::numeric_limits<float>::infinity();
  const std::size_t M1 = std::size_t(B) * 784, M2 = std::size_t(B) * 196;
  std::vector<float> big(std::max<std::size_t>(M1 * 32, 128 * 3136), 0.01f), out(M1 * 32 * 2);
  auto fc = [&](std::size_t K, std::size_t N, bool transposed) {
    xnn_operator_t op = nullptr;
    xnn_create_fully_connected_nc_f32(K, N, K, N, big.data(), nullptr, -inf, inf,
                                      transposed ? XNN_FLAG_TRANSPOSE_WEIGHTS : 0, &op);
    xnn_delete_operator(op);
  };
  auto conv = [&](std::size_t H, std::size_t C, std::size_t OC, bool deconv) {
    xnn_operator_t op = nullptr;
    if (deconv) {
      xnn_create_deconvolution2d_nhwc_f32(1, 1, 1, 1, 3, 3, 1, 1, 1, 1, 1, C, OC, C, OC, big.data(),
                                          nullptr, -inf, inf, 0, &op);
      xnn_setup_deconvolution2d_nhwc_f32(op, B, H, H, 0, 0, big.data(), out.data(), nullptr);
    } else {
      xnn_create_convolution2d_nhwc_f32(1, 1, 1, 1, 3, 3, 1, 1, 1, 1, 1, C, OC, C, OC, big.data(),
                                        nullptr, 0, inf, 0, &op);
      xnn_setup_convolution2d_nhwc_f32(op, B, H, H, big.data(), out.data(), nullptr);
    }
    xnn_delete_operator(op);
  };
  auto one_step = [&] {
    conv(28, 1, 32, false);   // conv1 forward: weights
    conv(14, 32, 64, false);  // conv2 forward: weights
    conv(14, 64, 32, true);   // conv2 input gradient: swapped weights
    // conv1 weight gradient: a direct loop (one input channel), no operator
    fc(M2, 64, true);                                 // conv2 weight gradient: dout
    fc(3136, std::size_t(B) < 128 ? B : 128, false);  // fc1 forward: activations (or weights)
    if (B >= 128)
      fc(128, 3136, true);  // fc1 input gradient: weights (a loop of ours below OC = 128)
    fc(B, 3136, true);      // fc1 weight gradient: activations
    fc(128, std::size_t(B) < 10 ? B : 10, false);  // fc2 forward
    fc(10, 128, true);                             // fc2 input gradient
    fc(B, 128, true);                              // fc2 weight gradient
  };
  one_step();
  std::vector<double> times;
  for (int i = 0; i < 11; i++) {
    const auto start = Clock::now();
    one_step();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1e3;
}

// One fast op's forward + backward (input, weight and bias gradients where it has them) on
// a B x H x W x C input, as the Trainer calls it: "conv1x1" (pointwise conv to 2C
// channels), "conv3x3s2" (3x3 stride 2 same to 2C), "dwconv3x3" (same), "dwconv3x3s2",
// "avgpool2", "globalavgpool", "groupnorm" (8 groups; C % 8 == 0), "batchnorm" (training
// statistics). Median ms of 21 calls after one warm-up.
double op_ms(const std::string& op, int B, int H, int W, int C, pthreadpool_t pool) {
  namespace k = edgetrain::kernels;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  auto random = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
  };
  const std::size_t n_in = static_cast<std::size_t>(B) * H * W * C;
  auto inp = random(n_in);
  std::vector<float> dinp(n_in);
  std::function<void()> step;
  std::vector<float> out, dout, weight, bias, dweight, dbias, scratch;
  std::unique_ptr<k::Conv2dXnn> conv;
  std::unique_ptr<k::DepthwiseConv2dXnn> dwconv;
  std::unique_ptr<k::AvgPoolXnn> avgpool;
  std::unique_ptr<k::GlobalAvgPoolXnn> gap;
  auto buffers = [&](std::size_t n_out, std::size_t n_weight, std::size_t n_bias) {
    out.resize(n_out);
    dout = random(n_out);
    scratch.resize(n_out);
    weight = random(n_weight);
    dweight.resize(n_weight);
    bias = random(n_bias);
    dbias.resize(n_bias);
  };
  if (op == "conv1x1" || op == "conv3x3s2") {
    const bool pointwise = op == "conv1x1";
    const k::Conv2dShape s{B,
                           H,
                           W,
                           C,
                           2 * C,
                           pointwise ? 1 : 3,
                           pointwise ? 1 : 3,
                           pointwise ? 1 : 2,
                           pointwise ? 0 : 1};
    buffers(static_cast<std::size_t>(B) * s.OH() * s.OW() * s.OC,
            static_cast<std::size_t>(s.OC) * s.KH * s.KW * C, s.OC);
    conv = std::make_unique<k::Conv2dXnn>(s, k::Activation::relu, pool);
    step = [&] {
      conv->forward(out.data(), inp.data(), weight.data(), bias.data());
      std::copy(dout.begin(), dout.end(), scratch.begin());
      conv->backward_overwriting_dout(dinp.data(), dweight.data(), dbias.data(), scratch.data(),
                                      out.data(), inp.data(), weight.data());
    };
  } else if (op == "dwconv3x3" || op == "dwconv3x3s2") {
    const int stride = op == "dwconv3x3" ? 1 : 2;
    const k::Conv2dShape s{B, H, W, C, C, 3, 3, stride, 1};
    buffers(static_cast<std::size_t>(B) * s.OH() * s.OW() * C, static_cast<std::size_t>(C) * 9, C);
    dwconv = std::make_unique<k::DepthwiseConv2dXnn>(s, k::Activation::relu, pool);
    step = [&] {
      dwconv->forward(out.data(), inp.data(), weight.data(), bias.data());
      std::copy(dout.begin(), dout.end(), scratch.begin());
      dwconv->backward_overwriting_dout(dinp.data(), dweight.data(), dbias.data(), scratch.data(),
                                        out.data(), inp.data(), weight.data());
    };
  } else if (op == "avgpool2") {
    buffers(static_cast<std::size_t>(B) * (H / 2) * (W / 2) * C, 0, 0);
    avgpool = std::make_unique<k::AvgPoolXnn>(B, H, W, C, 2, pool);
    step = [&] {
      avgpool->forward(out.data(), inp.data());
      avgpool->backward(dinp.data(), dout.data());
    };
  } else if (op == "globalavgpool") {
    buffers(static_cast<std::size_t>(B) * C, 0, 0);
    gap = std::make_unique<k::GlobalAvgPoolXnn>(B, H * W, C, pool);
    step = [&] {
      gap->forward(out.data(), inp.data());
      gap->backward(dinp.data(), dout.data());
    };
  } else if (op == "groupnorm" || op == "batchnorm") {
    // Our loops (kernels/normalization.h); groupnorm in 8 groups, as torch_op.py's.
    if (op == "groupnorm" && C % 8 != 0) return -1;
    buffers(n_in, C, C);
    if (op == "groupnorm") {
      auto gn = std::make_shared<k::GroupNormOp>(B, H * W, C, 8);
      step = [&, gn] {
        gn->forward(out.data(), inp.data(), weight.data(), bias.data());
        gn->backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                     weight.data());
      };
    } else {
      auto bn = std::make_shared<k::BatchNormOp>(B, H * W, C);
      step = [&, bn] {
        bn->forward_training(out.data(), inp.data(), weight.data(), bias.data(), B);
        bn->backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                     weight.data(), B);
      };
    }
  } else {
    return -1;
  }
  step();
  std::vector<double> times;
  for (int i = 0; i < 21; i++) {
    const auto start = Clock::now();
    step();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2] * 1e3;
}

// --per-layer: each conv, fc and max-pool layer of `model` timed alone as the Trainer calls
// its op (ReLU fused where a relu layer follows; conv weight gradient through
// backward_overwriting_dout), in three passes: forward, input gradient (none for the first
// layer) and weight gradient (with the bias gradient). The ReLU mask pass runs in both
// gradient passes, as each is timed alone. Median and fastest of `reps` calls after one
// warm-up; FLOPs are 2 x multiply-adds of the pass's product, their rate over the fastest
// call compared with `peak_gflops`, this process's GEMM peak at the same thread count.
// Returns the sum of the rows' median milliseconds.
double print_per_layer(const edgetrain::runtime::Model& model, int B, pthreadpool_t pool,
                       double peak_gflops, int reps) {
  namespace k = edgetrain::kernels;
  namespace rt = edgetrain::runtime;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  auto random = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng) * 0.1f;
    return v;
  };
  struct Times {
    double median_ms, min_ms;
  };
  auto median_ms = [&](const std::function<void()>& call) {
    call();
    std::vector<double> times;
    for (int i = 0; i < reps; i++) {
      const auto start = Clock::now();
      call();
      times.push_back(seconds_since(start));
    }
    std::sort(times.begin(), times.end());
    return Times{times[times.size() / 2] * 1e3, times.front() * 1e3};
  };
  double total_ms = 0, total_min_ms = 0, total_flop = 0;
  auto row = [&](const std::string& name, const char* pass, Times t, double flop) {
    total_ms += t.median_ms;
    total_min_ms += t.min_ms;
    total_flop += flop;
    if (flop > 0) {
      const double gflops = flop / t.min_ms / 1e6;
      std::printf("%-8s %-12s %8.3f %8.3f %8.4f %8.1f %6.1f\n", name.c_str(), pass, t.median_ms,
                  t.min_ms, flop / 1e9, gflops, 100.0 * gflops / peak_gflops);
    } else {
      std::printf("%-8s %-12s %8.3f %8.3f %8s %8s %6s\n", name.c_str(), pass, t.median_ms, t.min_ms,
                  "-", "-", "-");
    }
  };
  std::printf(
      "per_layer model=%s batch=%d gemm_peak_gflops=%.1f (ms: median and fastest of %d calls; "
      "GFLOP/s and %%peak from the fastest, as the peak is the fastest of its runs)\n",
      model.spec().name.c_str(), B, peak_gflops, reps);
  std::printf("%-8s %-12s %8s %8s %8s %8s %6s\n", "layer", "pass", "ms", "min_ms", "GFLOP",
              "GFLOP/s", "%peak");
  const auto& layers = model.layers();
  int convs = 0, fcs = 0, pools = 0;
  for (std::size_t i = 0; i < layers.size(); i++) {
    const rt::ResolvedLayer& layer = layers[i];
    const bool relu = i + 1 < layers.size() && layers[i + 1].kind == rt::LayerKind::kRelu &&
                      layers[i + 1].input == static_cast<int>(i);
    const k::Activation act = relu ? k::Activation::relu : k::Activation::none;
    const bool first = layer.input < 0;
    const std::size_t n_in = static_cast<std::size_t>(B) * layer.in.size(),
                      n_out = static_cast<std::size_t>(B) * layer.out.size();
    auto inp = random(n_in), dout = random(n_out);
    std::vector<float> out(n_out), dinp(n_in), scratch(dout);
    if (layer.kind == rt::LayerKind::kConv) {
      const std::string name = "conv" + std::to_string(++convs);
      k::Conv2dShape s{B,           layer.in.H,     layer.in.W,   layer.in.C,
                       layer.out.C, layer.kernel_h, layer.kernel, layer.stride,
                       layer.pad};
      const std::size_t n_weight = static_cast<std::size_t>(s.OC) * s.KH * s.KW * s.C;
      auto weight = random(n_weight), bias = random(s.OC);
      std::vector<float> dweight(n_weight), dbias(s.OC);
      k::Conv2dXnn conv(s, act, pool);
      const double flop = 2.0 * B * s.OH() * s.OW() * s.OC * s.KH * s.KW * s.C;
      row(name, "forward",
          median_ms([&] { conv.forward(out.data(), inp.data(), weight.data(), bias.data()); }),
          flop);
      // The mask is idempotent, so masking `scratch` in place again on every call costs what
      // the Trainer's one call does.
      if (!first)
        row(name, "input_grad", median_ms([&] {
              conv.backward_overwriting_dout(dinp.data(), nullptr, nullptr, scratch.data(),
                                             out.data(), inp.data(), weight.data());
            }),
            flop);
      row(name, "weight_grad", median_ms([&] {
            conv.backward_overwriting_dout(nullptr, dweight.data(), dbias.data(), scratch.data(),
                                           out.data(), inp.data(), weight.data());
          }),
          flop);
    } else if (layer.kind == rt::LayerKind::kFullyConnected) {
      const std::string name = "fc" + std::to_string(++fcs);
      const std::size_t C = layer.in.size(), OC = layer.out.size();
      auto weight = random(C * OC), bias = random(OC);
      std::vector<float> dweight(C * OC), dbias(OC);
      k::FullyConnectedTrainXnn fc(B, C, OC, act, pool);
      const double flop = 2.0 * B * C * OC;
      const float* mask = relu ? out.data() : nullptr;
      row(name, "forward",
          median_ms([&] { fc.forward(out.data(), inp.data(), weight.data(), bias.data()); }), flop);
      if (!first)
        row(name, "input_grad", median_ms([&] {
              fc.backward(dinp.data(), nullptr, nullptr, dout.data(), mask, inp.data(),
                          weight.data());
            }),
            flop);
      row(name, "weight_grad", median_ms([&] {
            fc.backward(nullptr, dweight.data(), dbias.data(), dout.data(), mask, inp.data(),
                        weight.data());
          }),
          flop);
    } else if (layer.kind == rt::LayerKind::kMaxPool) {
      const std::string name = "maxpool" + std::to_string(++pools);
      k::MaxPool2x2Xnn maxpool(B, layer.in.H, layer.in.W, layer.in.C, pool);
      std::vector<std::uint32_t> window(n_out);
      row(name, "forward",
          median_ms([&] { maxpool.forward(out.data(), window.data(), inp.data()); }), 0);
      row(name, "input_grad",
          median_ms([&] { maxpool.backward(dinp.data(), dout.data(), window.data()); }), 0);
    }
  }
  const double gflops = total_flop / total_min_ms / 1e6;
  std::printf("%-8s %-12s %8.3f %8.3f %8.4f %8.1f %6.1f\n", "layers", "all", total_ms, total_min_ms,
              total_flop / 1e9, gflops, 100.0 * gflops / peak_gflops);
  return total_ms;
}

}  // namespace

int main(int argc, char** argv) {
  edgetrain::settings::Table table("kernel_bench",
                                   "edgetrain kernel benchmark: paper CNN train step");
  int batch = 10, threads = 1, steps = 20, warmup = 3;
  std::string path = "fast", drop_rates, model_name = "paper-cnn", op, op_shape = "14x14x32";
  bool peak = false, repack = false, per_layer = false;
  table.add("batch", batch, "batch size").range(1, 100000);
  table.add("threads", threads, "threads (1 = calling thread, no pool)").range(1, 1024);
  table.add("steps", steps, "timed steps").range(1, 1000000);
  table.add("warmup", warmup, "untimed steps first").range(0, 1000000);
  table.add("path", path, "fast or reference (kernel composition), or trainer (runtime::Trainer)")
      .choices({"fast", "reference", "trainer"});
  table.add("drop-rates", drop_rates,
            "trainer path: filter dropout, one rate per conv layer (e.g. 0.5,0.5)");
  table.add("model", model_name,
            "trainer path: a built-in model or a spec (GFLOP/s counted for paper-cnn only)");
  table.add("op", op,
            "print one fast op's forward + backward instead: conv1x1, conv3x3s2, dwconv3x3, "
            "dwconv3x3s2, avgpool2, globalavgpool, groupnorm (8 groups), batchnorm");
  table.add("op-shape", op_shape, "--op: the input HxWxC");
  table.add("gemm-peak", peak, "print the XNNPACK GEMM peak instead");
  table.add("repack-cost", repack, "print the cost of recreating (repacking) the step's operators");
  table.add("per-layer", per_layer,
            "trainer path: first print, per conv, fc and max-pool layer, the forward, input- and "
            "weight-gradient time, FLOPs, GFLOP/s and share of the GEMM peak measured in this "
            "process (conv, fc and maxpool layers only; others are left out)");
  if (const auto status = table.parse(argc, argv)) return *status;
  if (per_layer && path != "trainer") {
    std::fprintf(stderr, "kernel_bench: --per-layer needs --path trainer (it reads the model)\n");
    return 2;
  }
  if (repack) {
    std::printf("repack batch=%d ms_per_step=%.3f\n", batch, repack_ms_per_step(batch));
    return 0;
  }

  pthreadpool_t pool = threads > 1 ? pthreadpool_create(threads) : nullptr;
  if (!op.empty()) {
    int H = 0, W = 0, C = 0;
    if (std::sscanf(op_shape.c_str(), "%dx%dx%d", &H, &W, &C) != 3 || H < 1 || W < 1 || C < 1) {
      std::fprintf(stderr, "kernel_bench: --op-shape '%s' is not HxWxC\n", op_shape.c_str());
      return 2;
    }
    const double ms = op_ms(op, batch, H, W, C, pool);
    if (ms < 0) {
      std::fprintf(stderr, "kernel_bench: unknown --op '%s'\n", op.c_str());
      return 2;
    }
    std::printf("op=%s shape=%s batch=%d threads=%d ms_fwd_bwd=%.3f\n", op.c_str(),
                op_shape.c_str(), batch, threads, ms);
    if (pool) pthreadpool_destroy(pool);
    return 0;
  }
  if (peak) {
    std::printf("gemm_peak threads=%d gflops=%.1f\n", threads, gemm_peak_gflops(pool));
    if (pool) pthreadpool_destroy(pool);
    return 0;
  }

  std::vector<double> times;
  float loss = 0;
  auto time_steps = [&](auto&& step) {
    for (int i = 0; i < warmup; i++) loss = step();
    // Median of per-step times: robust to the other engineer's build on a 2-core machine.
    for (int i = 0; i < steps; i++) {
      const auto start = Clock::now();
      loss = step();
      times.push_back(seconds_since(start));
    }
  };
  if (path == "trainer") {
    namespace rt = edgetrain::runtime;
    rt::Model model(rt::model_spec_from_argument(model_name));
    model.initialize(1);
    if (model_name != "paper-cnn") path += "-" + model.spec().name;
    if (per_layer) print_per_layer(model, batch, pool, gemm_peak_gflops(pool), std::max(steps, 11));
    rt::Trainer trainer(model, batch, rt::KernelBackend::kXnnpack, pool);
    if (!drop_rates.empty()) {
      rt::DropoutConfig dropout;
      dropout.conv_drop_rates = rt::parse_drop_rates(drop_rates);
      trainer.set_dropout(dropout);
      path += "-dropout-" + drop_rates;
    }
    std::vector<std::uint8_t> pixels(static_cast<std::size_t>(batch) * model.input_shape().size());
    std::vector<std::int32_t> labels(batch);
    std::mt19937 rng(1);
    for (auto& p : pixels) p = static_cast<std::uint8_t>(rng() % 256);
    for (auto& l : labels) l = static_cast<std::int32_t>(rng() % model.num_classes());
    std::vector<float> grad(model.parameter_count());
    auto params = model.parameters();
    time_steps([&] {
      const float step_loss =
          trainer.compute_gradient(params, pixels.data(), labels.data(), batch, grad).loss;
      edgetrain::kernels::sgd_update(params.data(), grad.data(), 0.01f, params.size());
      return step_loss;
    });
  } else {
    PaperCnn model(batch, path == "fast" ? PaperCnn::Path::fast : PaperCnn::Path::reference, pool);
    model.init_parameters(1);
    edgetrain::testing::SyntheticDigits data(1);
    std::vector<float> images(static_cast<std::size_t>(batch) * 784);
    std::vector<std::int32_t> labels(batch);
    data.batch(images.data(), labels.data(), batch);
    time_steps([&] {
      const float step_loss = model.forward_backward(images.data(), labels.data(), nullptr);
      model.sgd_step(0.01f);
      return step_loss;
    });
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::printf(
      "edgetrain-%s batch=%d threads=%d ms_per_step=%.3f min_ms=%.3f gflops=%.2f peak_rss_mib=%.1f "
      "loss=%.4f\n",
      path.c_str(), batch, threads, median * 1e3, times.front() * 1e3,
      (model_name == "paper-cnn" ? step_flops(batch) : 0.0) / median / 1e9, peak_rss_mib(), loss);
  if (pool) pthreadpool_destroy(pool);
  return 0;
}
