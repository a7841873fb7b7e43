// edgetrain-loadgen: load and latency figures for a running edgetrain-server (issue 5).
// A benchmark program that prints figures; never a test. tests/bench/run_server_bench.sh
// starts a real edgetrain-server process on 127.0.0.1 and runs the subcommands:
//
//   keystore  writes a keystore of N load devices (+ one for status and transfer probes)
//   load      holds N DTLS-PSK sessions open in one libcoap context and posts paper-CNN
//             AdaComp updates (c = 0.01, ~21 kB, ~21 Block1 blocks) with a bounded number
//             in flight, for a bounded count and time; prints sessions, updates/s, server
//             CPU per update, datagram bytes per update vs. the codec bytes, and where the
//             server's submit time went (its /status breakdown).
//             --replay WAL_FILE posts the updates recorded in a server's write-ahead log
//             (tests/bench/record_updates.sh records one from real edgetrain-workers)
//             instead of synthetic ones: read with the server's own WAL reader, decoded,
//             and re-encoded with only the header re-stamped (this device's next sequence
//             number, the newest version acknowledged as t_fetch), in log order, cycling;
//             indices and values as recorded, in the value encoding they were recorded in.
//             --sign-scale sends values as sign + scale (value encoding 2 of
//             transport/CODEC.md: ~6 Block1 blocks instead of 22), synthetic or replayed
//             (then each tensor's recorded values become ±(their mean magnitude), as the
//             worker's --sign-scale makes them). The summary line names the source:
//             source=synthetic or source=replay records=N.
//             --shard-ports P0 P1 ... drives a sharded server (edgetrain-server --shard I/N)
//             as workers do: a session per device and shard, every update cut into the
//             shards' parts by the worker's own ShardedUpdateSplitter, each part with the
//             newest version its shard acknowledged as t_fetch, all parts posted together,
//             the update acknowledged when every shard acknowledged its part; per shard the
//             versions made (one per acknowledged part) and, with --shard-pids, the CPU.
//   transfer  through a user-space UDP relay that delays every datagram by D ms one way:
//             time of one update post and of one dense model pull (lock-step Block2),
//             then of sparse pulls (GET /model?since=V) after N updates by others
//             (--delta-after, default 3 and 10: a worker's typical delta with N workers
//             pulling before every step), with bytes and datagrams each way
//             time of one update post and of one model pull (lock-step Block2)
//   wan       through the relay with D ms one way and a loss rate, with given CoAP timing
//             parameters: per trial, a fresh session's first small request (handshake
//             included), a small request on the open session, and one update post;
//             prints each trial and the median / mean / 90th percentile / max
//   flood     the handshake-flood goals of transport/README.md ("Handshake floods"), in two
//             phases against one server: without a flood, then with N spoofed ClientHellos
//             per second from ever new loopback addresses; in each, M established devices
//             post updates (their rate) while a child process (handshakes) opens a fresh
//             session every I s with a deadline of D s (the share that got in within D);
//             prints both phases side by side
//   spoof     only the flood: ClientHellos from ever new loopback source addresses
//   handshakes  only the prober: a fresh session's first request every I s, deadline D s,
//             for S s; results as JSON (--out)
//
// The synthetic updates are the paper's top-k of a Gaussian random gradient (the index
// pattern of a real gradient differs, the sizes hardly: k per tensor is fixed by c; --replay
// brings the real patterns). The gradient is computed once per pattern, and a log is read
// and decoded once, not per post: the load generator must not be the bottleneck.
//
// Exit status: 0 done, 1 a failure while running (server unreachable, ...), 2 bad usage or
// input (settings that exclude each other, a --replay log that is missing, empty, damaged or
// of another model, a server running another model than --model).
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/settings.h"
#include "worker/compressor.h"
#include "model/model.h"
#include "model/model_shards.h"
#include "worker/model_replica.h"
#include "worker/sharded_server_channel.h"
#include "server/keystore.h"
#include "server/resources.h"
#include "server/write_ahead_log.h"
#include "tests/support/dtls_hello_flood.h"
#include "tests/support/udp_delay_proxy.h"
#include "transport/bench_load.h"
#include "transport/codec.h"
#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain;
using Clock = std::chrono::steady_clock;

// Bad usage or input (exit status 2, like a settings error), as opposed to a failure while
// running (1): the person has to change the command, not retry it.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Identity of the extra device used for /status and the transfer probes, so that the load
// devices' sequence numbers stay theirs alone.
constexpr const char* kProbeDevice = "loadgen-probe";

