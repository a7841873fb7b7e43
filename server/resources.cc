#include "server/resources.h"

#include <nlohmann/json.hpp>
#include <sys/eventfd.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <ctime>
#include <stdexcept>
#include <variant>

#include "common/number_text.h"
#include "transport/codec.h"
#include "transport/identity.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {
namespace {

using transport::CoapCode;
using transport::CoapRequest;
using transport::CoapResponse;
using transport::text_response;
using transport::escape_untrusted;  // for every identity, query or other peer text shown in a log,
                                    // an answer or /status

int coap_code_for(SubmitOutcome outcome) {
  switch (outcome) {
    case SubmitOutcome::kApplied:
    case SubmitOutcome::kDuplicate:
      return CoapCode::kChanged;
    case SubmitOutcome::kTooLarge:
      return CoapCode::kRequestEntityTooLarge;
    case SubmitOutcome::kMalformed:
      return CoapCode::kBadRequest;
    case SubmitOutcome::kWrongModel:
    case SubmitOutcome::kTooStale:
    case SubmitOutcome::kOldSequence:
      return CoapCode::kConflict;
    case SubmitOutcome::kNotDurable:
      return CoapCode::kInternalServerError;
    case SubmitOutcome::kOutOfBounds:
      return CoapCode::kUnprocessableEntity;
    case SubmitOutcome::kQuarantined:
      return CoapCode::kForbidden;
  }
  return CoapCode::kInternalServerError;
}

}  // namespace

namespace {
// The health table forgets refusal counts along with the identity it pushes out.
DeviceHealthOptions health_options(const ResourceOptions& options, ServerState& state) {
  DeviceHealthOptions health = options.health;
  health.on_forget = [&state, chained = health.on_forget](const std::string& identity) {
    state.forget_device(identity);
    if (chained) chained(identity);
  };
  return health;
}
}  // namespace

ServerResources::ServerResources(ServerState& state, ResourceOptions options)
    : state_(state),
      options_(std::move(options)),
      health_(health_options(options_, state_)),
      repeats_(options_.repeats) {
  state_.set_on_sync_finished([wakers = wakers_] { wakers->wake_all(); });
}

ServerResources::LoopWakers::~LoopWakers() {
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
}

void ServerResources::LoopWakers::wake(std::size_t loop) {
  std::lock_guard lock(mutex);
  if (loop >= fds.size() || fds[loop] < 0) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t written =
      ::write(fds[loop], &one, sizeof one);  // EAGAIN: already signalled
}

void ServerResources::LoopWakers::wake_all() {
  std::lock_guard lock(mutex);
  const std::uint64_t one = 1;
  for (int fd : fds) {
    if (fd < 0) continue;
    [[maybe_unused]] const ssize_t written = ::write(fd, &one, sizeof one);
  }
}

void ServerResources::wake_loops_with_answers(std::size_t except) {
  for (std::size_t m = 0; m < loops_.size(); ++m)
    if (m != except && !loops_[m].ready.empty()) wakers_->wake(m);
}

void ServerResources::log(const std::string& line) const { log_at(logging::Level::kInfo, line); }

void ServerResources::log_at(logging::Level level, const std::string& line) const {
  if (options_.log_at) {
    options_.log_at(level, line);
  } else if (options_.log) {
    options_.log(line);
  }
}

void ServerResources::log_repeating(logging::Level level, std::string_view kind,
                                    const std::string& line) {
  if (!logging::enabled(level) && options_.log_at) return;  // dropped anyway: not worth counting
  for (const std::string& shown : repeats_.admit(kind, line, health_.options().now()))
    log_at(level, shown);
}

std::string identity_key(const CoapRequest& request) {
  if (request.authentication != transport::PeerAuthentication::kNone) return request.identity;
  if (!transport::is_plain_identity(request.identity)) return {};
  return kUnauthenticatedPrefix + request.identity;
}

