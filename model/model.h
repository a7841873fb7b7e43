// A model: a short textual layer spec, resolved into layers with shapes and a table of
// parameter tensors that all live in one float arena (each tensor known by name, shape
// and offset). The AdaComp compressor, the codec and the server address tensors by
// their index and offset in that arena.
//
// Spec language (statements separated by ';' or newlines, '#' starts a comment):
//   input 28x28x1                 H x W x C of one example (first statement, required)
//   conv 32 3x3 [stride 1] [same|valid] [relu]
//   dwconv 3x3 [stride 1] [same|valid] [relu]
//                                 depthwise: one KxK filter per input channel (channel
//                                 multiplier 1, so OC = C); a pointwise conv is 'conv OC 1x1'
//   maxpool 2                     2x2 window, stride 2
//   avgpool K                     KxK window, stride K (K >= 2), floor(H/K) x floor(W/K)
//   globalavgpool                 the mean over all H x W positions: output 1x1xC
//   fc 128 [relu]                 fully connected (flattens NHWC input)
//   fc 7x7x128 [relu]             the same, its output read as an HxWxC image (a generator's)
//   deconv 64 5x5 [stride 2] [relu]
//                                 transposed convolution, output H·stride x W·stride
//                                 (padding (K−1)/2, odd K; kernels/gan_ops.h Deconv2dShape)
//   relu
//   dropout 0.2                   inverted dropout at that rate, in (0, 1), while training
//                                 (Trainer::compute_gradient, masks from its step seed); the
//                                 identity in evaluate()
//   groupnorm G [relu]            group normalization (Wu & He 2018): per example, over each of
//                                 G groups of C/G channels and all positions; C % G == 0;
//                                 then a per-channel gamma·x̂ + beta (tensors gnN.weight,
//                                 gnN.bias [C], initialized 1 and 0); eps 1e-5
//   batchnorm [relu]              batch normalization: per channel over the batch and all
//                                 positions while training, running mean/var (momentum 0.1)
//                                 when evaluating; gamma, beta as bnN.weight, bnN.bias [C]. The
//                                 running statistics are not parameters: model/README.md,
//                                 "Normalization state", says where they live in each mode
//   init glorot|he                how initialize() draws the weights (default glorot; once,
//                                 anywhere after input): he is He-uniform, bound sqrt(6/fan_in),
//                                 which keeps a deep ReLU network without normalization
//                                 (mobilenet-mini) from starting with vanishing activations
// Sequences (time series): 'input LxC sequence' is L steps of C channels, held as a 1xLxC
// image, and
//   conv1d OC K [stride S] [valid] [relu]
//                                 a 1-D convolution along the sequence: a conv with a 1xK
//                                 kernel (weight [OC, 1, K, C]); 'valid' only for now (a 'same'
//                                 1-D conv pads columns but not rows, which the 2-D ops'
//                                 symmetric padding cannot say yet)
// Graphs (residual connections): each layer reads the tensor before it, unless told otherwise:
//   name A                        names the current tensor (the last layer's output, after its
//                                 relu; or the input): letters, digits, '_', '-'; once per name
//   from A                        the next layer reads tensor A instead of the current one
//                                 (a branch, e.g. a skip's 1x1 projection)
//   add A [relu]                  the current tensor plus tensor A, element by element; the
//                                 shapes must be equal (a model error naming the statement)
// A residual block with a strided projection on its skip:
//   name x; conv 32 3x3 stride 2 same relu; conv 32 3x3 same; name y
//   from x; conv 32 1x1 stride 2 valid; add y relu
// Every layer's output must be read by a later layer, except the last one's (the logits).
// In backward, a tensor read by several layers gets the sum of their gradients.
// The last layer's outputs are the class logits; the loss is softmax cross-entropy. The
// classifier's Trainer refuses deconv layers: they are for the GAN networks
// (model/gan_network.h), which hold their own activations and losses.
//
// Built in: "paper-cnn" (AdaComp paper's CNN, 421,642 parameters), "mlp",
// "mobilenet-mini" (depthwise-separable, 30,794 parameters), "resnet-8" and "resnet-8-rgb"
// (residual, for 28x28x1 and 32x32x3), "ds-cnn" (keyword spotting, 49x10x1) and "cnn1d"
// (sensor windows, 128x9 sequence); model/README.md gives their sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace edgetrain::runtime {