std::string load_device_name(std::size_t i) {
  char name[32];
  std::snprintf(name, sizeof(name), "loadgen-%05zu", i);
  return name;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---- keystore -----------------------------------------------------------------------
int write_keystore(const std::string& path, std::size_t devices) {
  // server::add_device rewrites and fsyncs the whole file per device (quadratic, and slow
  // for thousands); the format is two lines of TOML, checked by Keystore::load below.
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  std::ostringstream text;
  text << "# edgetrain keystore written by edgetrain-loadgen (benchmark devices)\n[devices]\n";
  auto add = [&](const std::string& name) {
    std::vector<std::uint8_t> key(32);
    urandom.read(reinterpret_cast<char*>(key.data()), static_cast<std::streamsize>(key.size()));
    if (!urandom) throw std::runtime_error("cannot read /dev/urandom");
    text << name << " = \"" << server::to_hex(key) << "\"\n";
  };
  add(kProbeDevice);
  for (std::size_t i = 0; i < devices; ++i) add(load_device_name(i));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  ::fchmod(fd, 0600);
  const std::string bytes = text.str();
  const bool written =
      ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  ::close(fd);
  if (!written) throw std::runtime_error("cannot write " + path);
  const auto keystore = server::Keystore::load(path);
  std::printf("keystore %s: %zu devices (%zu load devices + %s)\n", path.c_str(), keystore.size(),
              devices, kProbeDevice);
  return 0;
}

transport::PskCredentials credentials(const server::Keystore& keystore, const std::string& name) {
  auto key = keystore.key_for(name);
  if (!key)
    throw std::runtime_error("device '" + name +
                             "' is not in the keystore (run the keystore subcommand)");
  return {name, *key};
}

// ---- server process figures -----------------------------------------------------------
// utime + stime of a process in seconds, from /proc/<pid>/stat (fields 14 and 15).
double process_cpu_seconds(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close_paren = content.rfind(')');  // the command name may contain spaces
  if (close_paren == std::string::npos)
    throw std::runtime_error("cannot read /proc/" + std::to_string(pid) + "/stat");
  std::istringstream fields(content.substr(close_paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int index = 3; fields >> field; ++index) {  // the field after ")" is number 3 (state)
    if (index == 14) utime = std::stoull(field);
    if (index == 15) {
      stime = std::stoull(field);
      break;
    }
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// This process's own CPU time (user + system), to tell whether the load generator or the
// server is the one that limits a run.
double own_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

nlohmann::json server_status(transport::CoapDtlsClient& client) {
  const auto reply = client.request(transport::Method::kGet, "status");
  if (reply.code != transport::CoapCode::kContent)
    throw std::runtime_error("GET /status answered " + transport::coap_code_string(reply.code));
  return nlohmann::json::parse(std::string(reply.payload.begin(), reply.payload.end()));
}

// ---- updates ---------------------------------------------------------------------------
struct UpdateFactory {
  runtime::Model model;
  std::vector<transport::SparseUpdate> patterns;
  transport::ValueEncoding values;

  // kSignScale: the compressor quantises the top-k values to ±(mean magnitude) per tensor,
  // as a worker's --sign-scale does, so that the encoder accepts them.
  UpdateFactory(const std::string& model_name, double compression_rate, std::size_t pattern_count,
                transport::ValueEncoding value_encoding = transport::ValueEncoding::kFp32)
      : model(runtime::model_spec_from_argument(model_name)), values(value_encoding) {
    std::vector<runtime::TensorSlice> layout;
    for (const auto& t : model.tensors())
      layout.push_back({t.offset, static_cast<std::uint32_t>(t.size)});
    runtime::CompressorOptions options;
    options.compression_rate = compression_rate;
    options.value_encoding = value_encoding;
    runtime::Compressor compressor(layout, options);
    std::mt19937_64 random(42);
    std::normal_distribution<float> gradient_value(0.0f, 1e-3f);
    std::vector<float> gradient(model.parameter_count());
    for (std::size_t p = 0; p < pattern_count; ++p) {
      for (float& g : gradient) g = gradient_value(random);
      transport::SparseUpdate update;
      compressor.compress(gradient, update);
      update.model_id = model.layout_id();
      patterns.push_back(std::move(update));
    }
  }

  // Pattern `pattern` (cycling) with this header, for posting or splitting into shards' parts.
  const transport::SparseUpdate& stamped(std::size_t pattern, std::uint64_t sequence,
                                         std::uint64_t fetched_version) {
    transport::SparseUpdate& update = patterns[pattern % patterns.size()];
    update.sequence = sequence;
    update.fetched_version = fetched_version;
    return update;
  }

  std::vector<std::uint8_t> encode(std::size_t pattern, std::uint64_t sequence,
                                   std::uint64_t fetched_version) {
    const transport::SparseUpdate& update = stamped(pattern, sequence, fetched_version);
    auto encoded = transport::encode_sparse_update(update, {values});
    if (!encoded) throw std::runtime_error("cannot encode an update: " + encoded.error().message);
    return std::move(encoded).value();
  }
};

const char* value_encoding_name(transport::ValueEncoding encoding) {
  switch (encoding) {
    case transport::ValueEncoding::kFp32:
      return "fp32";
    case transport::ValueEncoding::kFp16:
      return "fp16";
    case transport::ValueEncoding::kSignScale:
      return "sign-scale";
    case transport::ValueEncoding::kFp16Increment:
      return "fp16-increment";
  }
  return "unknown";
}

// The updates recorded in a server's write-ahead log, posted again in log order (cycling)
// with only the header re-stamped for the server being loaded: the real index patterns and
// values of workers that trained, instead of the top-k of a random gradient.
//
// Each record is decoded against the model the server runs (so a log of another model is
// refused here, not by thousands of 4.00 answers) and re-encoded per post. The WAL keeps
// the codec bytes as received, but the decoded update does not say which value encoding
// they used; re-encoding the record with its own header in each encoding tells, as exactly
// one reproduces the recorded bytes (the encoding is one byte of each tensor record, and
// the codec's other choices are functions of the indices). Posts then use that encoding,
// so a replayed post has the recorded size as well as the recorded values.
struct ReplayedUpdates {
  std::string path;
  std::vector<transport::SparseUpdate> updates;
  std::vector<transport::ValueEncoding> encodings;  // of updates[i] when posted
  std::size_t wal_records = 0;                      // every intact record of the log
  std::size_t placeholders = 0;  // records without entries (repair-wal's stand-ins): not posted
  std::size_t not_reproduced =
      0;  // records no encoding reproduced bit for bit: posted as fp32 (exact values)
  std::uint64_t torn_tail_bytes = 0;
  std::size_t next = 0;     // the record the next post sends
  std::uint64_t posts = 0;  // records handed out so far (cycles = posts / updates.size())
  double mean_bytes = 0, mean_entries = 0;  // as posted
  std::size_t min_bytes = 0, max_bytes = 0;

  ReplayedUpdates(const std::string& wal_path, const runtime::Model& model, bool sign_scale)
      : path(wal_path) {
    std::error_code error;
    if (!std::filesystem::is_regular_file(wal_path, error))
      throw UsageError("--replay " + wal_path +
                       ": no such file (record one with tests/bench/record_updates.sh)");
    if (std::filesystem::file_size(wal_path, error) == 0 && !error)
      throw UsageError("--replay " + wal_path + ": the file is empty, not a write-ahead log");
    server::WalContents wal;
    try {
      wal = server::read_wal(wal_path);
    } catch (const server::WalError& e) {
      throw UsageError(std::string("--replay: ") + e.what());
    }
    // Damage in the middle is refused: the records after it were acknowledged once, but a
    // log that does not check out is not a recording to measure with. A torn tail (the last
    // write of a crash) is what every crashed server's log may end with; its intact records
    // are the recording.
    if (!wal.damage.empty())
      throw UsageError("--replay: " + server::describe_wal_damage(wal_path, wal) +
                       " (a damaged log; edgetrain-server repair-wal lists and repairs it)");
    torn_tail_bytes = wal.dropped_bytes;
    wal_records = wal.records.size();
    std::vector<std::uint32_t> sizes;
    for (const auto& t : model.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
    if (wal.header.model_id != model.layout_id())
      throw UsageError("--replay " + wal_path +
                       ": the log's updates are for another model (layout id " +
                       hex(wal.header.model_id) + ") than the server's, '" + model.spec().name +
                       "' (layout id " + hex(model.layout_id()) + ", --model)" +
                       builtin_named(wal.header.model_id));
    const transport::ModelLayout layout{model.layout_id(), sizes};
    double total_bytes = 0, total_entries = 0;
    for (std::size_t r = 0; r < wal.records.size(); ++r) {
      const server::WalRecord& record = wal.records[r];
      auto decoded = transport::decode_sparse_update(record.update, layout);
      if (!decoded)
        throw UsageError("--replay " + wal_path + ": record " + std::to_string(r) + " (version " +
                         std::to_string(record.version) + ") is not an update of '" +
                         model.spec().name + "': " + decoded.error().message);
      transport::SparseUpdate update = std::move(decoded).value();
      std::size_t entries = 0;
      for (const auto& t : update.tensors) entries += t.indices.size();
      if (entries == 0) {
        ++placeholders;
        continue;
      }
      transport::ValueEncoding encoding = recorded_encoding(update, record.update);
      if (sign_scale) {
        // The worker's rule (worker/compressor.h); a replayed update has no residual to keep the
        // error in.
        for (auto& t : update.tensors) runtime::quantize_sign_scale(t);
        encoding = transport::ValueEncoding::kSignScale;
      }
      auto posted = transport::encode_sparse_update(update, {encoding});
      if (!posted)
        throw UsageError("--replay " + wal_path + ": record " + std::to_string(r) +
                         " cannot be re-encoded as " + value_encoding_name(encoding) + ": " +
                         posted.error().message);
      const std::size_t bytes = posted.value().size();
      min_bytes = updates.empty() ? bytes : std::min(min_bytes, bytes);
      max_bytes = std::max(max_bytes, bytes);
      total_bytes += static_cast<double>(bytes);
      for (const auto& t : update.tensors) total_entries += static_cast<double>(t.indices.size());
      updates.push_back(std::move(update));
      encodings.push_back(encoding);
    }
    if (updates.empty())
      throw UsageError("--replay " + wal_path + ": the log holds no updates to replay (" +
                       std::to_string(wal_records) + " records, " + std::to_string(placeholders) +
                       " of them without entries)");
    mean_bytes = total_bytes / static_cast<double>(updates.size());
    mean_entries = total_entries / static_cast<double>(updates.size());
  }

  // The value encoding(s) posts use: one name, or "mixed" for a log of a mixed fleet.
  std::string values_text() const {
    for (auto e : encodings)
      if (e != encodings.front()) return "mixed";
    return value_encoding_name(encodings.front());
  }

  // The next record in log order, re-stamped for the server being loaded; `encoding` is set
  // to the one it is posted in.
  const transport::SparseUpdate& next_stamped(std::uint64_t sequence,
                                              std::uint64_t fetched_version,
                                              transport::ValueEncoding& encoding) {
    const std::size_t r = next;
    next = (next + 1) % updates.size();
    ++posts;
    transport::SparseUpdate& update = updates[r];
    update.sequence = sequence;
    update.fetched_version = fetched_version;
    encoding = encodings[r];
    return update;
  }

  std::vector<std::uint8_t> encode(std::uint64_t sequence, std::uint64_t fetched_version) {
    transport::ValueEncoding encoding{};
    const transport::SparseUpdate& update = next_stamped(sequence, fetched_version, encoding);
    auto encoded = transport::encode_sparse_update(update, {encoding});
    if (!encoded)
      throw std::runtime_error("cannot encode a replayed update: " + encoded.error().message);
    return std::move(encoded).value();
  }

 private:
  transport::ValueEncoding recorded_encoding(const transport::SparseUpdate& update,
                                             std::span<const std::uint8_t> bytes) {
    for (auto encoding : {transport::ValueEncoding::kFp32, transport::ValueEncoding::kFp16,
                          transport::ValueEncoding::kSignScale}) {
      auto again = transport::encode_sparse_update(update, {encoding});
      if (again &&
          std::equal(again.value().begin(), again.value().end(), bytes.begin(), bytes.end()))
        return encoding;
    }
    // fp32 carries any finite value exactly: the values stay as recorded, the size may not.
    ++not_reproduced;
    return transport::ValueEncoding::kFp32;
  }

  static std::string hex(std::uint64_t id) {
    char text[24];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(id));
    return text;
  }

  // "; that is the built-in model 'mlp'" when the log's model is one of them.
  static std::string builtin_named(std::uint64_t id) {
    for (const auto& name : runtime::builtin_model_names())
      if (runtime::Model(runtime::builtin_model_spec(name)).layout_id() == id)
        return "; that is the built-in model '" + name +
               "': replay it against a server of that model, with --model " + name;
    return "";
  }
};

// ---- load -----------------------------------------------------------------------------
struct LoadSettings {
  std::uint16_t port = 0;
  std::string keystore;
  std::size_t devices = 1000;
  std::size_t posts_in_flight = 32;
  std::uint64_t max_posts = 200000;
  double seconds = 30;
  int server_pid = 0;
  std::string model = "paper-cnn";
  double compression_rate = 0.01;
  std::string replay;  // a WAL file: post its updates instead of synthetic ones
  bool sign_scale = false;
  bool q_block = true;             // Q-Block1 bodies as the worker sends them; false: RFC 7959
  std::size_t max_payloads = 10;   // blocks per Q-Block1 burst
  // A sharded server: the shards' ports (shard 0 first) instead of --port, and their
  // processes for CPU time instead of --server-pid.
  std::vector<int> shard_ports, shard_pids;
  // Time for every session's handshake (0: 60 s per server, a shard's sessions on top).
  double handshake_seconds = 0;

  std::size_t shard_count() const { return shard_ports.empty() ? 1 : shard_ports.size(); }
  std::vector<std::uint16_t> ports() const {
    if (shard_ports.empty()) return {port};
    std::vector<std::uint16_t> all;
    for (int p : shard_ports) all.push_back(static_cast<std::uint16_t>(p));
    return all;
  }
  // The server processes whose CPU is measured, per shard (none: not measured).
  std::vector<int> pids() const {
    if (!shard_ports.empty()) return shard_pids;
    if (server_pid) return {server_pid};
    return {};
  }
};

// What one load run measured, for the report.
struct LoadMeasurement {
  transport::bench::UpdateLoadReport report;
  std::size_t update_bytes = 0, update_entries = 0,
              parameter_count = 0;           // replay: means over the records
  std::string source = "synthetic", values;  // for the summary line
  std::size_t replay_records = 0, replay_min_bytes = 0, replay_max_bytes = 0;
  double replay_cycles = 0;  // posts made / records: above 1 when the run went round the log again
  std::string
      replay_note;  // what a person should know about the log (left-out records, a torn tail)
  // Per server (shard), /status and CPU seconds around handshakes and posts.
  std::vector<nlohmann::json> status_before, status_after;
  std::vector<double> cpu_at_start, cpu_before, cpu_after;
  double own_cpu_before = 0, own_cpu_after = 0;

  // Every server's CPU seconds during the posts, summed (the whole sharded server).
  double server_cpu_seconds() const {
    double total = 0;
    for (std::size_t i = 0; i < cpu_after.size(); ++i) total += cpu_after[i] - cpu_before[i];
    return total;
  }
  double handshake_cpu_seconds() const {
    double total = 0;
    for (std::size_t i = 0; i < cpu_before.size(); ++i) total += cpu_before[i] - cpu_at_start[i];
    return total;
  }
  std::uint64_t versions_advanced(std::size_t server) const {
    return status_after[server]["version"].get<std::uint64_t>() -
           status_before[server]["version"].get<std::uint64_t>();
  }
  // Updates started: acknowledged, refused or unanswered.
  std::uint64_t updates_sent() const {
    std::uint64_t sent = report.posts_acknowledged + report.posts_unanswered;
    for (const auto& [code, count] : report.posts_refused_by_code) sent += count;
    return sent;
  }
};

std::vector<double> cpu_seconds_of(const std::vector<int>& pids) {
  std::vector<double> seconds;
  for (int pid : pids) seconds.push_back(process_cpu_seconds(pid));
  return seconds;
}

LoadMeasurement measure_load(const LoadSettings& s) {
  const auto values =
      s.sign_scale ? transport::ValueEncoding::kSignScale : transport::ValueEncoding::kFp32;
  // Exactly one of the two: the log is read (and refused) before any network work.
  std::optional<ReplayedUpdates> replay;
  std::optional<UpdateFactory> factory;
  LoadMeasurement m;
  if (!s.replay.empty()) {
    const runtime::Model model(runtime::model_spec_from_argument(s.model));
    replay.emplace(s.replay, model, s.sign_scale);
    m.parameter_count = model.parameter_count();
    m.update_bytes = static_cast<std::size_t>(std::lround(replay->mean_bytes));
    m.update_entries = static_cast<std::size_t>(std::lround(replay->mean_entries));
    m.source = "replay";
    m.values = replay->values_text();
    m.replay_records = replay->updates.size();
    m.replay_min_bytes = replay->min_bytes;
    m.replay_max_bytes = replay->max_bytes;
    if (replay->placeholders > 0)
      m.replay_note += " " + std::to_string(replay->placeholders) +
                       " records without entries (repair-wal's stand-ins) left out;";
    if (replay->not_reproduced > 0)
      m.replay_note += " " + std::to_string(replay->not_reproduced) +
                       " records not reproduced bit for bit by any value encoding, posted as fp32;";
    if (replay->torn_tail_bytes > 0)
      m.replay_note +=
          " a torn tail of " + std::to_string(replay->torn_tail_bytes) + " bytes ignored;";
  } else {
    factory.emplace(s.model, s.compression_rate, 16, values);
    m.update_bytes = factory->encode(0, 1, 0).size();
    for (const auto& t : factory->patterns[0].tensors) m.update_entries += t.indices.size();
    m.parameter_count = factory->model.parameter_count();
    m.values = value_encoding_name(values);
  }
  const auto keystore = server::Keystore::load(s.keystore);
  const std::size_t shards = s.shard_count();
  const runtime::Model whole(runtime::model_spec_from_argument(s.model));
  // With shards, every update is cut as the worker's ShardedServerChannel cuts it.
  std::optional<runtime::ShardedUpdateSplitter> splitter;
  if (shards > 1) splitter.emplace(whole, static_cast<std::uint32_t>(shards));

  // A probe session per server, for /status.
  std::vector<std::unique_ptr<transport::CoapDtlsClient>> probes;
  for (const std::uint16_t port : s.ports())
    probes.push_back(std::make_unique<transport::CoapDtlsClient>(transport::CoapDtlsClient::Options(
        "127.0.0.1", port, credentials(keystore, kProbeDevice), 20000)));
  auto statuses = [&] {
    std::vector<nlohmann::json> all;
    for (auto& probe : probes) all.push_back(server_status(*probe));
    return all;
  };
  const std::vector<nlohmann::json> status_before_handshakes = statuses();
  // Updates of another model (or of another shard: given in the wrong order) would each be
  // refused with 4.00 or 4.09: say so once, before the handshakes of every device.
  const auto builtin = runtime::builtin_model_names();
  if (std::find(builtin.begin(), builtin.end(), s.model) != builtin.end()) {
    for (std::size_t i = 0; i < shards; ++i) {
      const std::string expected =
          shards > 1 ? runtime::shard_model(whole, {static_cast<std::uint32_t>(i),
                                                    static_cast<std::uint32_t>(shards)})
                           .spec()
                           .name
                     : s.model;
      const nlohmann::json& status = status_before_handshakes[i];
      if (status.contains("model") && status["model"].is_string() &&
          status["model"].get<std::string>() != expected)
        throw UsageError(
            (shards > 1 ? "the server at --shard-ports entry " + std::to_string(i) + " (port " +
                              std::to_string(s.ports()[i]) + ")"
                        : std::string("the server")) +
            " runs the model '" + status["model"].get<std::string>() + "', not '" + expected +
            "' (--model" + (shards > 1 ? ", shard " + std::to_string(i) + " of " +
                                             std::to_string(shards) + ")"
                                       : ")"));
    }
  }
  // Per shard, the newest version it acknowledged: each part's t_fetch, as a worker's
  // channel sends that shard's version of its last pull. (Callbacks run on this thread.)
  std::vector<std::uint64_t> latest_version;
  for (const auto& status : status_before_handshakes)
    latest_version.push_back(status["version"].get<std::uint64_t>());

  transport::bench::UpdateLoadOptions options;
  options.port = s.port;
  if (shards > 1) options.shard_ports = s.ports();
  for (std::size_t i = 0; i < s.devices; ++i)
    options.devices.push_back(credentials(keystore, load_device_name(i)));
  options.max_posts_in_flight = s.posts_in_flight;
  options.handshake_budget_seconds =
      s.handshake_seconds > 0 ? s.handshake_seconds : 60.0 * static_cast<double>(shards);
  options.q_block = s.q_block;
  options.max_payloads = s.max_payloads;
  options.max_posts = s.max_posts;
  options.max_post_seconds = s.seconds;
  // A worker computes its gradient on the newest model it knows; with W posts in flight
  // the server sees delays of about W (below the default max staleness of 64).
  // `sequence` counts each device's posts from 1 (transport/bench_load.h): increasing per
  // device, as the server's replay detection wants, for recorded updates as for synthetic.
  std::vector<transport::SparseUpdate> parts;  // of the update being started, per shard
  transport::ValueEncoding parts_encoding = values;
  options.make_body = [&](std::size_t device, std::size_t shard, std::uint64_t sequence) {
    if (!splitter) {
      if (replay) return replay->encode(sequence, latest_version[0]);
      return factory->encode(device + sequence, sequence, latest_version[0]);
    }
    // Shard 0 is asked first: the whole update is cut then, each part with its shard's t_fetch.
    if (shard == 0) {
      const transport::SparseUpdate& update =
          replay ? replay->next_stamped(sequence, 0, parts_encoding)
                 : factory->stamped(device + sequence, sequence, 0);
      splitter->split(update, latest_version, parts);
    }
    auto encoded = transport::encode_sparse_update(parts[shard], {parts_encoding});
    if (!encoded)
      throw std::runtime_error("cannot encode shard " + std::to_string(shard) +
                               "'s part of an update: " + encoded.error().message);
    return std::move(encoded).value();
  };
  options.on_success = [&](std::size_t shard, std::span<const std::uint8_t> payload) {
    if (auto version = server::decode_update_reply(payload);
        version && *version > latest_version[shard])
      latest_version[shard] = *version;
  };
  const std::vector<int> pids = s.pids();
  options.on_posts_starting = [&] {
    m.status_before = statuses();
    m.cpu_before = cpu_seconds_of(pids);
    m.own_cpu_before = own_cpu_seconds();
  };
  options.on_posts_finished = [&] {
    m.own_cpu_after = own_cpu_seconds();
    m.cpu_after = cpu_seconds_of(pids);
    m.status_after = statuses();
  };
  m.cpu_at_start = cpu_seconds_of(pids);
  m.report = transport::bench::run_update_load(options);
  if (replay)
    m.replay_cycles =
        static_cast<double>(replay->posts) / static_cast<double>(replay->updates.size());
  return m;
}

// Sessions, acknowledged updates, CPU and traffic per update, for a person.
void print_load(const LoadSettings& s, const LoadMeasurement& m) {
  const auto& report = m.report;
  const double applied = static_cast<double>(report.posts_acknowledged);
  const auto& traffic = report.post_traffic;
  if (m.source == "replay") {
    std::printf(
        "\n== load: %zu devices, %zu posts in flight, model %s (%zu parameters), updates replayed "
        "from %s ==\n",
        s.devices, s.posts_in_flight, s.model.c_str(), m.parameter_count, s.replay.c_str());
    std::printf(
        "updates replayed                %zu records, values %s%s; posted %.2f times over in log "
        "order\n",
        m.replay_records, m.values.c_str(),
        s.sign_scale ? " (re-encoded as sign + scale)" : " (as recorded)", m.replay_cycles);
    if (!m.replay_note.empty())
      std::printf("note on the log                 %s\n", m.replay_note.c_str() + 1);
    std::printf(
        "update (codec bytes)            mean %zu B (%zu to %zu), mean %zu entries, ~%zu Block1 "
        "blocks of 1024 B\n",
        m.update_bytes, m.replay_min_bytes, m.replay_max_bytes, m.update_entries,
        (m.update_bytes + 1023) / 1024);
  } else {
    std::printf(
        "\n== load: %zu devices, %zu posts in flight, model %s (%zu parameters), c = %g, "
        "synthetic, values %s ==\n",
        s.devices, s.posts_in_flight, s.model.c_str(), m.parameter_count, s.compression_rate,
        m.values.c_str());
    std::printf("update (codec bytes)            %zu B, %zu entries, %zu Block1 blocks of 1024 B\n",
                m.update_bytes, m.update_entries, (m.update_bytes + 1023) / 1024);
  }
  if (s.q_block)
    std::printf("request bodies                  Q-Block1 (RFC 9177), bursts of %zu blocks answered once%s\n",
                s.max_payloads,
                report.q_block1_refused > 0
                    ? ": REFUSED with 4.02 by this server (--q-block=false?): run with --q-block=false"
                    : "");
  else
    std::printf("request bodies                  Block1 (RFC 7959), one exchange per block\n");
  std::printf(
      "sessions established            %zu of %zu in %.2f s (%zu failed); handshakes sent %llu "
      "datagrams, %.1f kB\n",
      report.sessions_established, s.devices * s.shard_count(), report.handshake_seconds,
      report.sessions_failed,
      static_cast<unsigned long long>(report.handshake_traffic.sent_datagrams),
      report.handshake_traffic.sent_bytes / 1e3);
  const bool cpu_measured = !m.cpu_after.empty();
  if (s.shard_count() > 1)
    std::printf("sharded server                  %zu shards: each update cut into %zu parts "
                "(ShardedUpdateSplitter), a session per device and shard; %zu devices hold "
                "every shard's session and post\n",
                s.shard_count(), s.shard_count(), report.devices_posting);
  if (cpu_measured)
    std::printf("server CPU for the handshakes   %.2f s (%.2f ms per session)\n",
                m.handshake_cpu_seconds(),
                1e3 * m.handshake_cpu_seconds() /
                    std::max<std::size_t>(1, report.sessions_established));
  std::string refused;
  for (const auto& [code, count] : report.posts_refused_by_code)
    refused += " " + transport::coap_code_string(code) + "×" + std::to_string(count);
  std::printf(
      "updates acknowledged (2.04)     %llu in %.2f s = %.0f durable updates/s (refused:%s; "
      "unanswered %llu)\n",
      static_cast<unsigned long long>(report.posts_acknowledged), report.post_seconds,
      applied / std::max(1e-9, report.post_seconds), refused.empty() ? " none" : refused.c_str(),
      static_cast<unsigned long long>(report.posts_unanswered));
  if (s.shard_count() == 1) {
    std::printf("server versions advanced        %llu\n",
                static_cast<unsigned long long>(m.versions_advanced(0)));
  } else {
    // Every update makes a version on every shard (an empty part too): each shard's count
    // is the updates it acknowledged its part of, the updates sent when none was refused.
    for (std::size_t i = 0; i < s.shard_count(); ++i) {
      const auto& counts = report.shards[i];
      std::uint64_t refused_parts = 0;
      for (const auto& [code, count] : counts.refused_by_code) refused_parts += count;
      const bool exact = m.versions_advanced(i) == counts.acknowledged;
      std::printf(
          "shard %zu versions advanced      %llu for %llu updates sent (%llu parts acknowledged, "
          "%llu refused, %llu unanswered): %s\n",
          i, static_cast<unsigned long long>(m.versions_advanced(i)),
          static_cast<unsigned long long>(m.updates_sent()),
          static_cast<unsigned long long>(counts.acknowledged),
          static_cast<unsigned long long>(refused_parts),
          static_cast<unsigned long long>(counts.unanswered),
          exact ? "one version per acknowledged part" : "MISMATCH");
    }
  }
  if (cpu_measured && applied > 0) {
    const double cpu = m.server_cpu_seconds();
    std::printf(
        "server CPU (utime+stime)        %.2f s over %.2f s = %.0f%% of a core; %.0f us per update "
        "(bound with a whole core: %.0f updates/s)%s\n",
        cpu, report.post_seconds, 100 * cpu / std::max(1e-9, report.post_seconds),
        1e6 * cpu / applied, applied / std::max(1e-9, cpu),
        s.shard_count() > 1 ? ", all shards" : "");
    for (std::size_t i = 0; s.shard_count() > 1 && i < m.cpu_after.size(); ++i) {
      const double shard_cpu = m.cpu_after[i] - m.cpu_before[i];
      std::printf("shard %zu CPU                     %.2f s = %.0f%% of a core; %.0f us per update\n",
                  i, shard_cpu, 100 * shard_cpu / std::max(1e-9, report.post_seconds),
                  1e6 * shard_cpu / applied);
    }
  }
  std::uint64_t posts_sent = report.posts_acknowledged + report.posts_unanswered;
  for (const auto& [code, count] : report.posts_refused_by_code) posts_sent += count;
  if (applied > 0) {
    const double own = m.own_cpu_after - m.own_cpu_before;
    std::printf("load generator CPU              %.2f s = %.0f%% of a core; %.0f us per update\n",
                own, 100 * own / std::max(1e-9, report.post_seconds), 1e6 * own / applied);
  }
  if (applied > 0 && report.posted_body_bytes > 0) {
    // Bytes on the wire per codec byte, over every post sent (retransmissions included).
    const double wire_per_body =
        static_cast<double>(traffic.sent_bytes) / static_cast<double>(report.posted_body_bytes);
    std::printf(
        "client→server datagrams         %.1f per update, %.0f B per update for %.0f codec bytes: "
        "overhead %.1f%%\n",
        traffic.sent_datagrams / applied, traffic.sent_bytes / applied,
        static_cast<double>(report.posted_body_bytes) / static_cast<double>(posts_sent),
        100 * (wire_per_body - 1));
    std::printf("server→client datagrams         %.1f per update, %.0f B per update\n",
                traffic.received_datagrams / applied, traffic.received_bytes / applied);
  }
}

// Where the server's submit() time went, and one machine-readable line for
// run_server_bench.sh's table.
void print_load_summary(const LoadSettings& s, const LoadMeasurement& m) {
  const auto& report = m.report;
  const auto& traffic = report.post_traffic;
  const double applied = static_cast<double>(report.posts_acknowledged);
  std::uint64_t refused = 0;
  for (const auto& [code, count] : report.posts_refused_by_code) refused += count;
  std::string summary = "summary load source=" + m.source;
  if (m.source == "replay") summary += " records=" + std::to_string(m.replay_records);
  summary += " values=" + m.values + " update_bytes=" + std::to_string(m.update_bytes) +
             " devices=" + std::to_string(s.devices) +
             " established=" + std::to_string(report.sessions_established) +
             " devices_posting=" + std::to_string(report.devices_posting) +
             " in_flight=" + std::to_string(s.posts_in_flight) +
             " applied=" + std::to_string(report.posts_acknowledged) +
             " refused=" + std::to_string(refused) +
             " unanswered=" + std::to_string(report.posts_unanswered) +
             " updates_per_s=" + std::to_string(applied / std::max(1e-9, report.post_seconds)) +
             " blocks=" + (s.q_block ? "q-block1" : "block1");
  if (!m.cpu_after.empty() && applied > 0)
    summary += " server_cpu_us=" + std::to_string(1e6 * m.server_cpu_seconds() / applied);
  // Sharded: per shard, '/'-separated in shard order; `sent` is every update started.
  summary += " shards=" + std::to_string(s.shard_count()) +
             " sent=" + std::to_string(m.updates_sent());
  if (s.shard_count() > 1) {
    std::string versions, acknowledged, cpu;
    for (std::size_t i = 0; i < s.shard_count(); ++i) {
      const char* sep = i ? "/" : "";
      versions += sep + std::to_string(m.versions_advanced(i));
      acknowledged += sep + std::to_string(report.shards[i].acknowledged);
      if (i < m.cpu_after.size() && applied > 0)
        cpu += sep + std::to_string(static_cast<long long>(
                         std::lround(1e6 * (m.cpu_after[i] - m.cpu_before[i]) / applied)));
    }
    summary += " shard_versions=" + versions + " shard_acknowledged=" + acknowledged;
    if (!cpu.empty()) summary += " shard_cpu_us=" + cpu;
  }
  if (applied > 0)
    summary +=
        " loadgen_cpu_us=" + std::to_string(1e6 * (m.own_cpu_after - m.own_cpu_before) / applied);
  if (applied > 0 && report.posted_body_bytes > 0)
    summary += " overhead_pct=" +
               std::to_string(100.0 * (static_cast<double>(traffic.sent_bytes) /
                                           static_cast<double>(report.posted_body_bytes) -
                                       1));
  // The server's own breakdown: shard 0's with shards (each shard's is about the same).
  const auto& t0 = m.status_before[0]["submit_seconds"];
  const auto& t1 = m.status_after[0]["submit_seconds"];
  const double timed = t1["applied_updates"].get<double>() - t0["applied_updates"].get<double>();
  if (timed > 0) {
    auto per_update_us = [&](const char* key) {
      return 1e6 * (t1[key].get<double>() - t0[key].get<double>()) / timed;
    };
    std::printf(
        "server submit() per update      decode+checks %.0f us, WAL write+fdatasync %.0f us, apply "
        "%.0f us, "
        "checkpoints %.0f us (amortized)\n",
        per_update_us("decode"), per_update_us("wal_append_fdatasync"), per_update_us("apply"),
        per_update_us("checkpoints"));
    if (s.shard_count() == 1 && !m.cpu_after.empty() && applied > 0) {
      const double submit_us = per_update_us("decode") + per_update_us("wal_append_fdatasync") +
                               per_update_us("apply") + per_update_us("checkpoints");
      const double wall_per_update_us = 1e6 * report.post_seconds / applied;
      std::printf(
          "server event loop per update    %.0f us of wall time, of which submit() %.0f us; the "
          "rest "
          "(DTLS, CoAP, %zu-block reassembly, loop) %.0f us\n",
          wall_per_update_us, submit_us, (m.update_bytes + 1023) / 1024,
          wall_per_update_us - submit_us);
    }
    for (const char* key : {"decode", "wal_append_fdatasync", "apply"})
      summary += std::string(" ") + key + "_us=" + std::to_string(per_update_us(key));
  }
  std::printf("%s\n", summary.c_str());
}

int run_load(const LoadSettings& s) {
  const LoadMeasurement m = measure_load(s);
  print_load(s, m);
  print_load_summary(s, m);
  return 0;
}

// ---- transfer under added latency --------------------------------------------------------
struct TransferSettings {
  std::uint16_t port = 0;
  std::string keystore;
  int delay_ms = 0;
  double pull_budget_seconds = 40;
  std::string model = "paper-cnn";
  double compression_rate = 0.01;
  std::vector<int> delta_after = {3, 10};
};

// The relay, the clients and the model sizes one transfer run shares between its steps.
struct TransferRun {
  TransferRun(const TransferSettings& settings, const server::Keystore& keystore, int most_updates)
      : s(settings),
        // One random gradient per update: independent top-k sets, so the deltas measured are
        // about as large as N updates can make them (real gradients' top-k sets overlap more).
        factory(s.model, s.compression_rate, static_cast<std::size_t>(most_updates) + 1),
        proxy(s.port, std::chrono::milliseconds(s.delay_ms)),
        psk(credentials(keystore, kProbeDevice)),
        puller({"127.0.0.1", proxy.port(), psk,
                static_cast<int>(std::lround(s.pull_budget_seconds * 1000))}) {
    for (const auto& t : factory.model.tensors())
      sizes.push_back(static_cast<std::uint32_t>(t.size));
    const std::vector<float> zeros(factory.model.parameter_count());
    model_bytes =
        transport::encode_dense_model(factory.model.layout_id(), 0, sizes, zeros).value().size();
  }
  const TransferSettings& s;
  UpdateFactory factory;
  edgetrain::testing::UdpDelayProxy proxy;
  transport::PskCredentials psk;
  transport::CoapDtlsClient puller;
  std::vector<std::uint32_t> sizes;
  std::size_t model_bytes = 0;
  std::uint64_t sequence = 0;  // of the timed update post
  double post_seconds = 0;
};

// Handshake, then one timed update post through the relay.
void time_update_post(TransferRun& run) {
  transport::CoapDtlsClient client({"127.0.0.1", run.proxy.port(), run.psk, 30000});
  auto started = Clock::now();
  const nlohmann::json status = server_status(client);
  std::printf("handshake + GET /status          %8.3f s\n", seconds_since(started));
  // The wall clock in microseconds keeps this identity's sequence increasing across runs.
  run.sequence = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count());
  const auto body = run.factory.encode(0, run.sequence, status["version"].get<std::uint64_t>());
  const std::uint64_t datagrams = run.proxy.datagrams_to_server();
  started = Clock::now();
  const auto posted = client.request(transport::Method::kPost, "update", body);
  run.post_seconds = seconds_since(started);
  std::printf("POST /update (%zu B, %zu blocks) %8.3f s  answer %s, %llu datagrams to the server\n",
              body.size(), (body.size() + 1023) / 1024, run.post_seconds,
              transport::coap_code_string(posted.code).c_str(),
              static_cast<unsigned long long>(run.proxy.datagrams_to_server() - datagrams));
}

// One timed dense pull (lock-step Block2), extrapolated when it overruns the budget.
void time_dense_pull(TransferRun& run) {
  const TransferSettings& s = run.s;
  auto& proxy = run.proxy;
  const std::size_t model_bytes = run.model_bytes, model_blocks = (model_bytes + 1023) / 1024;
  const double post_seconds = run.post_seconds;
  server_status(run.puller);  // handshake outside the timed pull
  const std::uint64_t datagrams = proxy.datagrams_to_client();
  std::uint64_t request_datagrams = proxy.datagrams_to_server(),
                request_bytes = proxy.bytes_to_server();
  const auto started = Clock::now();
  try {
    const auto pulled = run.puller.request(transport::Method::kGet, "model");
    const double pull_seconds = seconds_since(started);
    request_datagrams = proxy.datagrams_to_server() - request_datagrams;
    request_bytes = proxy.bytes_to_server() - request_bytes;
    std::printf(
        "GET /model (%zu B, %zu blocks) %8.3f s  answer %s; to the server %llu datagrams, %llu B\n",
        model_bytes, model_blocks, pull_seconds, transport::coap_code_string(pulled.code).c_str(),
        static_cast<unsigned long long>(request_datagrams),
        static_cast<unsigned long long>(request_bytes));
    std::printf(
        "summary transfer delay_ms=%d update_s=%.3f pull_s=%.3f pull=measured pull_bytes=%zu "
        "pull_request_datagrams=%llu pull_request_bytes=%llu\n",
        s.delay_ms, post_seconds, pull_seconds, model_bytes,
        static_cast<unsigned long long>(request_datagrams),
        static_cast<unsigned long long>(request_bytes));
  } catch (const transport::TransportError&) {
    const double elapsed = seconds_since(started);
    const auto blocks = proxy.datagrams_to_client() - datagrams;
    const double extrapolated =
        elapsed * static_cast<double>(model_blocks) / std::max<double>(1, blocks);
    // One request datagram per block, of the size the ones that went out had.
    request_bytes = (proxy.bytes_to_server() - request_bytes) * model_blocks /
                    std::max<std::uint64_t>(1, blocks);
    std::printf(
        "GET /model (%zu B, %zu blocks) %8.3f s  EXTRAPOLATED: %llu blocks arrived within the %.0f "
        "s budget\n",
        model_bytes, model_blocks, extrapolated, static_cast<unsigned long long>(blocks),
        s.pull_budget_seconds);
    std::printf(
        "summary transfer delay_ms=%d update_s=%.3f pull_s=%.3f pull=extrapolated pull_bytes=%zu "
        "pull_request_datagrams=%zu pull_request_bytes=%llu\n",
        s.delay_ms, post_seconds, extrapolated, model_bytes, model_blocks,
        static_cast<unsigned long long>(request_bytes));
  }
}

// One timed GET /model?since=V through the relay; the copy must reproduce the server's model.
void print_sparse_pull(TransferRun& run, runtime::ModelReplica& replica, int updates) {
  const TransferSettings& s = run.s;
  auto& proxy = run.proxy;
  auto& puller = run.puller;
  const std::size_t model_bytes = run.model_bytes;
  const std::string path = replica.pull_path();
  const std::uint64_t datagrams_before = proxy.datagrams_to_server(),
                      bytes_before = proxy.bytes_to_server();
  const std::uint64_t datagrams_back = proxy.datagrams_to_client();
  const auto started = Clock::now();
  const auto pulled = puller.request(transport::Method::kGet, path);
  const double seconds = seconds_since(started);
  const auto outcome = replica.take(pulled.payload);
  if (outcome != runtime::ModelReplica::PullOutcome::kDelta)
    throw std::runtime_error("GET /" + path +
                             " did not give a usable delta: " + replica.mismatch());
  const auto to_server = proxy.datagrams_to_server() - datagrams_before;
  const auto bytes_to_server = proxy.bytes_to_server() - bytes_before;
  std::printf(
      "GET /%s after %d updates (%zu B, %zu blocks) %8.3f s  answer %s, copy = server's (digest); "
      "to the "
      "server %llu datagrams, %llu B; %llu datagrams back\n",
      path.c_str(), updates, pulled.payload.size(), (pulled.payload.size() + 1023) / 1024, seconds,
      transport::coap_code_string(pulled.code).c_str(), static_cast<unsigned long long>(to_server),
      static_cast<unsigned long long>(bytes_to_server),
      static_cast<unsigned long long>(proxy.datagrams_to_client() - datagrams_back));
  std::printf(
      "summary delta delay_ms=%d updates=%d delta_bytes=%zu dense_bytes=%zu pull_s=%.3f "
      "pull_request_datagrams=%llu pull_request_bytes=%llu\n",
      s.delay_ms, updates, pulled.payload.size(), model_bytes, seconds,
      static_cast<unsigned long long>(to_server), static_cast<unsigned long long>(bytes_to_server));
}

// Sparse pulls. The copy a worker holds (a dense pull straight from the server, not
// timed), N updates by others (straight to the server), then the timed
// GET /model?since=V through the relay; the copy must come out as the server's model.
void time_sparse_pulls(TransferRun& run) {
  const TransferSettings& s = run.s;
  auto& factory = run.factory;
  transport::CoapDtlsClient direct({"127.0.0.1", s.port, run.psk, 60000});
  std::uint64_t next_sequence = run.sequence + 1;
  std::size_t next_pattern = 1;
  for (int updates : s.delta_after) {
    runtime::ModelReplica replica(factory.model.layout_id(), run.sizes);
    const auto dense = direct.request(transport::Method::kGet, "model");
    if (dense.code != transport::CoapCode::kContent ||
        replica.take(dense.payload) != runtime::ModelReplica::PullOutcome::kDense)
      throw std::runtime_error("no dense model to start from");
    std::uint64_t version = replica.version();
    for (int i = 0; i < updates; ++i) {
      const auto reply = direct.request(transport::Method::kPost, "update",
                                        factory.encode(next_pattern++, next_sequence++, version));
      const auto produced = server::decode_update_reply(reply.payload);
      if (reply.code != transport::CoapCode::kChanged || !produced)
        throw std::runtime_error("update refused: " + transport::coap_code_string(reply.code));
      version = *produced;
    }
    print_sparse_pull(run, replica, updates);
  }
}

int run_transfer(const TransferSettings& s) {
  const auto keystore = server::Keystore::load(s.keystore);
  int most_updates = 0;
  for (int n : s.delta_after) most_updates = std::max(most_updates, n);
  TransferRun run(s, keystore, most_updates);
  std::printf("\n== transfer through a UDP relay adding %d ms each way (RTT +%d ms) ==\n",
              s.delay_ms, 2 * s.delay_ms);
  time_update_post(run);
  time_dense_pull(run);
  time_sparse_pulls(run);
  return 0;
}

// ---- WAN: delay, loss and CoAP timing ---------------------------------------------------
struct WanSettings {
  std::uint16_t port = 0;
  std::string keystore;
  int delay_ms = 50;
  double loss = 0.05;
  int trials = 20;
  std::uint64_t seed = 1;
  std::string model = "paper-cnn";
  transport::CoapTiming timing = transport::CoapTiming::wan();
  std::string label = "wan";
};

struct Spread {
  double median = 0, mean = 0, p90 = 0, max = 0;
};
Spread spread_of(std::vector<double> values) {
  Spread s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.median = values[values.size() / 2];
  s.p90 = values[std::min(values.size() - 1,
                          static_cast<std::size_t>(std::ceil(0.9 * values.size())) - 1)];
  s.max = values.back();
  for (double v : values) s.mean += v / static_cast<double>(values.size());
  return s;
}

// One trial on a fresh session: its first small request (handshake included), a second
// one, and one update post; seconds each. Throws when the post is not acknowledged.
std::array<double, 3> time_wan_trial(const transport::CoapDtlsClient::Options& options,
                                     UpdateFactory& factory, std::uint64_t sequence,
                                     std::size_t& body_bytes) {
  transport::CoapDtlsClient client(options);
  // A resource that does not exist: 4.04 fits one datagram, so the request is one round
  // trip and the rest of the first one is the handshake.
  auto started = Clock::now();
  client.request(transport::Method::kGet, "probe");
  const double first = seconds_since(started);
  started = Clock::now();
  client.request(transport::Method::kGet, "probe");
  const double small = seconds_since(started);
  const std::uint64_t version = server_status(client)["version"].get<std::uint64_t>();
  const auto body = factory.encode(0, sequence, version);
  body_bytes = body.size();
  started = Clock::now();
  const auto posted = client.request(transport::Method::kPost, "update", body);
  const double post = seconds_since(started);
  if (posted.code != transport::CoapCode::kChanged)
    throw std::runtime_error("POST /update answered " + transport::coap_code_string(posted.code));
  return {first, small, post};
}

int run_wan(const WanSettings& s) {
  const auto keystore = server::Keystore::load(s.keystore);
  UpdateFactory factory(s.model, 0.01, 1);
  edgetrain::testing::UdpDelayProxy proxy(s.port, std::chrono::milliseconds(s.delay_ms), s.loss,
                                          s.seed);
  const auto psk = credentials(keystore, kProbeDevice);
  std::printf(
      "\n== WAN: %d ms each way, %.1f%% loss each way; CoAP ACK_TIMEOUT %.2f s, ACK_RANDOM_FACTOR "
      "%.2f, "
      "MAX_RETRANSMIT %d, NSTART %d (%s) ==\n",
      s.delay_ms, 100 * s.loss, s.timing.ack_timeout_seconds, s.timing.ack_random_factor,
      s.timing.max_retransmit, s.timing.nstart, s.label.c_str());
  std::vector<double> first_request, small_request, update;
  int failures = 0;
  std::uint64_t sequence =
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
  std::size_t body_bytes = 0;
  for (int trial = 0; trial < s.trials; ++trial) {
    transport::CoapDtlsClient::Options options{"127.0.0.1", proxy.port(), psk, 120000};
    options.timing = s.timing;
    try {
      const auto [first, small, post] = time_wan_trial(options, factory, ++sequence, body_bytes);
      first_request.push_back(first);
      small_request.push_back(small);
      update.push_back(post);
      std::printf(
          "trial %2d  handshake + small request %6.3f s  small request %6.3f s  update %6.3f s\n",
          trial, first, small, post);
    } catch (const std::exception& e) {
      ++failures;
      std::printf("trial %2d  FAILED: %s\n", trial, e.what());
    }
    std::fflush(stdout);
  }
  const Spread a = spread_of(first_request), b = spread_of(small_request), c = spread_of(update);
  std::printf("%-34s %8s %8s %8s %8s\n", "seconds over the trials", "median", "mean", "p90", "max");
  std::printf("%-34s %8.3f %8.3f %8.3f %8.3f\n", "handshake + small request", a.median, a.mean,
              a.p90, a.max);
  std::printf("%-34s %8.3f %8.3f %8.3f %8.3f\n", "small request (open session)", b.median, b.mean,
              b.p90, b.max);
  std::printf("%-34s %8.3f %8.3f %8.3f %8.3f\n",
              ("update (" + std::to_string(body_bytes) + " B)").c_str(), c.median, c.mean, c.p90,
              c.max);
  std::printf(
      "datagrams dropped by the relay: %llu of %llu; failed trials: %d\n",
      static_cast<unsigned long long>(proxy.datagrams_dropped()),
      static_cast<unsigned long long>(proxy.datagrams_dropped() + proxy.datagrams_to_server() +
                                      proxy.datagrams_to_client()),
      failures);
  std::printf(
      "summary wan label=%s delay_ms=%d loss=%.3f trials=%zu handshake_median_s=%.3f "
      "handshake_mean_s=%.3f "
      "update_median_s=%.3f update_mean_s=%.3f update_p90_s=%.3f failed=%d\n",
      s.label.c_str(), s.delay_ms, s.loss, update.size(), a.median - b.median, a.mean - b.mean,
      c.median, c.mean, c.p90, failures);
  return 0;
}

// ---- handshake floods -------------------------------------------------------------------
struct SpoofSettings {
  std::uint16_t port = 0;
  double per_second = 1000;
  double seconds = 10;
  std::size_t count = 0;  // 0: per_second × seconds
};

int run_spoof(const SpoofSettings& s) {
  edgetrain::testing::HelloFlood flood(s.port);
  const auto started = Clock::now();
  const std::size_t count = s.count ? s.count : static_cast<std::size_t>(s.per_second * s.seconds);
  const std::size_t sent = flood.send(count, s.per_second);
  const double took = seconds_since(started);
  std::printf("summary spoof sent=%zu seconds=%.2f per_second=%.0f\n", sent, took,
              static_cast<double>(sent) / took);
  return 0;
}

struct ProbeSettings {
  std::uint16_t port = 0;
  std::string keystore;
  double seconds = 15;
  double every = 0.25;
  double deadline = 3;
  std::string out;
};

// A fresh session's first request (a resource that does not exist: 4.04 fits one
// datagram, so nearly all of it is the handshake), every `every` seconds for `seconds`.
int run_probe_handshakes(const ProbeSettings& s) {
  const auto keystore = server::Keystore::load(s.keystore);
  const auto psk = credentials(keystore, kProbeDevice);
  nlohmann::json seconds_list = nlohmann::json::array();
  std::size_t attempts = 0, within = 0;
  const auto started = Clock::now();
  for (auto next = started; seconds_since(started) < s.seconds;
       next +=
       std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.every))) {
    std::this_thread::sleep_until(next);
    ++attempts;
    const auto begun = Clock::now();
    try {
      transport::CoapDtlsClient client(
          {"127.0.0.1", s.port, psk, static_cast<int>(s.deadline * 1000)});
      client.request(transport::Method::kGet, "probe");
      const double took = seconds_since(begun);
      seconds_list.push_back(took);
      if (took <= s.deadline) ++within;
    } catch (const transport::TransportError&) {
      seconds_list.push_back(nullptr);  // no answer within the deadline
    }
    if (Clock::now() > next) next = Clock::now();  // a slow probe does not cause a burst after it
  }
  nlohmann::json result = {{"attempts", attempts},
                           {"within_deadline", within},
                           {"deadline_s", s.deadline},
                           {"seconds", seconds_list}};
  if (!s.out.empty()) std::ofstream(s.out) << result.dump() << "\n";
  std::printf("summary handshakes attempts=%zu within_deadline=%zu deadline_s=%.1f\n", attempts,
              within, s.deadline);
  return 0;
}

struct FloodBenchSettings {
  std::uint16_t port = 0;
  std::string keystore;
  std::size_t devices = 16;
  std::size_t posts_in_flight = 8;
  double seconds = 15;
  double spoof_per_second = 1000;
  double probe_every = 0.25;
  double probe_deadline = 3;
  int rounds = 2;
  int server_pid = 0;
  std::string model = "paper-cnn";
  double compression_rate = 0.01;
};

// One phase, or the sum of the phases of one condition.
struct FloodPhase {
  double spoof_per_second = 0;
  std::size_t spoofed = 0;
  std::uint64_t updates = 0;
  double post_seconds = 0;
  std::size_t established = 0, devices = 0;
  std::size_t probes = 0, probes_within = 0;
  std::vector<double> answered_seconds;  // of the probes that got an answer
  double server_cpu_seconds = 0;         // over the posting time
  double updates_per_second() const {
    return static_cast<double>(updates) / std::max(1e-9, post_seconds);
  }
  double within_pct() const {
    return 100.0 * static_cast<double>(probes_within) / std::max<std::size_t>(1, probes);
  }
  void add(const FloodPhase& other) {
    spoof_per_second = other.spoof_per_second;
    spoofed += other.spoofed;
    updates += other.updates;
    post_seconds += other.post_seconds;
    established += other.established;
    devices += other.devices;
    probes += other.probes;
    probes_within += other.probes_within;
    answered_seconds.insert(answered_seconds.end(), other.answered_seconds.begin(),
                            other.answered_seconds.end());
    server_cpu_seconds += other.server_cpu_seconds;
  }
};

// The handshakes prober as a child process (its own libcoap, its own core time), started
// when the established devices start posting.
pid_t spawn_prober(const FloodBenchSettings& s, const std::string& out) {
  std::vector<std::string> args = {"edgetrain-loadgen",
                                   "handshakes",
                                   "--port",
                                   std::to_string(s.port),
                                   "--keystore",
                                   s.keystore,
                                   "--seconds",
                                   std::to_string(s.seconds),
                                   "--every",
                                   std::to_string(s.probe_every),
                                   "--deadline",
                                   std::to_string(s.probe_deadline),
                                   "--out",
                                   out};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0)
    throw std::runtime_error("cannot start the handshakes prober");
  return pid;
}