void ServerResources::note_request(const CoapRequest& request, bool worker) {
  ++requests_;
  ingress_payload_bytes_ += request.payload.size();
  const std::string identity = identity_key(request);
  if (!identity.empty() && health_.note_request(identity, worker, request.payload.size())) {
    if (request.authentication == transport::PeerAuthentication::kNone) {
      log("first request from '" + escape_untrusted(identity) + "' over plain CoAP from " +
          request.peer_address + ": the identity is declared, NOT authenticated");
    } else {
      log("first request from '" + escape_untrusted(identity) + "'");
    }
  }
}

namespace {
// Adds the calling thread's CPU time between construction and destruction to `sum`: what
// answering GET /model costs the server (clock_gettime, ~30 ns a call).
class ThreadCpuTimer {
 public:
  explicit ThreadCpuTimer(double& sum) : sum_(sum), start_(now()) {}
  ~ThreadCpuTimer() { sum_ += now() - start_; }
  ThreadCpuTimer(const ThreadCpuTimer&) = delete;
  ThreadCpuTimer& operator=(const ThreadCpuTimer&) = delete;

 private:
  static double now() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  }
  double& sum_;
  double start_;
};
}  // namespace

std::variant<ModelQuery, std::string> parse_model_query(std::string_view query) {
  ModelQuery parsed;
  if (query.empty()) return parsed;
  std::optional<std::uint64_t>& since = parsed.since;
  for (std::size_t start = 0; start <= query.size();) {
    std::size_t end = query.find('&', start);
    if (end == std::string_view::npos) end = query.size();
    const std::string_view part = query.substr(start, end - start);
    start = end + 1;
    // id=NAME is the declared identity of plain CoAP requests (transport/), not ours.
    if (part.substr(0, 3) == "id=") continue;
    // The device takes fp16 increments (worker --pull-values fp16-increment); the server
    // sends them when its own --pull-values says so.
    if (part == "values=fp16-increment") {
      parsed.fp16_increments = true;
      continue;
    }
    constexpr std::string_view kSince = "since=";
    if (part.substr(0, kSince.size()) != kSince)
      return "unknown query parameter '" + escape_untrusted(part.substr(0, 40)) +
             "' (known: since=VERSION, values=fp16-increment, and id=NAME on plain CoAP)";
    if (since) return std::string("since= given twice");
    const std::string_view digits = part.substr(kSince.size());
    std::uint64_t value = 0;
    const auto [rest, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || error != std::errc() || rest != digits.data() + digits.size() ||
        digits[0] == '+')
      return "since= needs a decimal version below 2^64, got '" +
             escape_untrusted(digits.substr(0, 40)) + "'";
    since = value;
  }
  return parsed;
}

CoapResponse ServerResources::get_model(const CoapRequest& request) {
  std::lock_guard lock(mutex_);
  return get_model_locked(request);
}

CoapResponse ServerResources::get_model_locked(const CoapRequest& request) {
  note_request(request, true);
  const auto parsed = parse_model_query(request.query);
  if (const auto* problem = std::get_if<std::string>(&parsed)) {
    ++bad_model_queries_;
    return text_response(CoapCode::kBadRequest, "bad query: " + *problem);
  }
  ++model_pulls_;
  const ModelQuery& query = std::get<ModelQuery>(parsed);
  const std::optional<std::uint64_t> since = query.since;
  const ThreadCpuTimer timer(model_pull_cpu_seconds_);
  try {
    // The cheap pull answers each device from the record of its copy; a request without an
    // identity (plain CoAP without ?id=) gets the exact model as before.
    const std::string identity = state_.replica_records() ? identity_key(request) : std::string();
    if (!identity.empty()) {
      const ServerState::DeviceModelReply reply = state_.pull_for_device(identity, since, query.fp16_increments);
      if (reply.delta) ++model_delta_pulls_;
      return {CoapCode::kContent, {reply.bytes.begin(), reply.bytes.end()}, reply.etag};
    }
    if (since) {
      const ServerState::ModelReply reply = state_.encoded_model_since(*since);
      if (reply.delta) {
        ++model_delta_pulls_;
        return {
            CoapCode::kContent, {reply.bytes.begin(), reply.bytes.end()}, state_.served_version()};
      }
    }
    const auto bytes = state_.encoded_model();
    return {CoapCode::kContent, {bytes.begin(), bytes.end()}, state_.served_version()};
  } catch (const std::exception& e) {
    // Updates are checked so that this cannot happen; if it does, say so loudly.
    const std::string why = std::string("cannot serve the model at version ") +
                            std::to_string(state_.version()) + ": " + e.what();
    log_at(logging::Level::kError,
           "ERROR: " + why +
               " (a restart with --rollback-non-finite resumes from the last finite state)");
    return text_response(CoapCode::kInternalServerError, why);
  }
}

