#include "server/gan_coordinator.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "common/splitmix64.h"
#include "server/checkpoint_file.h"
#include "server/durable_file.h"
#include "server/resources.h"
#include "transport/gan_codec.h"
#include "transport/identity.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {
namespace {

using runtime::kGanClasses;
using runtime::kGanImageSize;
using runtime::kGanNoiseSize;
using transport::CoapCode;
using transport::CoapRequest;
using transport::CoapResponse;

constexpr int kServiceUnavailable = 503;
constexpr std::size_t kInputWidth = kGanNoiseSize + kGanClasses;
constexpr const char* kCheckpointPrefix = "checkpoint-";
constexpr const char* kCheckpointParts[3] = {"generator.safetensors", "adam-m.safetensors",
                                             "adam-v.safetensors"};

CoapResponse text_response(int code, const std::string& text) {
  return {code, {text.begin(), text.end()}, {}};
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Everything replay depends on: a log or checkpoint of another run is refused.
std::uint64_t run_id_of(const GanServerOptions& o, const runtime::Model& generator) {
  std::uint64_t h = mix(generator.layout_id());
  for (const std::uint64_t part :
       {std::uint64_t{static_cast<std::uint32_t>(o.gan.batch)}, std::uint64_t{o.k}, o.gan.seed,
        std::uint64_t{std::bit_cast<std::uint32_t>(o.gan.adam.lr)},
        std::uint64_t{std::bit_cast<std::uint32_t>(o.gan.adam.beta1)},
        std::uint64_t{std::bit_cast<std::uint32_t>(o.gan.adam.beta2)},
        std::uint64_t{std::bit_cast<std::uint32_t>(o.gan.adam.epsilon)}})
    h = mix(h ^ part);
  return h == 0 ? 1 : h;  // 0 means "any run" to the codec
}

std::string number_text(std::uint64_t v) { return std::to_string(v); }

std::optional<std::uint64_t> checkpoint_iteration_of(const std::filesystem::path& dir) {
  const std::string name = dir.filename().string();
  if (name.rfind(kCheckpointPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(std::strlen(kCheckpointPrefix));
  if (digits.empty() || digits.size() > 19 || !std::all_of(digits.begin(), digits.end(), ::isdigit))
    return std::nullopt;
  return std::stoull(digits);
}

std::vector<std::uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw GanStateError("cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

void check_gan_server_options(const GanServerOptions& o) {
  if (o.gan.batch < 1 || o.gan.batch > static_cast<int>(transport::kGanMaxBatch))
    throw std::invalid_argument("--gan-batch must be 1 to " +
                                std::to_string(transport::kGanMaxBatch));
  if (o.workers < 1 || o.workers > 100000)
    throw std::invalid_argument("--gan-workers must be 1 to 100000");
  if (o.k < 1 || o.k > o.workers) throw std::invalid_argument("--gan-k must be 1 to --gan-workers");
  if (std::uint64_t{o.k} * static_cast<std::uint64_t>(o.gan.batch) > transport::kGanMaxBatch)
    throw std::invalid_argument("--gan-k times --gan-batch must be at most " +
                                std::to_string(transport::kGanMaxBatch));
  if (!(o.deadline_seconds > 0) || o.deadline_seconds > 86400)
    throw std::invalid_argument("--gan-deadline must be in (0, 86400] s");
  if (o.checkpoint_every < 1)
    throw std::invalid_argument("--gan-checkpoint-every must be at least 1");
  if (o.encoding != transport::ValueEncoding::kFp32 &&
      o.encoding != transport::ValueEncoding::kFp16)
    throw std::invalid_argument("GAN batches travel as fp32 or fp16");
  if (o.directory.empty()) throw std::invalid_argument("the GAN mode needs a state directory");
}

GanCoordinator::GanCoordinator(GanServerOptions options) : options_(std::move(options)) {
  check_gan_server_options(options_);
  runtime::GanSettings settings = options_.gan;
  settings.batch =
      static_cast<int>(options_.k) * options_.gan.batch;  // the step runs all k batches at once
  g_ = runtime::make_generator(settings, options_.gan.seed);
  run_id_ = run_id_of(options_, g_->model());
  std::filesystem::create_directories(options_.directory);
  wal_path_ = options_.directory / "gan.wal";
  recover();
  open_iteration();
}

GanCoordinator::~GanCoordinator() = default;

void GanCoordinator::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void GanCoordinator::recover() {
  // The newest checkpoint whose three parts are intact and of this run.
  std::vector<std::pair<std::uint64_t, std::filesystem::path>> checkpoints;
  for (const auto& entry : std::filesystem::directory_iterator(options_.directory))
    if (auto i = checkpoint_iteration_of(entry.path()); i && entry.is_directory())
      checkpoints.emplace_back(*i, entry.path());
  std::sort(checkpoints.rbegin(), checkpoints.rend());
  std::string problems;
  for (const auto& [iteration, dir] : checkpoints) {
    try {
      std::vector<std::vector<float>> parts;
      std::uint64_t adam_steps = 0;
      for (const char* part : kCheckpointParts) {
        const auto bytes = read_bytes(dir / part);
        const auto seal = check_checkpoint_seal(bytes);
        if (seal.seal != CheckpointSeal::kIntact)
          throw GanStateError((dir / part).string() + ": " + seal.problem);
        runtime::Model model = g_->model();
        const auto metadata = model.load_safetensors_bytes(bytes, (dir / part).string());
        auto field = [&](const char* key) {
          const auto it = metadata.find(key);
          if (it == metadata.end()) throw GanStateError((dir / part).string() + " has no " + key);
          return std::stoull(it->second);
        };
        if (field("edgetrain.gan.run") != run_id_)
          throw GanStateError((dir / part).string() +
                              " belongs to another GAN run (other settings)");
        if (field("edgetrain.gan.iteration") != iteration)
          throw GanStateError((dir / part).string() + ": iteration differs");
        adam_steps = field("edgetrain.gan.adam_steps");
        parts.emplace_back(model.parameters().begin(), model.parameters().end());
      }
      g_->params = std::move(parts[0]);
      g_->adam.m = std::move(parts[1]);
      g_->adam.v = std::move(parts[2]);
      g_->adam.steps = adam_steps;
      iteration_ = recovery_.checkpoint_iteration = iteration;
      recovery_.fresh = false;
      break;
    } catch (const std::exception& e) {  // ModelError and GanStateError alike: try the one before
      problems += std::string(problems.empty() ? "" : "; ") + e.what();
      log("GAN checkpoint " + dir.string() + " not usable: " + e.what());
    }
  }
  if (!checkpoints.empty() && recovery_.fresh)
    throw GanStateError("no usable GAN checkpoint in " + options_.directory.string() + ": " +
                        problems);

  if (!std::filesystem::exists(wal_path_)) {
    wal_ = WalWriter::replace(wal_path_, WalHeader{.model_id = run_id_}, {});
    return;
  }
  WalContents wal;
  try {
    wal = read_wal(wal_path_);
  } catch (const WalError& e) {
    throw GanStateError(e.what());
  }
  if (wal.header.model_id != run_id_)
    throw GanStateError(wal_path_.string() +
                        " belongs to another GAN run (other --gan-* settings or seed)");
  if (!wal.damage.empty()) throw GanStateError(describe_wal_damage(wal_path_, wal));
  for (const auto& record : wal.records) {
    if (record.version <= iteration_) continue;  // in the checkpoint already
    if (record.version != iteration_ + 1 || record.identity != kGanStepIdentity)
      throw GanStateError(wal_path_.string() + ": record of iteration " +
                          number_text(record.version) + " after iteration " +
                          number_text(iteration_));
    const std::size_t floats = std::size_t{options_.k} * options_.gan.batch * kGanImageSize;
    if (record.update.size() != floats * 4)
      throw GanStateError(wal_path_.string() + ": a step record of the wrong size");
    std::vector<float> averaged(floats);
    std::memcpy(averaged.data(), record.update.data(), record.update.size());
    draw_inputs();  // the inputs of iteration_ (a function of the seed and the iteration)
    apply_step(averaged);
    ++recovery_.replayed;
    recovery_.fresh = false;
  }
  if (wal.dropped_bytes > 0)
    log("GAN log: cut a torn last record (" + number_text(wal.dropped_bytes) + " bytes)");
  wal_ = WalWriter::append_to(wal_path_, wal.valid_bytes);
}

// The open iteration's k batches: labels and noise drawn from (seed, iteration), so replay
// and a restarted server draw the same ones.
void GanCoordinator::draw_inputs() {
  const std::size_t rows = std::size_t{options_.k} * options_.gan.batch;
  runtime::SplitMix64 labels{mix(options_.gan.seed ^ mix(iteration_ * 2 + 1))};
  runtime::GaussianSampler noise(mix(options_.gan.seed ^ mix(iteration_ * 2 + 2)));
  std::vector<float> z(rows * kGanNoiseSize);
  noise.fill(z.data(), z.size());
  labels_.resize(rows);
  for (auto& label : labels_) label = static_cast<std::int32_t>(labels.next() % kGanClasses);
  inputs_.resize(rows * kInputWidth);
  runtime::generator_inputs(inputs_.data(), z.data(), labels_.data(), static_cast<int>(rows));
}

void GanCoordinator::open_iteration() {
  draw_inputs();
  const std::size_t rows = std::size_t{options_.k} * options_.gan.batch;
  samples_.resize(rows * kGanImageSize);
  runtime::generate(*g_, inputs_.data(), static_cast<int>(rows), samples_.data());
  feedback_sum_.assign(samples_.size(), 0.0f);
  answered_.clear();
  opened_ = options_.now();
  // This iteration's swap round: a random cycle over the workers slotted now.
  swap_to_.clear();
  if (options_.swap_every > 0 && iteration_ > 0 && iteration_ % options_.swap_every == 0 &&
      slot_names_.size() >= 2) {
    const std::uint64_t round = iteration_ / options_.swap_every;
    runtime::SplitMix64 draw{mix(options_.gan.seed ^ mix(round * 2 + 0x5a5a))};
    std::vector<std::size_t> next(slot_names_.size());
    for (std::size_t n = 0; n < next.size(); n++) next[n] = n;
    for (std::size_t i = next.size() - 1; i > 0; --i) std::swap(next[i], next[draw.next() % i]);
    for (std::size_t n = 0; n < next.size(); n++) swap_to_[slot_names_[n]] = slot_names_[next[n]];
    ++swap_rounds_;
  }
}

void GanCoordinator::apply_step(std::span<const float> averaged_feedback) {
  const auto started = std::chrono::steady_clock::now();
  runtime::generator_step(*g_, inputs_.data(), averaged_feedback.data(),
                          static_cast<int>(options_.k) * options_.gan.batch);
  ++iteration_;
  last_step_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

CoapResponse GanCoordinator::get_batches(const CoapRequest& request) {
  const std::string identity = identity_key(request);
  if (identity.empty())
    return text_response(CoapCode::kUnauthorized, "no identity (plain CoAP needs ?id=NAME)");
  auto slot = slots_.find(identity);
  if (slot == slots_.end()) {
    if (slots_.size() >= options_.workers) {
      ++refused_no_slot_;
      return text_response(CoapCode::kForbidden, "all " + std::to_string(options_.workers) +
                                                     " GAN worker slots are taken (--gan-workers)");
    }
    slot = slots_.emplace(identity, static_cast<std::uint32_t>(slot_names_.size())).first;
    slot_names_.push_back(
        request.identity);  // as peers know it: the certificate's CN, or the declared name
    log("GAN worker " + transport::escape_untrusted(identity) + " has slot " +
        std::to_string(slot->second));
  }
  if (answered_.count(identity)) {
    const double left =
        options_.deadline_seconds - std::chrono::duration<double>(options_.now() - opened_).count();
    return text_response(kServiceUnavailable,
                         "iteration " + number_text(iteration_) + " waits for " +
                             std::to_string(options_.workers - answered_.size()) +
                             " more feedbacks (at most " + std::to_string(std::max(0.0, left)) +
                             " s)");
  }
  const std::uint32_t n = slot->second, k = options_.k,
                      b = static_cast<std::uint32_t>(options_.gan.batch);
  const std::uint32_t g_batch = n % k, d_batch = (n + 1) % k;
  transport::GanBatches out;
  out.run_id = run_id_;
  out.iteration = iteration_;
  out.batch = b;
  out.width = kGanImageSize;
  if (auto it = swap_to_.find(slot_names_[n]); it != swap_to_.end()) {
    out.swap_round = static_cast<std::uint32_t>(iteration_ / options_.swap_every);
    out.swap_to = it->second;
  }
  const std::size_t floats = std::size_t{b} * kGanImageSize;
  for (const auto& [batch, labels, samples] :
       {std::tuple{g_batch, &out.g_labels, &out.g_samples},
        std::tuple{d_batch, &out.d_labels, &out.d_samples}}) {
    for (std::uint32_t i = 0; i < b; i++)
      labels->push_back(static_cast<std::uint8_t>(labels_[std::size_t{batch} * b + i]));
    samples->assign(samples_.begin() + static_cast<std::ptrdiff_t>(batch * floats),
                    samples_.begin() + static_cast<std::ptrdiff_t>((batch + 1) * floats));
  }
  auto encoded = transport::encode_gan_batches(out, options_.encoding);
  if (!encoded) return text_response(CoapCode::kInternalServerError, encoded.error().message);
  ++batches_sent_;
  return {CoapCode::kContent, std::move(encoded).value(), {}};
}

CoapResponse GanCoordinator::post_feedback(const CoapRequest& request) {
  const std::string identity = identity_key(request);
  if (identity.empty())
    return text_response(CoapCode::kUnauthorized, "no identity (plain CoAP needs ?id=NAME)");
  const auto slot = slots_.find(identity);
  if (slot == slots_.end())
    return text_response(CoapCode::kForbidden, "ask for batches (GET /gan/batches) first");
  auto decoded = transport::decode_gan_feedback(
      request.payload, {.run_id = run_id_,
                        .batch = static_cast<std::uint32_t>(options_.gan.batch),
                        .width = kGanImageSize});
  if (!decoded) {
    ++malformed_;
    return text_response(CoapCode::kBadRequest, "feedback refused: " + decoded.error().message);
  }
  const auto& feedback = decoded.value();
  if (feedback.iteration != iteration_) {
    ++late_;
    return text_response(CoapCode::kConflict,
                         "feedback for iteration " + number_text(feedback.iteration) +
                             ", the open iteration is " + number_text(iteration_));
  }
  if (!answered_.insert(identity).second) {
    ++duplicates_;
    return {CoapCode::kChanged, {}, {}};
  }
  const std::size_t floats = feedback.values.size();
  float* sum = feedback_sum_.data() + (slot->second % options_.k) * floats;
  for (std::size_t i = 0; i < floats; i++) sum[i] += feedback.values[i];
  ++feedbacks_;
  poll();
  return {CoapCode::kChanged, {}, {}};
}

bool GanCoordinator::poll() {
  const bool everyone = answered_.size() >= options_.workers;
  const bool late =
      options_.now() - opened_ >= std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(options_.deadline_seconds));
  if (!everyone && !late) return false;
  if (answered_.empty()) {  // nobody answered in time: the same iteration again, a new deadline
    ++empty_iterations_;
    opened_ = options_.now();
    return false;
  }
  close_iteration();
  return true;
}

std::vector<std::uint8_t> GanCoordinator::encode_step(std::span<const float> averaged) const {
  std::vector<std::uint8_t> bytes(averaged.size() * 4);
  std::memcpy(bytes.data(), averaged.data(), bytes.size());
  return bytes;
}

void GanCoordinator::close_iteration() {
  const auto m = static_cast<std::uint32_t>(answered_.size());
  dropped_ += options_.workers > m ? options_.workers - m : 0;
  // The server's loss is the mean over the m·b samples that came back: each F_n is already the
  // gradient of its worker's mean over b.
  std::vector<float> averaged(feedback_sum_.size());
  for (std::size_t i = 0; i < averaged.size(); i++)
    averaged[i] = feedback_sum_[i] / static_cast<float>(m);
  wal_->append(WalRecord{.version = iteration_ + 1,
                         .identity = kGanStepIdentity,
                         .sequence = m,
                         .update = encode_step(averaged)});
  apply_step(averaged);
  if (iteration_ % options_.checkpoint_every == 0) checkpoint();
  open_iteration();
}

void GanCoordinator::checkpoint() {
  const std::filesystem::path target =
      options_.directory / (kCheckpointPrefix + number_text(iteration_));
  if (std::filesystem::exists(target)) return;
  const std::filesystem::path aside = options_.directory / "checkpoint.tmp";
  std::filesystem::remove_all(aside);
  std::filesystem::create_directories(aside);
  const std::map<std::string, std::string> metadata = {
      {"edgetrain.gan.run", number_text(run_id_)},
      {"edgetrain.gan.iteration", number_text(iteration_)},
      {"edgetrain.gan.adam_steps", number_text(g_->adam.steps)}};
  const std::vector<float>* parts[3] = {&g_->params, &g_->adam.m, &g_->adam.v};
  runtime::Model model = g_->model();
  for (int p = 0; p < 3; p++) {
    std::copy(parts[p]->begin(), parts[p]->end(), model.parameters().begin());
    write_file_atomically(aside / kCheckpointParts[p], sealed_checkpoint_bytes(model, metadata));
  }
  sync_path(aside);
  durable_rename(aside, target);
  // The log restarts empty after the checkpoint; older checkpoints go (the previous one is
  // kept in case this one is found damaged: the log then no longer reaches it, and recovery
  // says so rather than guess).
  wal_ = WalWriter::replace(wal_path_, WalHeader{.model_id = run_id_}, {});
  for (const auto& entry : std::filesystem::directory_iterator(options_.directory))
    if (auto i = checkpoint_iteration_of(entry.path());
        i && *i + options_.checkpoint_every < iteration_)
      std::filesystem::remove_all(entry.path());
}

void GanCoordinator::attach(transport::CoapDtlsServer& server,
                            std::function<void(const CoapRequest&)> note) {
  server.add_resource("gan/batches", transport::Method::kGet, [this, note](const CoapRequest& r) {
    if (note) note(r);
    return get_batches(r);
  });
  server.add_resource("gan/feedback", transport::Method::kPost, [this, note](const CoapRequest& r) {
    if (note) note(r);
    return post_feedback(r);
  });
}

std::string GanCoordinator::status_json() const {
  return nlohmann::json{{"iteration", iteration_},
                        {"workers", options_.workers},
                        {"slotted", slot_names_.size()},
                        {"answered_this_iteration", answered_.size()},
                        {"k", options_.k},
                        {"batch", options_.gan.batch},
                        {"feedbacks", feedbacks_},
                        {"dropped", dropped_},
                        {"late_refused", late_},
                        {"malformed_refused", malformed_},
                        {"duplicates", duplicates_},
                        {"refused_no_slot", refused_no_slot_},
                        {"empty_deadlines", empty_iterations_},
                        {"swap_rounds", swap_rounds_},
                        {"batches_sent", batches_sent_},
                        {"last_step_seconds", last_step_seconds_},
                        {"recovered_checkpoint_iteration", recovery_.checkpoint_iteration},
                        {"replayed_iterations", recovery_.replayed}}
      .dump();
}

}  // namespace edgetrain::server