FloodPhase measure_flood_phase(const FloodBenchSettings& s, double spoof_per_second,
                               UpdateFactory& factory, std::uint64_t& next_sequence) {
  const auto keystore = server::Keystore::load(s.keystore);
  transport::CoapDtlsClient probe(
      {"127.0.0.1", s.port, credentials(keystore, kProbeDevice), 20000});
  std::atomic<std::uint64_t> latest_version{server_status(probe)["version"].get<std::uint64_t>()};
  FloodPhase phase;
  phase.spoof_per_second = spoof_per_second;
  const std::string probe_file =
      "/tmp/edgetrain-flood-probe-" + std::to_string(::getpid()) + ".json";
  std::atomic<bool> stop_flood = false;
  std::thread flooder;
  pid_t prober = -1;
  double cpu_before = 0;

  transport::bench::UpdateLoadOptions options;
  options.port = s.port;
  for (std::size_t i = 0; i < s.devices; ++i)
    options.devices.push_back(credentials(keystore, load_device_name(i)));
  options.max_posts_in_flight = s.posts_in_flight;
  options.max_posts = 1000000;
  options.max_post_seconds = s.seconds;
  const std::uint64_t first_sequence = next_sequence;
  options.make_body = [&](std::size_t device, std::size_t, std::uint64_t sequence) {
    return factory.encode(device + sequence, first_sequence + sequence, latest_version.load());
  };
  options.on_success = [&](std::size_t, std::span<const std::uint8_t> payload) {
    if (auto version = server::decode_update_reply(payload); version && *version > latest_version)
      latest_version = *version;
  };
  options.on_posts_starting = [&] {
    if (s.server_pid) cpu_before = process_cpu_seconds(s.server_pid);
    prober = spawn_prober(s, probe_file);
    if (spoof_per_second > 0) {
      flooder = std::thread([&] {
        edgetrain::testing::HelloFlood flood(s.port);
        phase.spoofed = flood.send(static_cast<std::size_t>(1e9), spoof_per_second, &stop_flood);
      });
    }
  };
  options.on_posts_finished = [&] {
    if (s.server_pid) phase.server_cpu_seconds = process_cpu_seconds(s.server_pid) - cpu_before;
    stop_flood = true;
  };
  const auto report = transport::bench::run_update_load(options);
  if (flooder.joinable()) flooder.join();
  int status = 0;
  if (prober > 0) ::waitpid(prober, &status, 0);
  next_sequence += 1000000;  // the sequences of the next phase start past every one of this phase
  phase.established = report.sessions_established;
  phase.devices = s.devices;
  phase.updates = report.posts_acknowledged;
  phase.post_seconds = report.post_seconds;
  std::ifstream in(probe_file);
  if (!in)
    throw std::runtime_error("the handshakes prober left no results (exit status " +
                             std::to_string(status) + ")");
  const auto probes = nlohmann::json::parse(in);
  ::unlink(probe_file.c_str());
  phase.probes = probes["attempts"].get<std::size_t>();
  phase.probes_within = probes["within_deadline"].get<std::size_t>();
  for (const auto& t : probes["seconds"])
    if (t.is_number()) phase.answered_seconds.push_back(t.get<double>());
  return phase;
}