class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class LayerKind {
  kConv,
  kMaxPool,
  kFullyConnected,
  kRelu,
  kDeconv,
  kDepthwiseConv,
  kAvgPool,
  kGlobalAvgPool,
  kDropout,
  kGroupNorm,
  kBatchNorm,
  kAdd  // the current tensor plus a named one (a residual connection)
};

struct LayerSpec {
  LayerKind kind = LayerKind::kRelu;
  int out_channels =
      0;  // conv, deconv: OC; fc: output features (or channels of out_height x out_width)
  int out_height = 1, out_width = 1;  // fc: an HxWxC output
  int kernel = 3;                     // conv, deconv, dwconv: square kernel size; avgpool: window
  int stride = 1;                     // conv, deconv, dwconv
  bool same_padding = true;           // conv, dwconv: pad (kernel-1)/2 on each side
  bool relu = false;  // conv/dwconv/fc: ReLU fused after the layer (shorthand for a relu layer)
  float rate = 0;     // dropout: the fraction of activations dropped while training
  int groups = 0;     // groupnorm: G
  bool one_d = false;     // conv: a conv1d, kernel 1 x `kernel`
  std::string from;       // read the tensor so named ('from A' before it); empty: the current one
  std::string added;      // add: the tensor named so
  std::string name;       // 'name A' after it: this layer's output (after its relu) is called A
  std::string statement;  // the statement's text, for errors found when resolving shapes
};

struct ExampleShape {
  int H = 0, W = 0, C = 0;
  std::size_t size() const { return static_cast<std::size_t>(H) * W * C; }
  bool operator==(const ExampleShape&) const = default;
};

enum class WeightInit { kGlorot, kHe };

struct ModelSpec {
  std::string name;
  ExampleShape input;
  bool sequence = false;   // 'input LxC sequence': input is {1, L, C}
  std::string input_name;  // 'name A' right after 'input'
  std::vector<LayerSpec> layers;
  WeightInit init = WeightInit::kGlorot;
};

// Parses the spec language above; throws ModelError naming the statement at fault.
ModelSpec parse_model_spec(std::string_view text, std::string name = "custom");
// "paper-cnn" or "mlp"; throws ModelError for other names.
ModelSpec builtin_model_spec(std::string_view name);
// A built-in name, a spec file (one line without ';' naming a regular file; the spec is
// named by its text), or else spec text (named by itself: a checkpoint's edgetrain.model
// then holds the spec, which this function reads back).
ModelSpec model_spec_from_argument(std::string_view name_or_spec);
std::vector<std::string> builtin_model_names();

struct TensorInfo {
  std::string name;        // e.g. "conv1.weight"
  std::vector<int> shape;  // conv and deconv weight [OC, KH, KW, C]; dwconv weight [C, KH, KW, 1];
                           // fc weight [OC, C]; bias [OC]
  std::size_t offset = 0;  // in floats, into the parameter arena
  std::size_t size = 0;    // number of floats
};

// A layer with its input and output shapes (per example) and its parameter tensors.
struct ResolvedLayer {
  LayerKind kind;
  ExampleShape in, out;
  int kernel = 0, stride = 1, pad = 0;
  int adj = 0;  // deconv: output rows/columns added at the end (PyTorch's output_padding)
  float rate = 0;                            // dropout
  int groups = 0;                            // groupnorm: G; batchnorm: C (one per channel)
  int kernel_h = 0;  // conv: the kernel's height (`kernel` for 2-D, 1 for conv1d)
  // The layer whose output this one reads (-1: the model's input), and for kAdd the layer
  // whose output it adds (-1: the input). Layers come in an order where both are earlier.
  int input = -1, added = -1;
  int weight_tensor = -1, bias_tensor = -1;  // indexes into Model::tensors(), -1 if none
};

