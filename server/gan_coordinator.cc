#include "server/gan_coordinator.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "common/number_text.h"
#include "common/splitmix64.h"
#include "server/checkpoint_file.h"
#include "server/durable_file.h"
#include "server/resources.h"
#include "transport/gan_codec.h"
#include "transport/identity.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {

WalPlaceholder gan_wal_placeholder() {
  return {.make = [](const WalHeader&, std::uint64_t iteration) {
            return WalRecord{.version = iteration, .identity = kGanRefusedStepIdentity, .sequence = 0, .update = {}, .entry_delays = {}};
          },
          .plural = "iterations closed without a step"};
}
namespace {

using runtime::kGanClasses;
using runtime::kGanImageSize;
using runtime::kGanNoiseSize;
using transport::CoapCode;
using transport::CoapRequest;
using transport::CoapResponse;
using transport::text_response;

constexpr int kServiceUnavailable = 503;
constexpr std::size_t kInputWidth = kGanNoiseSize + kGanClasses;
constexpr const char* kCheckpointPrefix = "checkpoint-";
constexpr const char* kCheckpointParts[3] = {"generator.safetensors", "adam-m.safetensors",
                                             "adam-v.safetensors"};

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

bool all_finite(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
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
  if (!(o.max_feedback_magnitude > 0) || !std::isfinite(o.max_feedback_magnitude))
    throw std::invalid_argument("--gan-max-feedback must be a finite value above 0");
  if (!(o.clip_feedback_norm >= 0) || !std::isfinite(o.clip_feedback_norm))
    throw std::invalid_argument("--gan-clip-feedback must be a finite value >= 0");
  if (!(o.quarantine_seconds >= 0))
    throw std::invalid_argument("--quarantine-seconds must be >= 0");
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
        if (!all_finite(model.parameters()))  // written before issue 37's checks
          throw GanStateError((dir / part).string() + " holds a non-finite value");
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
  if (!wal.damage.empty())
    throw GanStateError(describe_wal_damage(wal_path_, wal) +
                        ". That is damage, not a torn tail: refusing to start, every file is left as it "
                        "is. `edgetrain-server repair-wal --state-dir " +
                        options_.directory.parent_path().string() +
                        "` lists the damage and the choices (--skip-damaged closes each damaged "
                        "iteration without a step, --cut-at-damage drops everything from it on)");
  for (const auto& record : wal.records) {
    if (record.version <= iteration_) continue;  // in the checkpoint already
    if (record.version != iteration_ + 1 ||
        (record.identity != kGanStepIdentity && record.identity != kGanRefusedStepIdentity))
      throw GanStateError(wal_path_.string() + ": record of iteration " +
                          number_text(record.version) + " after iteration " +
                          number_text(iteration_));
    if (record.identity == kGanRefusedStepIdentity) {  // closed without a step, as it was
      ++iteration_;
      ++recovery_.replayed;
      ++recovery_.replayed_refused;
      recovery_.fresh = false;
      continue;
    }
    const std::size_t floats = std::size_t{options_.k} * options_.gan.batch * kGanImageSize;
    if (record.update.size() != floats * 4)
      throw GanStateError(wal_path_.string() + ": a step record of the wrong size");
    std::vector<float> averaged(floats);
    std::memcpy(averaged.data(), record.update.data(), record.update.size());
    draw_inputs();  // the inputs of iteration_ (a function of the seed and the iteration)
    if (!apply_step(averaged)) {  // only a log written before issue 37's checks holds one
      ++recovery_.replayed_refused;
      log("GAN log: the logged step of iteration " + number_text(record.version) +
          " would make the generator non-finite; replayed as an iteration without a step");
    }
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

bool GanCoordinator::apply_step(std::span<const float> averaged_feedback) {
  const auto started = std::chrono::steady_clock::now();
  ++iteration_;
  if (!all_finite(averaged_feedback)) return false;
  // The step is computed in place and undone when its result is not finite: G and both
  // moments are copied first (into buffers kept between steps, so their storage, which the
  // network may have seen, stays where it is).
  saved_params_.assign(g_->params.begin(), g_->params.end());
  saved_m_.assign(g_->adam.m.begin(), g_->adam.m.end());
  saved_v_.assign(g_->adam.v.begin(), g_->adam.v.end());
  saved_steps_ = g_->adam.steps;
  runtime::generator_step(*g_, inputs_.data(), averaged_feedback.data(),
                          static_cast<int>(options_.k) * options_.gan.batch);
  if (!all_finite(g_->params) || !all_finite(g_->adam.m) || !all_finite(g_->adam.v)) {
    undo_step();
    return false;
  }
  last_step_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return true;
}

void GanCoordinator::undo_step() {
  std::copy(saved_params_.begin(), saved_params_.end(), g_->params.begin());
  std::copy(saved_m_.begin(), saved_m_.end(), g_->adam.m.begin());
  std::copy(saved_v_.begin(), saved_v_.end(), g_->adam.v.begin());
  g_->adam.steps = saved_steps_;
}

std::optional<std::string> GanCoordinator::quarantine_reason(const std::string& identity) {
  const auto it = devices_.find(identity);
  if (it == devices_.end() || !it->second.quarantined) return std::nullopt;
  DeviceRefusals& device = it->second;
  if (device.quarantined_until && options_.now() >= *device.quarantined_until) {
    device.quarantined = false;  // its time is up; the next bad feedback quarantines it again
    device.quarantined_until.reset();
    device.consecutive_bad = 0;
    return std::nullopt;
  }
  std::string why = "this device sent " + std::to_string(device.consecutive_bad) +
                    " bad GAN feedbacks in a row and is quarantined ";
  if (device.quarantined_until) {
    const double left =
        std::chrono::duration<double>(*device.quarantined_until - options_.now()).count();
    why += "for " + std::to_string(static_cast<long long>(std::ceil(left))) + " more seconds";
  } else {
    why += "until the server restarts";
  }
  return why;
}

std::size_t GanCoordinator::quarantined_slotted() const {
  std::size_t n = 0;
  const auto now = options_.now();
  for (const auto& [identity, device] : devices_)
    if (device.quarantined && (!device.quarantined_until || now < *device.quarantined_until) &&
        slots_.count(identity) && !answered_.count(identity))
      ++n;
  return n;
}

std::string GanCoordinator::note_bad(const std::string& identity, bool out_of_bounds) {
  DeviceRefusals& device = devices_[identity];
  ++(out_of_bounds ? device.out_of_bounds : device.malformed);
  ++device.consecutive_bad;
  std::string note;
  if (device.consecutive_bad >= kReportAfterConsecutiveRefusals)
    note =
        " (" + std::to_string(device.consecutive_bad) + " bad feedbacks in a row from this device)";
  if (options_.quarantine_after > 0 && device.consecutive_bad >= options_.quarantine_after) {
    device.quarantined = true;
    ++device.quarantines;
    if (options_.quarantine_seconds > 0) {
      device.quarantined_until =
          options_.now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(options_.quarantine_seconds));
      note += "; QUARANTINED for " + common::short_number(options_.quarantine_seconds) + " s";
    } else {
      note += "; QUARANTINED until the server restarts";
    }
  }
  return note;
}

CoapResponse GanCoordinator::get_batches(const CoapRequest& request) {
  const std::string identity = identity_key(request);
  if (identity.empty())
    return text_response(CoapCode::kUnauthorized, "no identity (plain CoAP needs ?id=NAME)");
  if (auto why = quarantine_reason(identity)) {
    ++quarantine_refused_;
    ++devices_[identity].quarantined_refused;
    return text_response(CoapCode::kForbidden, "quarantined: " + *why);
  }
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
  if (!encoded) {  // the generator's samples are not finite: never sent (issue 37)
    if (batches_not_encodable_++ == 0)
      log("ERROR: GAN batches of iteration " + number_text(iteration_) +
          " cannot be encoded: " + encoded.error().message + "; GET /gan/batches answers 5.00");
    return text_response(CoapCode::kInternalServerError,
                         "GAN batches of iteration " + number_text(iteration_) +
                             " not sent: " + encoded.error().message);
  }
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
  if (auto why = quarantine_reason(identity)) {
    ++quarantine_refused_;
    ++devices_[identity].quarantined_refused;
    return text_response(CoapCode::kForbidden, "quarantined: " + *why);
  }
  // Bad feedback (issue 37): refused before anything is counted, summed or logged.
  auto refuse_bad = [&](int code, bool out_of_bounds, const std::string& reason) {
    ++(out_of_bounds ? out_of_bounds_ : malformed_);
    const std::string line = "feedback refused: " + reason + note_bad(identity, out_of_bounds);
    const auto& device = devices_[identity];
    if (device.consecutive_bad <= kReportAfterConsecutiveRefusals ||
        (device.quarantined && device.consecutive_bad == options_.quarantine_after))
      log("GAN " + transport::escape_untrusted(identity) + ": " + line);
    return text_response(code, line);
  };
  auto decoded = transport::decode_gan_feedback(
      request.payload, {.run_id = run_id_,
                        .batch = static_cast<std::uint32_t>(options_.gan.batch),
                        .width = kGanImageSize});
  if (!decoded) {
    if (decoded.error().code == transport::CodecErrorCode::kNonFiniteValue)
      return refuse_bad(CoapCode::kUnprocessableEntity, true, decoded.error().message);
    return refuse_bad(CoapCode::kBadRequest, false, decoded.error().message);
  }
  auto& feedback = decoded.value();
  const float bound = options_.max_feedback_magnitude;
  for (std::size_t i = 0; i < feedback.values.size(); i++)
    if (!(std::fabs(feedback.values[i]) <= bound))
      return refuse_bad(CoapCode::kUnprocessableEntity, true,
                        "value " + std::to_string(i) + " is " +
                            common::short_number(static_cast<double>(feedback.values[i])) +
                            ", beyond the bound of ±" +
                            common::short_number(static_cast<double>(bound)) +
                            " (--gan-max-feedback)");
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
  if (auto it = devices_.find(identity); it != devices_.end())
    it->second.consecutive_bad = 0;  // an accepted feedback ends a run of bad ones
  if (options_.clip_feedback_norm > 0) {
    double squares = 0;  // double: the squares of values near the bound overflow no float sum
    for (float v : feedback.values) squares += static_cast<double>(v) * static_cast<double>(v);
    const double norm = std::sqrt(squares);
    if (norm > options_.clip_feedback_norm) {
      const double scale = options_.clip_feedback_norm / norm;
      for (float& v : feedback.values) v = static_cast<float>(static_cast<double>(v) * scale);
      ++feedbacks_clipped_;
      if (devices_[identity].clipped++ == 0)  // once per device; /status counts the rest
        log("GAN " + transport::escape_untrusted(identity) + ": feedback of norm " +
            common::short_number(norm) + " clipped to " +
            common::short_number(options_.clip_feedback_norm) +
            " (--gan-clip-feedback; further clips are counted in /status)");
    }
  }
  const std::size_t floats = feedback.values.size();
  float* sum = feedback_sum_.data() + (slot->second % options_.k) * floats;
  for (std::size_t i = 0; i < floats; i++) sum[i] += feedback.values[i];
  ++feedbacks_;
  poll();
  return {CoapCode::kChanged, {}, {}};
}

bool GanCoordinator::poll() {
  // Quarantined workers are not waited for (they would only hold the iteration up).
  const bool everyone =
      !answered_.empty() && answered_.size() + quarantined_slotted() >= options_.workers;
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
  // The step is computed first and logged only if it was taken (issue 37); a WAL write that
  // fails puts it back, so G never holds a step the log does not.
  const std::uint64_t closing = iteration_;
  const bool stepped = apply_step(averaged);
  try {
    wal_->append(
        WalRecord{.version = closing + 1,
                  .identity = stepped ? kGanStepIdentity : kGanRefusedStepIdentity,
                  .sequence = m,
                  .update = stepped ? encode_step(averaged) : std::vector<std::uint8_t>{},
                  .entry_delays = {}});
  } catch (...) {
    iteration_ = closing;
    if (stepped) undo_step();
    throw;
  }
  if (!stepped) {
    ++steps_refused_;
    log("GAN iteration " + number_text(closing) + ": the step of " + std::to_string(m) +
        " feedbacks would make the generator or its Adam moments non-finite; refused, the "
        "iteration closes without a step");
  }
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
  // Per device: its bad feedbacks by kind, the run of them, quarantine (identities escaped).
  nlohmann::json devices = nlohmann::json::object();
  const auto now = options_.now();
  for (const auto& [identity, d] : devices_)
    devices[transport::escape_untrusted(identity)] = {
        {"out_of_bounds", d.out_of_bounds},
        {"malformed", d.malformed},
        {"quarantined_refused", d.quarantined_refused},
        {"clipped", d.clipped},
        {"consecutive_bad", d.consecutive_bad},
        {"reported", d.consecutive_bad >= kReportAfterConsecutiveRefusals},
        {"quarantines", d.quarantines},
        {"quarantined", d.quarantined && (!d.quarantined_until || now < *d.quarantined_until)}};
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
                        {"out_of_bounds_refused", out_of_bounds_},
                        {"quarantine_refused", quarantine_refused_},
                        {"steps_refused", steps_refused_},
                        {"batches_not_encodable", batches_not_encodable_},
                        {"max_feedback_magnitude", options_.max_feedback_magnitude},
                        {"feedbacks_clipped", feedbacks_clipped_},
                        {"clip_feedback_norm", options_.clip_feedback_norm},
                        {"devices_refused", devices},
                        {"swap_rounds", swap_rounds_},
                        {"batches_sent", batches_sent_},
                        {"last_step_seconds", last_step_seconds_},
                        {"recovered_checkpoint_iteration", recovery_.checkpoint_iteration},
                        {"replayed_iterations", recovery_.replayed},
                        {"replayed_refused_steps", recovery_.replayed_refused}}
      .dump();
}

}  // namespace edgetrain::server