void print_flood_phase(const FloodBenchSettings& s, const std::string& label, const FloodPhase& p) {
  const Spread spread = spread_of(p.answered_seconds);
  std::printf(
      "%-30s established %zu/%zu, %6.1f updates/s (%llu in %.1f s); new sessions within %.1f s: "
      "%zu of %zu "
      "(median %.3f s, p90 %.3f s, max %.3f s); spoofed ClientHellos %zu; server CPU %.0f%%\n",
      label.c_str(), p.established, p.devices, p.updates_per_second(),
      static_cast<unsigned long long>(p.updates), p.post_seconds, s.probe_deadline, p.probes_within,
      p.probes, spread.median, spread.p90, spread.max, p.spoofed,
      100 * p.server_cpu_seconds / std::max(1e-9, p.post_seconds));
  std::fflush(stdout);
}

int run_flood_bench(const FloodBenchSettings& s) {
  UpdateFactory factory(s.model, s.compression_rate, 16);
  std::uint64_t next_sequence =
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
  std::printf(
      "\n== handshake flood: %zu established devices posting (%zu in flight), a fresh session "
      "every %.2f s "
      "(deadline %.1f s), %.0f s per phase ==\n",
      s.devices, s.posts_in_flight, s.probe_every, s.probe_deadline, s.seconds);
  // Alternating, so that drift on a shared machine (and the fresh server's first minutes)
  // weighs on both conditions alike.
  FloodPhase base, flood;
  for (int round = 1; round <= s.rounds; ++round) {
    for (double rate : {0.0, s.spoof_per_second}) {
      const FloodPhase phase = measure_flood_phase(s, rate, factory, next_sequence);
      (rate > 0 ? flood : base).add(phase);
      print_flood_phase(
          s,
          "round " + std::to_string(round) + ": " +
              (rate > 0 ? "flood " + std::to_string(static_cast<int>(rate)) + "/s" : "no flood"),
          phase);
    }
  }
  print_flood_phase(s, "all rounds: no flood", base);
  print_flood_phase(s, "all rounds: flood", flood);
  const Spread spread = spread_of(flood.answered_seconds);
  const double rate_pct =
      100.0 * flood.updates_per_second() / std::max(1e-9, base.updates_per_second());
  std::printf(
      "goal: >= 95%% of new handshakes within %.0f s during the flood: %.1f%% (baseline %.1f%%) -> "
      "%s\n",
      s.probe_deadline, flood.within_pct(), base.within_pct(),
      flood.within_pct() >= 95 ? "met" : "NOT met");
  std::printf(
      "goal: established devices keep >= 90%% of their update rate: %.1f%% (%.1f of %.1f "
      "updates/s) -> %s\n",
      rate_pct, flood.updates_per_second(), base.updates_per_second(),
      rate_pct >= 90 ? "met" : "NOT met");
  std::printf(
      "summary flood spoof_per_second=%.0f spoofed=%zu rounds=%d baseline_updates_per_s=%.2f "
      "flood_updates_per_s=%.2f update_rate_pct=%.1f baseline_handshakes_within_pct=%.1f "
      "flood_handshakes_within_pct=%.1f flood_handshake_median_s=%.3f flood_handshake_p90_s=%.3f "
      "probes=%zu\n",
      s.spoof_per_second, flood.spoofed, s.rounds, base.updates_per_second(),
      flood.updates_per_second(), rate_pct, base.within_pct(), flood.within_pct(), spread.median,
      spread.p90, flood.probes);
  return 0;
}