std::string device_refusals_json(const ServerState& state) {
  nlohmann::json devices = nlohmann::json::object();
  for (const auto& [identity, device] : state.device_refusals()) {
    nlohmann::json refused = nlohmann::json::object();
    for (const auto& [reason, count] : device.refused) refused[reason] = count;
    devices[escape_untrusted(identity)] = {{"refused", refused},
                                           {"consecutive_bad", device.consecutive_bad},
                                           {"reported", device.reported()},
                                           {"quarantined", device.quarantined},
                                           {"quarantines", device.quarantines}};
  }
  return devices.dump();
}

CoapResponse ServerResources::post_update(const CoapRequest& request) {
  std::lock_guard lock(mutex_);
  return post_update_locked(request, 0);
}

CoapResponse ServerResources::post_update_locked(const CoapRequest& request, std::size_t loop,
                                                 std::optional<ServerState::DecodedBody> decoded) {
  note_request(request, true);
  // Plain CoAP (edgetrain-server --insecure) proves nothing: the declared name gets its own
  // "unauthenticated:" sequence space, so a plaintext peer can neither post as a proven
  // device nor block one with a high sequence number, while replays are still dropped.
  if (!options_.updates_refused_because.empty()) {
    ++refused_["wrong mode"];
    return text_response(CoapCode::kMethodNotAllowed, options_.updates_refused_because);
  }
  const std::string identity = identity_key(request);
  if (identity.empty()) {
    ++refused_["no identity"];
    if (request.authentication == transport::PeerAuthentication::kNone)
      return text_response(
          CoapCode::kUnauthorized,
          "plain CoAP updates must declare an identity: ?id=NAME (1..64 of [A-Za-z0-9._-])");
    return text_response(CoapCode::kUnauthorized,
                         "no DTLS identity: updates must come over DTLS (PSK or certificate)");
  }
  if (request.authentication == transport::PeerAuthentication::kPsk && options_.is_authorized &&
      !options_.is_authorized(identity)) {
    ++refused_["not authorized"];
    log_repeating(
        logging::Level::kWarn, "not authorized from " + identity,
        "refused an update from '" + escape_untrusted(identity) + "': no longer in the keystore");
    return text_response(CoapCode::kForbidden,
                         "identity '" + escape_untrusted(identity) + "' is not authorized");
  }
  if (request.defer) {
    StagedSubmit staged = decoded ? state_.stage(identity, request.payload, std::move(*decoded))
                                  : state_.stage(identity, request.payload);
    if (staged.settled) return update_response(*staged.settled, identity, true);
    awaiting_sync_[staged.ticket].push_back({identity, request.defer(), loop});
    if (loop < loops_.size()) ++loops_[loop].updates_deferred;
    state_.start_commit();
    return {};  // ignored: the answer leaves from serve_once() or answer_durable_updates()
  }
  if (state_.staged_updates() > 0) {  // submit() needs nothing staged
    settle(true);
    wake_loops_with_answers(loop);
    // This thread may send only its own loop's answers; the other loops send theirs.
    if (loop < loops_.size()) send_ready(std::move(loops_[loop].ready));
  }
  return update_response(state_.submit(identity, request.payload), identity, true);
}