class Model {
 public:
  // What the parameter arena holds once the model is made: zeros, or nothing at all
  // (kNone: a model used for its layout only, whose parameters live elsewhere, as the
  // worker's copy of the server's model does: it saves the arena's memory, 1.7 MB for the
  // paper CNN). Without an arena parameters() is empty, and initialize(), tensor() and the
  // safetensors functions throw ModelError.
  enum class Arena { kZeros, kNone };
  explicit Model(ModelSpec spec, Arena arena = Arena::kZeros);
  // A model of parameter tensors only (offsets back to back from 0), without layers: a
  // shard of a larger model (model/model_shards.h). Its layout id fingerprints
  // `layout_salt` before the tensor names and shapes, so slices of different models or
  // shard counts differ even where their pieces look alike. It can be stored, checkpointed
  // and served, not trained or evaluated (num_classes() is 0; initialize() changes nothing).
  Model(std::string name, std::vector<TensorInfo> tensors, std::string_view layout_salt);

  const ModelSpec& spec() const { return spec_; }
  const std::vector<ResolvedLayer>& layers() const { return layers_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  int tensor_index(std::string_view name) const;  // -1 if none
  // Each tensor's entry count, in order: the layout the codec checks updates against.
  std::vector<std::uint32_t> tensor_sizes() const;
  std::size_t parameter_count() const { return parameter_count_; }
  int num_classes() const {
    return layers_.empty() ? 0 : static_cast<int>(layers_.back().out.size());
  }
  ExampleShape input_shape() const { return spec_.input; }

  std::span<float> parameters() { return parameters_; }
  std::span<const float> parameters() const { return parameters_; }
  std::span<float> tensor(int index) {
    require_arena();
    return {parameters_.data() + tensors_.at(index).offset, tensors_.at(index).size};
  }

  // A 64-bit fingerprint of the tensor names and shapes (and, for a model whose layers do
  // not simply follow one another, of which layer reads and adds which): two models with
  // equal layout_id() can exchange parameters and updates.
  std::uint64_t layout_id() const { return layout_id_; }
  // Whether some layer reads other than the layer before it, or adds (a residual graph).
  // Code that walks the layers as a chain (filter dropout, the classifier readout) refuses
  // such a model.
  bool is_graph() const { return is_graph_; }

  // Glorot-uniform (or, with 'init he', He-uniform) weights, zero biases; the same on every
  // platform for a seed.
  void initialize(std::uint64_t seed);

  // safetensors (https://huggingface.co/docs/safetensors): 8-byte little-endian header
  // length, JSON header, raw little-endian F32 data. Opens in NumPy/PyTorch.
  // Writes through `path`.tmp and a rename (not synced: the server makes its checkpoints
  // durable itself, from safetensors_bytes()).
  void save_safetensors(const std::string& path,
                        const std::map<std::string, std::string>& metadata = {}) const;
  // The whole file in memory, as save_safetensors() writes it.
  std::vector<std::uint8_t> safetensors_bytes(
      const std::map<std::string, std::string>& metadata = {}) const;
  // Loads parameters saved for a model with the same tensors; throws ModelError otherwise.
  // Returns the file's __metadata__.
  std::map<std::string, std::string> load_safetensors(const std::string& path);
  // The same from the file's bytes; `name` is the file named in errors.
  std::map<std::string, std::string> load_safetensors_bytes(std::span<const std::uint8_t> bytes,
                                                            const std::string& name);

 private:
  void require_arena() const;  // throws ModelError for a model made with Arena::kNone

  ModelSpec spec_;
  std::vector<ResolvedLayer> layers_;
  std::vector<TensorInfo> tensors_;
  std::vector<float> parameters_;
  std::size_t parameter_count_ = 0;
  std::uint64_t layout_id_ = 0;
  bool is_graph_ = false;
};

}  // namespace edgetrain::runtime