void declare_spoof(settings::Table& t, SpoofSettings& s) {
  t.add("port", s.port, "server UDP port on 127.0.0.1").required();
  t.add("per-second", s.per_second, "ClientHellos per second (0: as fast as possible)")
      .range(0, 1e7);
  t.add("seconds", s.seconds, "how long, without --count").range(0, 1e6).unit("seconds");
  t.add("count", s.count, "ClientHellos to send (0: --per-second × --seconds)").range(0, 1e9);
}

void declare_probe(settings::Table& t, ProbeSettings& s) {
  t.add("port", s.port, "server UDP port on 127.0.0.1").required();
  t.add("keystore", s.keystore, "the keystore the server uses").required();
  t.add("seconds", s.seconds, "how long to probe").range(0, 1e6).unit("seconds");
  t.add("every", s.every, "time between the starts of two probes").range(0.01, 1e6).unit("seconds");
  t.add("deadline", s.deadline, "a probe counts if answered within this")
      .range(0.1, 1e6)
      .unit("seconds");
  t.add("out", s.out, "JSON results file");
}

void declare_flood(settings::Table& t, FloodBenchSettings& s) {
  t.add("port", s.port, "server UDP port on 127.0.0.1").required();
  t.add("keystore", s.keystore, "the keystore the server uses").required();
  t.add("devices", s.devices, "established devices posting updates").range(1, 1e6);
  t.add("posts-in-flight", s.posts_in_flight, "posts in progress at once").range(1, 1e6);
  t.add("seconds", s.seconds, "length of each phase").range(1, 1e6).unit("seconds");
  t.add("spoof-per-second", s.spoof_per_second,
        "spoofed ClientHellos per second in the flood phase")
      .range(1, 1e7);
  t.add("probe-every", s.probe_every, "time between two fresh sessions of the prober")
      .range(0.01, 1e6)
      .unit("seconds");
  t.add("probe-deadline", s.probe_deadline, "a fresh session counts if answered within this")
      .range(0.1, 1e6)
      .unit("seconds");
  t.add("rounds", s.rounds, "pairs of phases (no flood, flood), alternating").range(1, 100);
  t.add("server-pid", s.server_pid, "server process for CPU time (/proc/PID/stat)");
  t.add("model", s.model, "model the server runs");
  t.add("rate", s.compression_rate, "AdaComp compression rate c").range(1e-6, 1);
}