CoapResponse ServerResources::update_response(const SubmitResult& result,
                                              const std::string& identity, bool original) {
  const int code = coap_code_for(result.outcome);
  if (result.acknowledged()) {
    health_.note_answer(identity, 8);  // the version
    if (result.outcome == SubmitOutcome::kApplied && original) {
      ++applied_;
      health_.note_accepted(identity, result.staleness);
      if (options_.log_every_applied && result.version % options_.log_every_applied == 0)
        log("version " + std::to_string(result.version) + " (" + std::to_string(applied_) +
            " updates applied since start; " + ingress_summary() + ")");
    } else {
      ++duplicates_;
      log_repeating(logging::Level::kInfo, "duplicate from " + identity,
                    "duplicate update from '" + escape_untrusted(identity) +
                        "' answered with version " + std::to_string(result.version));
    }
    return {code, transport::encode_update_reply(result.version), {}};
  }
  ++refused_[submit_outcome_name(result.outcome)];
  const std::string reply =
      std::string(submit_outcome_name(result.outcome)) + ": " + result.diagnostic;
  health_.note_answer(identity, reply.size());
  // The diagnostic is the decoder's or the store's own text (numbers, never the peer's bytes).
  // A quarantined device's refusals are counted, not logged: the quarantine was.
  if (result.outcome != SubmitOutcome::kQuarantined)
    log_repeating(logging::Level::kWarn,
                  std::string(submit_outcome_name(result.outcome)) + " from " + identity,
                  "refused an update from '" + escape_untrusted(identity) + "' (" +
                      transport::coap_code_string(code) + " " +
                      submit_outcome_name(result.outcome) + "): " + result.diagnostic);
  return text_response(code, reply);
}

ServerResources::LoopLock::LoopLock(std::mutex& mutex, Loop& loop) : loop_(loop) {
  const auto asked = std::chrono::steady_clock::now();
  lock_ = std::unique_lock(mutex);
  acquired_ = std::chrono::steady_clock::now();
  loop_.lock_wait += acquired_ - asked;
}

ServerResources::LoopLock::~LoopLock() {
  loop_.lock_held += std::chrono::steady_clock::now() - acquired_;
}

std::size_t ServerResources::loop_of(const transport::CoapDtlsServer& server) const {
  for (std::size_t n = 0; n < loops_.size(); ++n)
    if (loops_[n].server == &server) return n;
  throw std::logic_error("serve_once: the server was not attach()ed");
}

// The network part (DTLS, block-wise assembly, libcoap's bookkeeping) runs without the
// mutex, so loops overlap there; handlers and settling take it.
void ServerResources::serve_once(transport::CoapDtlsServer& server, int idle_timeout_ms) {
  const std::size_t n = loop_of(server);  // loops_ no longer changes size
  bool poll = false;
  {
    LoopLock lock(mutex_, loops_[n]);
    // A loop without a wake descriptor looks every millisecond for a finished sync or
    // answers another loop queued; with one it is woken for those.
    poll = !loops_[n].wakeable && (state_.staged_updates() > 0 || !loops_[n].ready.empty());
    // Answers queued before this pass are sent after it: do not wait for datagrams first.
    if (loops_[n].wakeable && !loops_[n].ready.empty()) poll = true;
  }
  server.run_once(poll ? (loops_[n].wakeable ? 0 : 1) : idle_timeout_ms);
  std::vector<ReadyAnswer> ready;
  {
    LoopLock lock(mutex_, loops_[n]);
    settle(false);
    wake_loops_with_answers(n);
    ready = std::move(loops_[n].ready);
    loops_[n].ready.clear();
  }
  send_ready(
      std::move(ready));  // this loop's sessions, on its thread; DTLS encryption outside the mutex
  LoopLock lock(mutex_, loops_[n]);
  tick(server, loops_[n]);
}