void declare_load(settings::Table& t, LoadSettings& s) {
  t.add("port", s.port, "server UDP port on 127.0.0.1 (or --shard-ports)");
  t.add("keystore", s.keystore, "the keystore the server uses").required();
  t.add("devices", s.devices, "concurrent devices, a DTLS session each (per shard)")
      .range(1, 1e6);
  t.add("posts-in-flight", s.posts_in_flight,
        "updates in progress at once (with shards: each is a post to every shard)")
      .range(1, 1e6);
  t.add("max-posts", s.max_posts, "stop after this many updates");
  t.add("handshake-seconds", s.handshake_seconds,
        "time for every session's handshake before posting starts (0: 60 s per server, so "
        "that a sharded server's N sessions per device get N times as long)")
      .range(0, 1e6)
      .unit("seconds");
  t.add("seconds", s.seconds, "stop posting after this long").range(0, 1e6).unit("seconds");
  t.add("server-pid", s.server_pid, "server process for CPU time (/proc/PID/stat)");
  t.add("model", s.model, "model the server runs");
  t.add("rate", s.compression_rate, "AdaComp compression rate c of the synthetic updates")
      .range(1e-6, 1);
  t.add("replay", s.replay,
        "post the updates recorded in this server write-ahead log (a copy of a state directory's "
        "wal.log, e.g. from "
        "tests/bench/record_updates.sh) instead of synthetic ones: indices and values as recorded, "
        "sequence and "
        "fetched version re-stamped, in log order, cycling")
      .unit("WAL_FILE");
  t.add("sign-scale", s.sign_scale,
        "values as sign + scale (value encoding 2 of transport/CODEC.md), synthetic or with "
        "--replay the recorded "
        "ones made ±(mean magnitude) per tensor");
  t.add("q-block", s.q_block,
        "post bodies of more than one block with Q-Block1 (RFC 9177) as the worker does: bursts "
        "answered once (false: RFC 7959 Block1, one exchange per block, as before Q-Block and as "
        "against a server with --q-block=false)");
  t.add("coap-max-payloads", s.max_payloads, "Q-Block1 MAX_PAYLOADS: blocks per burst")
      .range(1, 64);
  t.int_list_flag("shard-ports", s.shard_ports,
                  "a sharded server (edgetrain-server --shard I/N): the UDP ports of its N "
                  "shards on 127.0.0.1, shard 0 first, instead of --port; each update is cut "
                  "into the shards' parts as the worker cuts it, each with that shard's t_fetch, "
                  "over a session per device and shard");
  t.int_list_flag("shard-pids", s.shard_pids,
                  "with --shard-ports: the shard server processes, in the same order, for CPU "
                  "time per shard and in total (instead of --server-pid)");
}

// Settings of `load` that exclude each other; the message says what to drop.
std::optional<std::string> load_conflict(const settings::Table& t, const LoadSettings& s) {
  if (s.shard_ports.empty() && !t.was_set("port"))
    return "which server? --port P (one server) or --shard-ports P0 P1 ... (a sharded server)";
  if (!s.shard_ports.empty() && t.was_set("port"))
    return "--port names one server, --shard-ports the shards of a sharded server: drop one of "
           "the two";
  if (!s.shard_ports.empty() && t.was_set("server-pid"))
    return "--server-pid is one server's process; with --shard-ports give --shard-pids, one per "
           "shard";
  if (!s.shard_pids.empty() && s.shard_pids.size() != s.shard_ports.size())
    return "--shard-pids has " + std::to_string(s.shard_pids.size()) + " processes for " +
           std::to_string(s.shard_ports.size()) + " --shard-ports: one per shard, in the same order";
  for (int port : s.shard_ports)
    if (port < 1 || port > 65535)
      return "--shard-ports: " + std::to_string(port) + " is not a UDP port (1-65535)";
  for (int pid : s.shard_pids)
    if (pid < 1) return "--shard-pids: " + std::to_string(pid) + " is not a process id";
  if (!s.replay.empty() && t.was_set("rate"))
    return "--rate sets the share of entries of the synthetic updates; --replay posts recorded "
           "updates, whose entries "
           "are as recorded: drop one of the two";
  return std::nullopt;
}