std::size_t ServerResources::answer_durable_updates(bool wait) {
  std::lock_guard lock(mutex_);
  const std::size_t answered = settle(wait);
  for (Loop& loop : loops_) send_ready(std::move(loop.ready));
  return answered;
}

std::size_t ServerResources::settle(bool wait) {
  std::size_t answered = 0;
  do {
    for (const SettledSubmit& settled : state_.finish_commit(wait)) {
      auto it = awaiting_sync_.find(settled.ticket);
      if (it == awaiting_sync_.end()) continue;
      bool original = true;
      for (Waiting& waiting : it->second) {
        CoapResponse response = update_response(settled.result, waiting.identity, original);
        original = false;
        ++answered;
        if (waiting.loop < loops_.size()) {
          loops_[waiting.loop].ready.push_back({std::move(waiting.answer), std::move(response)});
        } else {
          waiting.answer.send(response);  // not attached (tests calling handlers): one thread
        }
      }
      awaiting_sync_.erase(it);
    }
  } while (wait && state_.staged_updates() > 0);
  return answered;
}

std::size_t ServerResources::send_ready(std::vector<ReadyAnswer> ready) {
  for (ReadyAnswer& r : ready) r.answer.send(r.response);
  return ready.size();
}

std::string ServerResources::loops_json() const {
  nlohmann::json loops = nlohmann::json::array();
  for (const Loop& loop : loops_)
    loops.push_back({{"requests", loop.requests},
                     {"updates_deferred", loop.updates_deferred},
                     {"lock_wait_seconds", std::chrono::duration<double>(loop.lock_wait).count()},
                     {"lock_held_seconds", std::chrono::duration<double>(loop.lock_held).count()}});
  return loops.dump();
}

std::string ServerResources::status_json() const {
  using nlohmann::json;
  const double uptime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  json refused = json::object();
  std::uint64_t refused_total = 0;
  for (const auto& [reason, count] : refused_) {
    refused[reason] = count;
    refused_total += count;
  }
  std::vector<std::string> workers_seen;
  for (const auto& [identity, record] : health_.devices())
    if (record.worker) workers_seen.push_back(escape_untrusted(identity));
  json status = {
      {"version", state_.version()},
      {"learning_rate", common::float_as_written(state_.current_learning_rate())},  // the schedule's lr(t) for the next update
      {"model", state_.model().spec().name},
      {"parameters", state_.model().parameter_count()},
      {"updates_applied_since_start", applied_.load()},
      {"duplicates_answered", duplicates_},
      {"updates_refused", refused_total},
      {"updates_refused_by_reason", refused},
      {"updates_clipped", state_.updates_clipped()},
      {"devices_refused", json::parse(device_refusals_json(state_))},
      {"workers_seen", json(workers_seen)},
      {"workers_known", state_.sequences().size()},
      {"devices", json::parse(devices_json())},
      {"monitors", json::parse(monitors_json())},
      {"devices_silent", health_.silent_workers()},
      {"silent_after_seconds", health_.options().silent_after_seconds},
      {"devices_forgotten", health_.forgotten()},
      {"requests", requests_},
      {"model_pulls", model_pulls_},
      {"model_delta_pulls", model_delta_pulls_},
      {"model_queries_refused", bad_model_queries_},
      {"model_pull_cpu_seconds", model_pull_cpu_seconds_},
      {"cheap_pull", state_.replica_records() ? json::parse(state_.replica_records()->stats_json())
                                              : json(nullptr)},
      {"ingress_payload_bytes", ingress_payload_bytes()},
      {"ingress_socket_bytes", ingress_socket_bytes()},
      {"ingress_socket_datagrams", ingress_socket_datagrams()},
      {"loops", json::parse(loops_json())},
      {"egress_socket_bytes", egress_socket_bytes()},
      {"egress_socket_datagrams", egress_socket_datagrams()},
      {"uptime_seconds", std::round(uptime * 10) / 10},
      {"checkpoint_version", state_.checkpoint_version()},
      {"updates_since_checkpoint", state_.updates_since_checkpoint()},
  };
  const SubmitTimings& timings = state_.submit_timings();
  status["submit_seconds"] = {{"applied_updates", timings.applied_updates},
                              {"decode", timings.decode_seconds},
                              {"wal_append_fdatasync", timings.wal_seconds},
                              {"apply", timings.apply_seconds},
                              {"checkpoints", timings.checkpoint_seconds}};
  if (!state_.checkpoint_error().empty()) status["checkpoint_error"] = state_.checkpoint_error();
  {
    std::lock_guard lock(accuracy_mutex_);
    if (last_accuracy_)
      status["last_test_accuracy"] = {{"version", last_accuracy_->first},
                                      {"accuracy", last_accuracy_->second}};
    else
      status["last_test_accuracy"] = nullptr;
  }
  for (const auto& [key, value] : options_.facts) status[key] = value;
  if (options_.extra_status) status.update(json::parse(options_.extra_status()));

  return status.dump(2) + "\n";
}