void declare_transfer(settings::Table& t, TransferSettings& s) {
  t.add("port", s.port, "server UDP port on 127.0.0.1").required();
  t.add("keystore", s.keystore, "the keystore the server uses").required();
  t.add("delay-ms", s.delay_ms, "added one-way delay").range(0, 1e6).unit("ms");
  t.add("pull-budget", s.pull_budget_seconds,
        "time the model pull may take before its time is extrapolated")
      .range(0, 1e6)
      .unit("seconds");
  t.add("model", s.model, "model the server runs");
  t.int_list_flag(
      "delta-after", s.delta_after,
      "after the dense pull, one sparse pull (GET /model?since=V) after each of these numbers of "
      "updates by others");
}

void declare_wan(settings::Table& t, WanSettings& s, std::string& timing) {
  t.add("port", s.port, "server UDP port on 127.0.0.1").required();
  t.add("keystore", s.keystore, "the keystore the server uses").required();
  t.add("delay-ms", s.delay_ms, "added one-way delay").range(0, 1e6).unit("ms");
  t.add("loss", s.loss, "probability that the relay drops a datagram (each way)").range(0, 0.999);
  t.add("trials", s.trials, "fresh sessions to time").range(1, 1e6);
  t.add("seed", s.seed, "seed of the relay's losses");
  t.add("model", s.model, "model the server runs");
  t.add("timing", timing, "CoAP timing: wan (edgetrain's default) or rfc7252")
      .choices({"wan", "rfc7252"});
}

}  // namespace

int main(int argc, char** argv) {
  settings::Table table("edgetrain-loadgen",
                        "edgetrain-loadgen: load and latency figures for a running "
                        "edgetrain-server (a benchmark, not a test)");
  table.require_subcommand();
  std::string keystore_path, wan_timing = "wan";
  std::size_t keystore_devices = 1000;
  settings::Table& keystore =
      table.subcommand("keystore", "write a keystore of load devices (mode 0600)");
  keystore.add("out", keystore_path, "keystore file").required();
  keystore.add("devices", keystore_devices, "load devices").range(1, 1e6);
  LoadSettings load_settings;
  settings::Table& load = table.subcommand("load",
                                           "many sessions posting paper-CNN AdaComp updates "
                                           "(synthetic, or replayed from a server's WAL)");
  declare_load(load, load_settings);
  TransferSettings transfer_settings;
  settings::Table& transfer = table.subcommand(
      "transfer", "one update post and one model pull through a delaying UDP relay");
  declare_transfer(transfer, transfer_settings);
  WanSettings wan_settings;
  settings::Table& wan = table.subcommand(
      "wan", "handshake, small request and update times through a delaying, lossy relay");
  declare_wan(wan, wan_settings, wan_timing);
  FloodBenchSettings flood_settings;
  settings::Table& flood = table.subcommand("flood",
                                            "updates/s of established devices and fresh handshakes "
                                            "within a deadline, without and with a flood");
  declare_flood(flood, flood_settings);
  SpoofSettings spoof_settings;
  settings::Table& spoof =
      table.subcommand("spoof", "DTLS ClientHellos from ever new loopback source addresses");
  declare_spoof(spoof, spoof_settings);
  ProbeSettings probe_settings;
  settings::Table& probe = table.subcommand(
      "handshakes", "a fresh session's first request every few seconds, with a deadline");
  declare_probe(probe, probe_settings);
  if (auto exit_status = table.parse(argc, argv)) return *exit_status;
  try {
    if (wan.parsed()) {
      wan_settings.timing =
          wan_timing == "rfc7252" ? transport::CoapTiming::rfc7252() : transport::CoapTiming::wan();
      wan_settings.label = wan_timing;
      return run_wan(wan_settings);
    }
    if (keystore.parsed()) return write_keystore(keystore_path, keystore_devices);
    if (transfer.parsed()) return run_transfer(transfer_settings);
    if (flood.parsed()) return run_flood_bench(flood_settings);
    if (spoof.parsed()) return run_spoof(spoof_settings);
    if (probe.parsed()) return run_probe_handshakes(probe_settings);
    if (auto conflict = load_conflict(load, load_settings)) {
      std::fprintf(stderr, "edgetrain-loadgen: %s\n", conflict->c_str());
      return 2;
    }
    return run_load(load_settings);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "edgetrain-loadgen: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-loadgen: %s\n", e.what());
    return 1;
  }
}