CoapResponse ServerResources::get_status(const CoapRequest& request) {
  std::lock_guard lock(mutex_);
  return get_status_locked(request);
}

CoapResponse ServerResources::get_status_locked(const CoapRequest& request) {
  note_request(request, false);
  CoapResponse response = request.query.empty() ? text_response(CoapCode::kContent, status_json())
                                                : get_device_status(request.query);
  health_.note_answer(identity_key(request), response.payload.size());
  return response;
}

void ServerResources::report_accuracy(std::uint64_t version, double accuracy) {
  std::lock_guard lock(accuracy_mutex_);
  last_accuracy_ = {version, accuracy};
  ++evaluations_;
}

std::string ServerResources::ingress_summary() const {
  std::string summary = "ingress " + std::to_string(ingress_payload_bytes()) + " payload bytes";
  if (!loops_.empty()) {
    summary += ", " + std::to_string(ingress_socket_bytes()) + " socket bytes in " +
               std::to_string(ingress_socket_datagrams()) + " datagrams; egress " +
               std::to_string(egress_socket_bytes()) + " socket bytes in " +
               std::to_string(egress_socket_datagrams()) + " datagrams";
  }
  return summary;
}

std::size_t ServerResources::attach(transport::CoapDtlsServer& server) {
  std::lock_guard lock(mutex_);
  const std::size_t n = loops_.size();
  loops_.emplace_back();
  loops_.back().server = &server;
  {
    const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);  // -1: this loop polls
    std::lock_guard wakers_lock(wakers_->mutex);
    wakers_->fds.push_back(fd);
    loops_.back().wakeable = fd >= 0 && server.watch_wake_fd(fd);
  }
  server.add_resource("model", transport::Method::kGet, [this, n](const CoapRequest& r) {
    LoopLock lock(mutex_, loops_[n]);
    ++loops_[n].requests;
    CoapResponse response = get_model_locked(r);
    health_.note_answer(identity_key(r), response.payload.size());
    return response;
  });
  server.add_resource("update", transport::Method::kPost, [this, n](const CoapRequest& r) {
    // Decoding reads no state that changes (ServerState::decode_body), so the loops decode
    // in parallel, before the mutex; only bodies that will be staged: deferrable ones that
    // name an identity, with updates taken in this mode.
    std::optional<ServerState::DecodedBody> decoded;
    if (r.defer && options_.updates_refused_because.empty() && !identity_key(r).empty())
      decoded = state_.decode_body(r.payload);
    LoopLock lock(mutex_, loops_[n]);
    ++loops_[n].requests;
    return post_update_locked(r, n, std::move(decoded));
  });
  server.add_resource("status", transport::Method::kGet, [this, n](const CoapRequest& r) {
    LoopLock lock(mutex_, loops_[n]);
    ++loops_[n].requests;
    return get_status_locked(r);
  });
  server.make_observable("status");
  return n;
}

}  // namespace edgetrain::server
