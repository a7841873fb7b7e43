// edgetrain-emulation-report: the numbers of edgetrain-emulate, which is a bash launcher and
// so does no arithmetic and reads no program output itself:
//   plan        the seeded draws of a run (link profile and slowdown of every worker, with
//               splitmix64) and its address plan, as CSV for the launcher;
//   acknowledged  the highest server version any worker of a run got in a 2.04 (from the
//               workers' --stats-file), checked against a restarted server's recovery;
//   summarize   a finished run's workers.csv, outcome.json and summary.md, from the plan,
//               the workers' and servers' stats files, timeline.csv and links.csv;
//   settings    the emulator's own settings (flags and --config TOML, checked), printed as
//               shell assignments for the launcher;
//   cpu-plan    the CPU quota of every worker and its changes over the run (cgroups);
//   plot        an SVG line chart from a CSV of series,x,y (for scripts' aggregated curves);
//   compare     plots (accuracy against socket ingress and against time, one line per run)
//               and a markdown table with the traffic ratio to a target accuracy; the first
//               run is the reference of the ratio (give the ASGD run first). Also the
//               default: `edgetrain-emulation-report RUN_DIR... --out DIR`.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <type_traits>
#include <variant>

#include "common/settings.h"
#include "emulation/cpu_plan.h"
#include "emulation/gossip_report.h"
#include "emulation/report_files.h"
#include "common/svg_plot.h"
#include "common/splitmix64.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace edgetrain::emulation;

// ------------------------------------------------------------------------------ plan

// "A" or "A:B", numbers >= 0: a value drawn uniformly in [A, B] per worker.
struct Range {
  double lo = 0, hi = 0;
};

Range parse_range(const std::string& text, const std::string& what) {
  static const std::regex form(R"(^([0-9]*\.?[0-9]+)(:([0-9]*\.?[0-9]+))?$)");
  std::smatch m;
  if (!std::regex_match(text, m, form))
    throw std::invalid_argument(what + " must be a number or A:B");
  Range r;
  r.lo = std::stod(m[1].str());
  r.hi = m[3].matched ? std::stod(m[3].str()) : r.lo;
  return r;
}

struct LinkProfile {
  Range delay, jitter, loss, bandwidth;
};

// "delay=20:80,jitter=5,loss=0.01,bandwidth=1000:5000"; a key given twice: the first counts.
LinkProfile parse_link_profile(const std::string& text) {
  LinkProfile profile;
  std::map<std::string, Range*> keys = {{"delay", &profile.delay},
                                        {"jitter", &profile.jitter},
                                        {"loss", &profile.loss},
                                        {"bandwidth", &profile.bandwidth}};
  std::map<std::string, bool> seen;
  for (const std::string& item : split_fields(text)) {
    const auto equals = item.find('=');
    const std::string key = item.substr(0, equals);
    if (equals == std::string::npos || !keys.count(key)) {
      throw std::invalid_argument("--link: unknown item '" + item +
                                  "' (delay, jitter, loss, bandwidth)");
    }
    const Range value = parse_range(item.substr(equals + 1), "--link: " + key);
    if (!seen[key]) *keys[key] = value;
    seen[key] = true;
  }
  return profile;
}

// One draw for (seed, worker, key): splitmix64 of seed·φ + (worker+1)·c1 + hash(key)·c2,
// the top 52 bits as the fraction of [lo, hi]. These are the numbers of the bash draws the
// launcher used before (tests/emulation/emulate_plan_draws.sh keeps them): a seed gives
// every experiment the same devices it always had.
double draw(const Range& range, std::uint64_t seed, std::uint64_t worker, const std::string& key) {
  constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  std::uint64_t key_hash = 0;
  for (const char c : key) key_hash = key_hash * 31 + static_cast<unsigned char>(c);
  const std::uint64_t mixed =
      seed * kGolden + (worker + 1) * 0xbf58476d1ce4e5b9ULL + key_hash * 0x94d049bb133111ebULL;
  edgetrain::runtime::SplitMix64 generator{mixed - kGolden};  // next() adds φ back before mixing
  const std::uint64_t fraction_bits = generator.next() >> 12;
  return range.lo + (range.hi - range.lo) * static_cast<double>(fraction_bits) / 4503599627370496.0;
}

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

struct PlanOptions {
  std::uint64_t seed = 1;
  unsigned workers = 1;
  std::string link, slowdown = "0", network = "loopback";
  unsigned impaired = 0;
  bool all_impaired = true;
  int subnet = 100;
};

// Each worker's address and the impairer's listen address for it: on loopback 127.0.0.1
// and any port; in namespaces a /30 per worker in 10.S.0.0/16 (host side .1, worker .2).
std::pair<std::string, std::string> worker_addresses(const PlanOptions& o, unsigned worker) {
  if (o.network != "netns") return {"127.0.0.1", "127.0.0.1:0"};
  const unsigned base = worker * 4;
  const std::string prefix =
      "10." + std::to_string(o.subnet) + "." + std::to_string(base / 256) + ".";
  return {prefix + std::to_string(base % 256 + 2),
          prefix + std::to_string(base % 256 + 1) + ":5684"};
}

void print_plan(const PlanOptions& o) {
  const LinkProfile link = parse_link_profile(o.link);
  const Range slowdown = parse_range(o.slowdown, "--slowdown");
  const unsigned impaired = o.all_impaired ? o.workers : o.impaired;
  std::printf("worker,address,listen,delay_ms,jitter_ms,loss,bandwidth_kbps,slowdown,link_seed\n");
  for (unsigned i = 0; i < o.workers; i++) {
    const auto [address, listen] = worker_addresses(o, i);
    std::string delay = "0", jitter = "0", loss = "0", bandwidth = "0";
    if (i < impaired) {
      delay = number_text(draw(link.delay, o.seed, i, "delay"));
      jitter = number_text(draw(link.jitter, o.seed, i, "jitter"));
      loss = number_text(draw(link.loss, o.seed, i, "loss"));
      bandwidth = number_text(draw(link.bandwidth, o.seed, i, "bandwidth"));
    }
    std::printf("%u,%s,%s,%s,%s,%s,%s,%s,%llu\n", i, address.c_str(), listen.c_str(), delay.c_str(),
                jitter.c_str(), loss.c_str(), bandwidth.c_str(),
                number_text(draw(slowdown, o.seed, i, "slowdown")).c_str(),
                static_cast<unsigned long long>(o.seed * 100003 + i));
  }
}

// ------------------------------------------------------------------------------ stats files

// The highest server version any worker got in a 2.04; with `shard`, the highest version
// that shard of a sharded server acknowledged (a --shards worker's stats file keeps it per
// shard: shard_versions; a worker that has none yet counts 0).
std::uint64_t highest_acknowledged(const fs::path& run, unsigned workers,
                                   std::optional<unsigned> shard = {}) {
  std::uint64_t highest = 0;
  for (unsigned i = 0; i < workers; i++) {
    for (const fs::path& file : worker_stats_files(run, i)) {
      const json stats = read_json(file);
      if (!shard) {
        for (const auto& version : stats.at("acknowledged_versions"))
          highest = std::max(highest, version.get<std::uint64_t>());
      } else if (const auto it = stats.find("shard_versions");
                 it != stats.end() && it->is_array() && *shard < it->size()) {
        highest = std::max(highest, it->at(*shard).get<std::uint64_t>());
      }
    }
  }
  return highest;
}

// A worker's counters summed over its incarnations (one killed with SIGKILL counts up to
// its last stats write), and whether its acknowledged versions kept increasing.
struct WorkerTotals {
  std::uint64_t steps = 0, accepted = 0, refused = 0, bytes_sent = 0, retries = 0, incarnations = 0;
  bool versions_increase = true;
};

WorkerTotals worker_totals(const fs::path& run, unsigned worker) {
  WorkerTotals t;
  std::optional<std::uint64_t> previous;
  for (const fs::path& file : worker_stats_files(run, worker)) {
    const json stats = read_json(file);
    t.incarnations++;
    t.steps += stats.at("steps").get<std::uint64_t>();
    t.bytes_sent += stats.at("bytes_sent").get<std::uint64_t>();
    t.retries += stats.at("retries").get<std::uint64_t>();
    if (stats.value("mode", "async") == "rounds") {
      // A round worker's deltas accepted (2.04) and refused (4.09: its round had closed);
      // its acknowledged versions are the rounds acknowledged (round r is version r).
      t.accepted += stats.at("rounds_trained").get<std::uint64_t>();
      t.refused += stats.at("deltas_refused").get<std::uint64_t>();
    } else {
      t.accepted += stats.at("updates_accepted").get<std::uint64_t>();
      t.refused += stats.at("updates_refused").get<std::uint64_t>();
    }
    for (const auto& v : stats.at("acknowledged_versions")) {
      const auto version = v.get<std::uint64_t>();
      if (previous && version <= *previous) t.versions_increase = false;
      previous = version;
    }
  }
  return t;
}

// ------------------------------------------------------------------------------ shards

// A sharded run's ingress so far: over every shard and every incarnation of it (a shard
// killed with SIGKILL counts up to its last stats write, at most a second old), the
// payload and socket bytes of its stats file (logs/shard-J-K.stats.json).
std::pair<double, double> shard_ingress(const fs::path& run) {
  double payload = 0, socket = 0;
  const std::regex name(R"(shard-[0-9]+-[0-9]+\.stats\.json)");
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(run / "logs", error)) {
    if (!std::regex_match(entry.path().filename().string(), name)) continue;
    const json stats = read_json(entry.path());
    payload += stats.value("ingress_payload_bytes", 0.0);
    socket += stats.value("ingress_socket_bytes", 0.0);
  }
  return {payload, socket};
}

// One timeline.csv row from an evaluation of the shards' checkpoints, assembled. Its
// version is the mean of the shards' checkpoint versions, rounded: every worker update
// reaches every shard, so that is the count of updates applied, comparable with one
// server's version (the sum, which the workers see, would be N times larger).
std::string append_shard_row(const fs::path& run, double elapsed, const fs::path& eval_path) {
  const json eval = read_json(eval_path);
  const json& versions = eval.at("shard_versions");
  if (!versions.is_array() || versions.empty())
    throw std::invalid_argument(eval_path.string() + ": no shard_versions");
  double version_sum = 0;
  for (const json& v : versions) version_sum += v.get<double>();
  const auto [payload, socket] = shard_ingress(run);
  const fs::path timeline = run / "timeline.csv";
  if (!fs::exists(timeline))
    write_file(timeline,
               "elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes\n");
  const std::string row = fixed(elapsed, 0) + "," +
                          fixed(version_sum / static_cast<double>(versions.size()), 0) + "," +
                          fixed(eval.at("accuracy").get<double>(), 4) + "," + fixed(payload, 0) +
                          "," + fixed(socket, 0);
  std::ofstream(timeline, std::ios::app) << row << '\n';
  return row;
}

// ------------------------------------------------------------------------------ compare

struct Row {
  double seconds = 0;
  std::uint64_t version = 0;
  double accuracy = 0;
  std::uint64_t payload_bytes = 0, socket_bytes = 0;
};

struct Run {
  std::string directory, label;
  std::vector<Row> rows;
  // What the server's socket sent over the whole run, as the impairer received it
  // (links.csv to_worker_bytes_in; 0 without links.csv).
  double egress_bytes = 0;
};

// timeline.csv, written by edgetrain-emulate: elapsed_s,version,test_accuracy,
// ingress_payload_bytes,ingress_socket_bytes (cumulative over server restarts).
Run read_run(const std::string& directory) {
  Run run{directory, fs::path(directory).filename().string(), {}};
  if (std::ifstream label(directory + "/run.label"); label) std::getline(label, run.label);
  std::ifstream in(directory + "/timeline.csv");
  if (!in) throw std::invalid_argument("no timeline.csv in " + directory);
  std::string line;
  std::getline(in, line);
  if (line.rfind("elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes", 0) !=
      0) {
    throw std::invalid_argument(directory + "/timeline.csv: unexpected header '" + line + "'");
  }
  for (int number = 2; std::getline(in, line); number++) {
    Row r;
    char comma;
    std::istringstream fields(line);
    if (!(fields >> r.seconds >> comma >> r.version >> comma >> r.accuracy >> comma >>
          r.payload_bytes >> comma >> r.socket_bytes) ||
        !std::isfinite(r.accuracy)) {
      throw std::invalid_argument(directory + "/timeline.csv line " + std::to_string(number) +
                                  " is malformed");
    }
    run.rows.push_back(r);
  }
  const CsvTable links = read_csv(fs::path(directory) / "links.csv");
  for (std::size_t r = 0; r < links.rows.size(); r++)
    run.egress_bytes += links.number(r, "to_worker_bytes_in");
  return run;
}

const Row* first_reaching(const Run& run, double target) {
  for (const Row& r : run.rows)
    if (r.accuracy >= target) return &r;
  return nullptr;
}

double best_accuracy(const Run& run) {
  double best = 0;
  for (const Row& r : run.rows) best = std::max(best, r.accuracy);
  return best;
}

// Half a point below the lowest best accuracy of the runs.
double default_target(const std::vector<Run>& runs) {
  double lowest_best = 1;
  for (const Run& r : runs) lowest_best = std::min(lowest_best, best_accuracy(r));
  return std::floor((lowest_best - 0.005) * 1000) / 1000;
}

void write_plots(const std::vector<Run>& runs, double target, const std::string& out) {
  std::vector<edgetrain::plot::PlotSeries> by_ingress, by_time;
  for (const Run& run : runs) {
    // The legend has room for ~20 characters: the label without its parenthesized
    // setting ("(MLP, 10)"), or else the run directory's name (the table has the label).
    std::string legend = run.label.substr(0, run.label.find(" ("));
    if (legend.size() > 20) legend = fs::path(run.directory).filename().string();
    edgetrain::plot::PlotSeries ingress{legend, {}, {}}, time{legend, {}, {}};
    for (const Row& r : run.rows) {
      if (r.socket_bytes > 0)
        ingress.x.push_back(static_cast<double>(r.socket_bytes)), ingress.y.push_back(r.accuracy);
      time.x.push_back(r.seconds), time.y.push_back(r.accuracy);
    }
    by_ingress.push_back(std::move(ingress));
    by_time.push_back(std::move(time));
  }
  edgetrain::plot::PlotOptions plot;
  plot.y_label = "test accuracy";
  plot.reference_y = target;
  plot.title = "edgetrain-emulate: test accuracy against bytes at the server's socket";
  plot.x_label = "UDP bytes received by the server (DTLS, CoAP, handshakes, retransmissions)";
  plot.log_x = true;
  std::ofstream(out + "/accuracy-vs-ingress.svg")
      << edgetrain::plot::render_svg_line_chart(by_ingress, plot);
  plot.title = "edgetrain-emulate: test accuracy against time";
  plot.x_label = "seconds since the server started";
  plot.log_x = false;
  std::ofstream(out + "/accuracy-vs-time.svg")
      << edgetrain::plot::render_svg_line_chart(by_time, plot);
}

std::string table_row(const Run& run, double target, const Row* reference) {
  const Row last = run.rows.empty() ? Row{} : run.rows.back();
  const Row* reached = first_reaching(run, target);
  std::string ratio = "—";
  if (reached && reference && reached->socket_bytes) {
    char r[32];
    std::snprintf(r, sizeof r, "**%.1fx**",
                  static_cast<double>(reference->socket_bytes) / reached->socket_bytes);
    ratio = r;
  }
  const std::string time =
      reached ? std::to_string(static_cast<int>(reached->seconds)) + " s" : "not reached";
  std::string speedup = "—";
  if (reached && reference && reached->seconds > 0) {
    char r[32];
    std::snprintf(r, sizeof r, "%.1fx", reference->seconds / reached->seconds);
    speedup = r;
  }
  const std::string bytes = reached ? bytes_text(reached->socket_bytes) : "—";
  const double overhead =
      last.payload_bytes ? 100.0 * (static_cast<double>(last.socket_bytes) / last.payload_bytes - 1)
                         : 0;
  char line[512];
  std::snprintf(line, sizeof line,
                "| %s | %.2f%% | %.2f%% | %llu | %s | %s | %+.0f%% | %s | %s | %s | %s | %s |\n",
                run.label.c_str(), best_accuracy(run) * 100, last.accuracy * 100,
                static_cast<unsigned long long>(last.version),
                bytes_text(last.socket_bytes).c_str(), bytes_text(last.payload_bytes).c_str(),
                overhead, time.c_str(), speedup.c_str(), bytes.c_str(), ratio.c_str(),
                run.egress_bytes > 0 ? bytes_text(run.egress_bytes).c_str() : "—");
  return line;
}

std::string comparison_table(const std::vector<Run>& runs, double target) {
  std::ostringstream table;
  char target_text[32];
  std::snprintf(target_text, sizeof target_text, "%.1f%%", target * 100);
  table << "| run | best test acc | final | updates | socket ingress | payload ingress | transport "
           "overhead | time to "
        << target_text << " | time ratio " << runs.front().label << " / this | socket bytes to "
        << target_text << " | ratio " << runs.front().label
        << " / this | socket egress (whole run) |\n"
        << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  const Row* reference = first_reaching(runs.front(), target);
  for (const Run& run : runs) table << table_row(run, target, reference);
  return table.str();
}

// Plots in OUT and the table, returned (and written to OUT/summary.md when asked).
std::string compare_runs(const std::vector<std::string>& directories, const std::string& out,
                         double target, bool write_summary) {
  std::vector<Run> runs;
  for (const auto& d : directories) runs.push_back(read_run(d));
  if (target < 0) target = default_target(runs);
  fs::create_directories(out);
  write_plots(runs, target, out);
  const std::string table = comparison_table(runs, target);
  if (write_summary) std::ofstream(out + "/summary.md") << table;
  return table;
}

// ------------------------------------------------------------------------------ summarize

struct SummarizeOptions {
  std::string run, stop_kind, stopped, network, mode = "async";
  std::uint32_t checkpoint_every = 20;  // gossip: the peers' --checkpoint-every
  std::string reached;  // the timeline row that met the target: elapsed_s,version,accuracy,...
  double target = -1;
};

// workers.csv: the plan's columns and each worker's counters over its incarnations.
std::vector<WorkerTotals> write_workers_csv(const fs::path& run, const CsvTable& plan) {
  std::vector<WorkerTotals> totals;
  std::ofstream out(run / "workers.csv");
  out << "worker,address,delay_ms,jitter_ms,loss,bandwidth_kbps,slowdown,steps,updates_accepted,"
         "refused_stale,"
         "payload_bytes_sent,retries,restarts\n";
  for (std::size_t i = 0; i < plan.rows.size(); i++) {
    const auto& p = plan.rows[i];
    const WorkerTotals t = worker_totals(run, static_cast<unsigned>(i));
    out << i;
    for (const char* column :
         {"address", "delay_ms", "jitter_ms", "loss", "bandwidth_kbps", "slowdown"}) {
      out << ',' << p.at(plan.column(column));
    }
    out << ',' << t.steps << ',' << t.accepted << ',' << t.refused << ',' << t.bytes_sent << ','
        << t.retries << ',' << (t.incarnations ? t.incarnations - 1 : 0) << '\n';
    totals.push_back(t);
  }
  return totals;
}

// restarts.csv (elapsed_s,highest_acknowledged,recovered_version), one row per server restart.
json restart_checks(const fs::path& run) {
  const CsvTable restarts = read_csv(run / "restarts.csv");
  json checks = json::array();
  for (std::size_t r = 0; r < restarts.rows.size(); r++) {
    const auto acknowledged =
        static_cast<std::uint64_t>(restarts.number(r, "highest_acknowledged"));
    const std::string recovered_text = restarts.rows[r].at(restarts.column("recovered_version"));
    json check = {{"elapsed_s", restarts.number(r, "elapsed_s")},
                  {"highest_acknowledged", acknowledged}};
    check["recovered_version"] =
        recovered_text.empty() ? json(nullptr) : json(std::stoull(recovered_text));
    check["lost"] = recovered_text.empty() || std::stoull(recovered_text) < acknowledged;
    checks.push_back(check);
  }
  return checks;
}

json outcome_json(const SummarizeOptions& o, const std::vector<WorkerTotals>& totals,
                  const json& restarts) {
  json outcome = {{"stop", o.stop_kind},
                  {"stopped", o.stopped},
                  {"network", o.network},
                  {"server_restarts", restarts}};
  outcome["target_reached"] = nullptr;
  if (const auto f = split_fields(o.reached); f.size() >= 3) {
    outcome["target_reached"] = {{"elapsed_s", std::stod(f[0])},
                                 {"version", std::stoull(f[1])},
                                 {"accuracy", std::stod(f[2])}};
  }
  json increasing = json::array();
  bool lost = false;
  for (const auto& check : restarts) lost = lost || check.at("lost").get<bool>();
  for (const WorkerTotals& t : totals) {
    increasing.push_back(t.versions_increase);
    lost = lost || !t.versions_increase;
  }
  outcome["acknowledged_versions_increase"] = increasing;
  outcome["lost_acknowledged_updates"] = lost;
  return outcome;
}

std::string integer_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f", value);
  return text;
}

// The sum of COLUMNS over every row of TABLE (0 for a missing file).
double column_sum(const CsvTable& table, std::initializer_list<const char*> columns) {
  double sum = 0;
  for (std::size_t r = 0; r < table.rows.size(); r++)
    for (const char* c : columns) sum += table.number(r, c);
  return sum;
}

// The lines of summary.md after the launcher's settings: outcome and where the bytes went.
std::string outcome_lines(const SummarizeOptions& o, const json& outcome,
                          const std::vector<WorkerTotals>& totals) {
  const fs::path run = o.run;
  const CsvTable timeline = read_csv(run / "timeline.csv"), links = read_csv(run / "links.csv");
  double accepted = 0, worker_payload = 0;
  for (const WorkerTotals& t : totals) accepted += t.accepted, worker_payload += t.bytes_sent;
  const auto last = [&](const char* column) {
    return timeline.rows.empty() ? std::string("0")
                                 : timeline.rows.back().at(timeline.column(column));
  };
  std::ostringstream text;
  text << "- stopped: " << o.stopped << "\n- acknowledged updates lost: ";
  if (outcome.at("lost_acknowledged_updates").get<bool>())
    text << "YES (see events.log)\n";
  else
    text << "none (" << outcome.at("server_restarts").size()
         << " server restarts checked; every worker's acknowledged versions increase)\n";
  text << "- updates accepted (workers' count): " << integer_text(accepted)
       << "; the server's last evaluated version: "
       << (timeline.rows.empty() ? "" : last("version")) << "\n"
       << "- bytes: socket ingress " << integer_text(std::stod(last("ingress_socket_bytes")))
       << " (server, up to its last evaluation), relayed to the server by the impairer "
       << integer_text(column_sum(links, {"to_server_bytes_out"}))
       << ", socket egress (what the server sent, as the "
       << "impairer received it) " << integer_text(column_sum(links, {"to_worker_bytes_in"}))
       << ", update payload accepted by the server "
       << integer_text(std::stod(last("ingress_payload_bytes")))
       << ", update payload sent by the workers " << integer_text(worker_payload)
       << "; datagrams dropped by the impairer "
       << integer_text(
              column_sum(links, {"to_server_dropped_loss", "to_server_dropped_queue_full",
                                 "to_worker_dropped_loss", "to_worker_dropped_queue_full"}))
       << "\n";
  return text.str();
}

// workers.csv, outcome.json, plots and summary.md of one run; the status is 3 when an
// acknowledged update was lost (a restart check failed or a worker's versions went back).
int summarize(const SummarizeOptions& o) {
  const fs::path run = o.run;
  const CsvTable plan = read_csv(run / "plan.csv");
  if (plan.rows.empty()) throw std::invalid_argument("no plan.csv in " + o.run);
  const std::vector<WorkerTotals> totals = write_workers_csv(run, plan);
  const json outcome = outcome_json(o, totals, restart_checks(run));
  std::ofstream(run / "outcome.json") << outcome.dump(2) << "\n";
  for (std::size_t i = 0; i < totals.size(); i++) {
    if (!totals[i].versions_increase)
      std::printf(
          "LOST ACKNOWLEDGED UPDATES: worker %zu saw an acknowledged version repeat or go back\n",
          i);
  }
  std::string label = read_text(run / "run.label");
  if (!label.empty() && label.back() == '\n') label.pop_back();
  std::string table;
  try {
    table = compare_runs({o.run}, o.run, o.target, false);
  } catch (const std::exception& e) {
    table = std::string("(no table: ") + e.what() + ")\n";
  }
  std::ofstream(run / "summary.md")
      << "# " << label << "\n\n"
      << read_text(run / "settings.md") << outcome_lines(o, outcome, totals) << "\n"
      << table;
  return outcome.at("lost_acknowledged_updates").get<bool>() ? 3 : 0;
}

// ------------------------------------------------------------------------------ settings

// edgetrain-emulate's settings: one table for its flags and its --config TOML file (a key is
// its flag's name with '_': `pull_every = 10`), their defaults, ranges and help. The
// launcher evaluates what `settings` prints: one shell assignment per setting, the
// variable named like the TOML key.
struct EmulatorSettings {
  std::uint32_t workers = 10, pull_every = 1, batch = 10, max_staleness = 0, qemu_workers = 0;
  std::string model = "paper-cnn", data = "mnist", compressor = "adacomp", network = "auto";
  std::string label, link, impaired = "all", slowdown = "0", fail, out = "emulation-results/run";
  std::string build_dir, aarch64_build_dir;
  std::string cpu_classes, cpu_schedule;  // emulation/cpu_plan.h; empty classes: no CPU quotas
  std::uint32_t cpu_period = 100000;      // µs
  std::uint32_t shards = 0, shard_checkpoint_every = 50;  // 0: one unsharded server
  double max_parameter_magnitude = 0;                     // 0: the server's default
  std::uint32_t publish_every = 0;                        // 0: workers pull the exact model
  double publish_fraction = 0.01;
  double rate = 0.01, lr = 0.1, duration = 300, target_accuracy = 0, eval_interval = 2,
         request_timeout = 30;
  std::uint64_t seed = 1;
  bool error_feedback = false, fp16 = false, sign_scale = false, quiet = false, label_skew = false;
  // Federated rounds (the server's and the worker's --mode rounds).
  std::string mode = "async", round_policy = "drop-stragglers", aggregation = "masked";
  double round_deadline = 30, client_fraction = 1, local_lr = 0.05, server_lr = 1;
  std::uint32_t local_steps = 10, local_epochs = 0;
  // Filter dropout (DISTREAL): one vector for every worker, one per CPU class, or a table.
  std::string drop_rates, class_drop_rates, dropout_table;
  double step_time_budget = 0, deadline_share = 0.8;
  // Gossip (no server; the worker's --mode gossip): emulation/README.md "Gossip runs".
  std::string topology = "ring", gossip = "d-psgd";
  std::uint32_t degree = 4, plateau_patience = 0, validate_every = 50, checkpoint_every = 10,
                eval_examples = 1000;
  std::uint32_t wait_steps = 0;
  double gossip_publish_fraction = 1, consensus_step = 0, neighbour_wait = 5, balance_target = 0,
         max_lr_factor = 8;
};

void declare_experiment(edgetrain::settings::Table& t, EmulatorSettings& s) {
  t.group("Experiment");
  t.add("workers", s.workers, "number of worker processes").range(1, 4000);
  t.add("model", s.model, "the model").choices({"paper-cnn", "mlp"});
  t.add("data", s.data, "training and test data")
      .choices({"mnist", "mnist-small", "fashion-mnist"});
  t.add("compressor", s.compressor, "adacomp, or none (dense ASGD)").choices({"adacomp", "none"});
  t.add("rate", s.rate, "AdaComp compression rate (the worker checks it)");
  t.add("error-feedback", s.error_feedback,
        "workers keep what they did not send (beyond the paper)");
  t.add("fp16", s.fp16, "workers send values as fp16 (excludes --sign-scale)");
  t.add("sign-scale", s.sign_scale,
        "workers send one fp32 scale and a sign bit per value (excludes --fp16)");
  t.add("pull-every", s.pull_every, "steps per model pull (1: the paper's)").range(1, 1000000);
  t.add("batch", s.batch, "minibatch (the worker checks it)");
  t.add("lr", s.lr, "the server's learning rate (the server checks it)");
  t.add("max-staleness", s.max_staleness,
        "the server's largest accepted delay (0: the server's default)");
  t.add("max-parameter-magnitude", s.max_parameter_magnitude,
        "the server's bound on parameters; updates beyond it get 4.22 (0: the server's default)")
      .range(0, 3.4e38);
  t.add("publish-every", s.publish_every,
        "the server's --publish-every: workers pull a published model that "
        "follows the true one by small steps (0: the exact model)")
      .range(0, 1000000)
      .unit("updates");
  t.add("publish-fraction", s.publish_fraction, "the server's --publish-fraction").range(1e-6, 1);
  t.add("duration", s.duration, "stop after this long").range(0, 1e9).unit("seconds");
  t.add("target-accuracy", s.target_accuracy,
        "stop once the evaluator reports this and every --fail event happened (0: off)")
      .range(0, 1);
  t.add("shards", s.shards,
        "async: a sharded server of this many edgetrain-server --shard I/N processes, every worker "
        "posting its update's slices to each (0: one unsharded server)")
      .range(0, 64);
  t.add("shard-checkpoint-every", s.shard_checkpoint_every,
        "with --shards: updates between a shard's checkpoints, "
        "from which the assembled model is evaluated")
      .range(1, 1000000);
  t.add("eval-interval", s.eval_interval, "between the server's evaluations")
      .range(0, 1e9)
      .unit("seconds");
  t.add("request-timeout", s.request_timeout,
        "a worker's bound on one request (the impairer passes no ICMP)")
      .range(0, 1e9)
      .unit("seconds");
  t.add("seed", s.seed, "draws of link profiles, slowdowns and loss");
  t.add("label", s.label, "name of the run in plots and tables (empty: from the options)");
  t.add("label-skew", s.label_skew,
        "label-skewed shards (the worker's --label-skew) instead of i.i.d.");
  t.group("Federated rounds (server/README.md, worker/README.md)");
  t.add(
       "mode", s.mode,
       "async: asynchronous SGD; rounds: federated rounds (server and workers); gossip: no server, "
       "the workers are peers that average models with their neighbours")
      .choices({"async", "rounds", "gossip"});
  t.add("round-policy", s.round_policy, "rounds: drop-stragglers or wait-all")
      .choices({"drop-stragglers", "wait-all"});
  t.add("round-deadline", s.round_deadline, "rounds: how long a round stays open")
      .range(0.1, 1e6)
      .unit("seconds");
  t.add("aggregation", s.aggregation, "rounds: masked or fedavg").choices({"masked", "fedavg"});
  t.add("client-fraction", s.client_fraction, "rounds: share of the devices selected per round")
      .range(1e-6, 1);
  t.add("local-steps", s.local_steps, "rounds: minibatches a selected device trains per round")
      .range(1, 1000000);
  t.add("local-epochs", s.local_epochs,
        "rounds: passes over its shard instead of --local-steps (0: steps)")
      .range(0, 1000);
  t.add("local-lr", s.local_lr, "rounds and gossip: the workers' local SGD learning rate")
      .range(1e-9, 100);
  t.add("server-lr", s.server_lr,
        "rounds: the server moves the model by this times the aggregated delta")
      .range(1e-6, 100);
  t.group(
      "Gossip (--mode gossip: worker/README.md \"Gossip\", emulation/README.md \"Gossip runs\")");
  t.add("topology", s.topology, "gossip: the peers' graph")
      .choices({"ring", "random-regular", "full"});
  t.add("degree", s.degree, "gossip, random-regular: neighbours per peer").range(1, 4000);
  t.add("gossip", s.gossip, "gossip: d-psgd (a barrier per iteration) or ad-psgd (pairwise, none)")
      .choices({"d-psgd", "ad-psgd"});
  t.add("gossip-publish-fraction", s.gossip_publish_fraction,
        "gossip, d-psgd: share of each tensor a neighbour's "
        "copy moves by per iteration (1: dense; 0.01: compressed gossip)")
      .range(1e-6, 1);
  t.add("consensus-step", s.consensus_step,
        "gossip, d-psgd: the peers' --consensus-step (0: their default)")
      .range(0, 1);
  t.add("neighbour-wait", s.neighbour_wait,
        "gossip, d-psgd: how long a peer waits for a neighbour behind it")
      .range(0, 3600)
      .unit("seconds");
  t.add("balance-target", s.balance_target,
        "gossip: workload balancing, a step's target time (0: off)")
      .range(0, 3600)
      .unit("seconds");
  t.add("wait-steps", s.wait_steps,
        "gossip, d-psgd: the peers' --wait-steps (local steps a peer may take while a "
        "neighbour is behind; 0: off)")
      .range(0, 1000);
  t.add("max-lr-factor", s.max_lr_factor,
        "gossip, with --balance-target: the peers' --max-lr-factor (the lr follows "
        "the batch linearly up to this many times --local-lr)")
      .range(1, 64);
  t.add("plateau-patience", s.plateau_patience,
        "gossip: accuracy-aware training, the peers' --plateau-patience (0: off)")
      .range(0, 1000);
  t.add("validate-every", s.validate_every, "gossip: iterations between a peer's validations")
      .range(1, 1000000);
  t.add("checkpoint-every", s.checkpoint_every,
        "gossip: iterations between a peer's checkpoints (the fleet's "
        "evaluations read them)")
      .range(1, 1000000000);
  t.add("eval-examples", s.eval_examples,
        "gossip and --shards: test images per evaluation of the fleet (or the "
        "assembled model) during the run (the final one uses all)")
      .range(1, 1000000);
  t.group("Filter dropout (DISTREAL: worker/README.md)");
  t.add("drop-rates", s.drop_rates,
        "every worker trains this sub-network: one rate per conv layer, e.g. 0.25,0.5");
  t.add("class-drop-rates", s.class_drop_rates,
        "a static width per CPU class (HeteroFL-style): CLASS=R1:R2,... "
        "e.g. pi5=0:0,zero2w=0.5:0.5 (classes of --cpu-classes; a class not named trains the full "
        "model)");
  t.add("dropout-table", s.dropout_table,
        "workers choose their drop rates at run time from this table "
        "(edgetrain-dse's JSON)");
  t.add("step-time-budget", s.step_time_budget, "async with --dropout-table: a step's time budget")
      .range(0, 1e9)
      .unit("ms");
  t.add("deadline-share", s.deadline_share,
        "rounds with --dropout-table: share of the time left before the "
        "deadline the local steps may take")
      .range(0.01, 1);
}

void declare_devices(edgetrain::settings::Table& t, EmulatorSettings& s) {
  t.group("Devices and network");
  t.add("network", s.network, "namespaces if 'ip netns add' works (auto), or forced")
      .choices({"auto", "netns", "loopback"});
  t.add("link", s.link,
        "impaired link, e.g. delay=20:80,jitter=5,loss=0.01,bandwidth=1000:5000 (ms, probability, "
        "kbit/s; A:B drawn per worker)");
  t.add("impaired", s.impaired, "how many workers (the first K) get --link, or all");
  t.add("slowdown", s.slowdown,
        "A[:B]: a worker sleeps F x its step's compute time, F drawn per worker");
  t.add("qemu-workers", s.qemu_workers,
        "the last K workers are the aarch64 build under qemu-aarch64");
  t.add("cpu-classes", s.cpu_classes,
        "speed classes as CPU quotas, each worker in its own cgroup: NAME=SHARE,... "
        "(SHARE of one core, e.g. pi4=0.6,zero2w=0.2; worker i in class i mod K; needs root; "
        "empty: no quotas)");
  t.add("cpu-schedule", s.cpu_schedule,
        "quota changes during the run: START-END:FACTOR[@CLASS],... (seconds; "
        "e.g. 60-120:0.5 halves every worker's share for a minute)");
  t.add("cpu-period", s.cpu_period, "the cgroup's CPU period").range(1000, 1000000).unit("µs");
  t.group("Failures");
  t.add("fail", s.fail,
        "kill-worker:I@T[+D] (SIGKILL worker I at T s, restart D s later; default 5, +0 never), "
        "kill-server@T[+D] (restart D s later, default 3), kill-shard:J@T[+D] (with --shards), "
        "comma-separated");
  t.group("Paths");
  t.add("out", s.out, "output directory; emptied first if it holds an earlier run");
  t.add("build-dir", s.build_dir, "host build tree (empty: <repo>/build/host)");
  t.add("aarch64-build-dir", s.aarch64_build_dir,
        "aarch64 build tree (empty: <repo>/build/aarch64)");
  t.add("quiet", s.quiet, "no progress line");
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  return items;
}

// Checks that relate settings, or read one's text (the table checks each alone).
void check_emulator_settings(const EmulatorSettings& s) {
  if (s.fp16 && s.sign_scale)
    throw std::invalid_argument(
        "--fp16 and --sign-scale exclude each other (choose one value encoding)");
  if (s.qemu_workers > s.workers)
    throw std::invalid_argument("--qemu-workers must be 0..--workers");
  const int dropout_choices =
      !s.drop_rates.empty() + !s.class_drop_rates.empty() + !s.dropout_table.empty();
  if (dropout_choices > 1)
    throw std::invalid_argument("give one of --drop-rates, --class-drop-rates and --dropout-table");
  if (!s.class_drop_rates.empty() && s.cpu_classes.empty())
    throw std::invalid_argument("--class-drop-rates needs --cpu-classes");
  if (!s.class_drop_rates.empty()) {
    const auto classes = edgetrain::emulation::parse_cpu_classes(s.cpu_classes);
    for (const std::string& item : split_commas(s.class_drop_rates)) {
      const auto equals = item.find('=');
      const std::string name = item.substr(0, equals);
      if (equals == std::string::npos ||
          std::none_of(classes.begin(), classes.end(),
                       [&](const auto& c) { return c.name == name; }))
        throw std::invalid_argument("--class-drop-rates: '" + item +
                                    "' is not CLASS=R1:R2 with a class of --cpu-classes");
      if (!std::regex_match(item.substr(equals + 1), std::regex("[0-9.]+(:[0-9.]+)*")))
        throw std::invalid_argument("--class-drop-rates: '" + item +
                                    "': rates are numbers separated by ':'");
    }
  }
  if (s.mode == "async" && !s.dropout_table.empty() && !(s.step_time_budget > 0))
    throw std::invalid_argument("--dropout-table in async mode needs --step-time-budget");
  if (s.mode == "gossip") {
    if (s.workers < 2)
      throw std::invalid_argument("--mode gossip needs at least 2 workers (peers)");
    if (s.fail.find("kill-server") != std::string::npos)
      throw std::invalid_argument(
          "--mode gossip has no server to kill (kill-worker:I@T kills a peer)");
    if (!s.drop_rates.empty() || !s.class_drop_rates.empty() || !s.dropout_table.empty())
      throw std::invalid_argument(
          "--mode gossip trains the whole model: no --drop-rates, --class-drop-rates or "
          "--dropout-table");
  }
  if (s.shards > 0) {
    if (s.mode != "async")
      throw std::invalid_argument(
          "--shards is for --mode async (a shard serves /model and /update only)");
    if (s.publish_every > 0)
      throw std::invalid_argument("--shards and --publish-every exclude each other");
    if (s.fail.find("kill-server") != std::string::npos)
      throw std::invalid_argument("with --shards, kill one shard: kill-shard:J@T[+D]");
  } else if (s.fail.find("kill-shard") != std::string::npos) {
    throw std::invalid_argument("kill-shard:J@T needs --shards");
  }
  if (s.impaired != "all" && !std::regex_match(s.impaired, std::regex("[0-9]+")))
    throw std::invalid_argument("--impaired must be a number or 'all'");
  parse_link_profile(s.link);
  parse_range(s.slowdown, "--slowdown");
  if (s.cpu_classes.empty()) {
    if (!s.cpu_schedule.empty()) throw std::invalid_argument("--cpu-schedule needs --cpu-classes");
  } else {
    edgetrain::emulation::parse_cpu_schedule(
        s.cpu_schedule, edgetrain::emulation::parse_cpu_classes(s.cpu_classes));
  }
}

std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// 0.01, not 0.010000000000000000208: 15 digits hold every value a person types.
std::string shortest_number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", value);
  return text;
}

std::string field_text(const edgetrain::settings::Field& field) {
  return std::visit(
      [](auto* value) {
        using T = std::decay_t<decltype(*value)>;
        if constexpr (std::is_same_v<T, std::string>)
          return *value;
        else if constexpr (std::is_same_v<T, bool>)
          return std::string(*value ? "1" : "0");
        else if constexpr (std::is_floating_point_v<T>)
          return shortest_number_text(*value);
        else
          return std::to_string(*value);
      },
      field);
}

int print_emulator_settings(int argc, char** argv) {
  EmulatorSettings s;
  edgetrain::settings::Table table(
      "edgetrain-emulate",
      "edgetrain-emulate [options]: one emulated experiment with the real programs: "
      "edgetrain-server on 127.0.0.1\n"
      "and N edgetrain-worker processes behind a user-space link impairer (emulation/README.md). "
      "Settings come\n"
      "from flags, or from a TOML file (--config) whose keys are the flags' names with '_'.");
  declare_experiment(table, s);
  declare_devices(table, s);
  if (const auto status = table.parse(argc, argv)) return *status;
  try {
    check_emulator_settings(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-emulate: %s\n", e.what());
    return 2;
  }
  for (const auto& setting : table.settings())
    std::printf("%s=%s\n", setting->key().c_str(),
                shell_quoted(field_text(setting->field())).c_str());
  return 0;
}

// ------------------------------------------------------------------------------ command line

void add_plan_command(CLI::App& app, PlanOptions& o) {
  CLI::App* plan =
      app.add_subcommand("plan",
                         "print a run's per-worker plan as CSV: address, the impairer's listen "
                         "address, link profile and slowdown drawn for the seed, link seed");
  plan->add_option("--seed", o.seed, "seed of the draws")->capture_default_str();
  plan->add_option("--workers", o.workers, "number of workers")
      ->required()
      ->check(CLI::Range(1u, 4000u));
  plan->add_option("--link", o.link,
                   "impaired link, e.g. delay=20:80,jitter=5,loss=0.01,bandwidth=1000:5000");
  plan->add_option("--impaired", o.impaired,
                   "how many workers (the first K) get --link (default: all)")
      ->each([&o](const std::string&) { o.all_impaired = false; });
  plan->add_option("--slowdown", o.slowdown, "A or A:B, drawn per worker")->capture_default_str();
  plan->add_option("--network", o.network, "loopback or netns")
      ->check(CLI::IsMember({"loopback", "netns"}))
      ->capture_default_str();
  plan->add_option("--subnet", o.subnet, "S of 10.S.0.0/16 (netns)")
      ->check(CLI::Range(0, 255))
      ->capture_default_str();
  plan->callback([&o] { print_plan(o); });
}

void add_run_commands(CLI::App& app, std::string& run, SummarizeOptions& s) {
  CLI::App* acknowledged =
      app.add_subcommand("acknowledged",
                         "print the highest server version any worker of RUN_DIR "
                         "got in a 2.04 (from logs/worker-*.stats.json)");
  acknowledged->add_option("run", run, "run directory")->required()->check(CLI::ExistingDirectory);
  static std::optional<unsigned> shard;
  acknowledged->add_option("--shard", shard,
                           "a sharded server's shard J: the highest version it acknowledged");
  acknowledged->callback([&run] {
    const CsvTable plan = read_csv(fs::path(run) / "plan.csv");
    std::printf("%llu\n", static_cast<unsigned long long>(highest_acknowledged(
                              run, static_cast<unsigned>(plan.rows.size()), shard)));
  });
  static double elapsed = 0;
  static std::string eval;
  CLI::App* row =
      app.add_subcommand("shard-row",
                         "--shards: append one evaluation of the assembled model "
                         "(edgetrain-fleet-eval --shards's JSON) to RUN_DIR/timeline.csv, "
                         "with the shards' ingress, and print the row");
  row->add_option("run", run, "run directory")->required()->check(CLI::ExistingDirectory);
  row->add_option("--elapsed", elapsed,
                  "seconds since the workers started, when the checkpoints were evaluated")
      ->required();
  row->add_option("--eval", eval, "edgetrain-fleet-eval's JSON")
      ->required()
      ->check(CLI::ExistingFile);
  row->callback([&run] { std::printf("%s\n", append_shard_row(run, elapsed, eval).c_str()); });
  CLI::App* summary =
      app.add_subcommand("summarize",
                         "write workers.csv, outcome.json, the plots and summary.md of a "
                         "finished run; exit status 3 if an acknowledged update was lost");
  summary->add_option("run", s.run, "run directory")->required()->check(CLI::ExistingDirectory);
  summary->add_option("--stop-kind", s.stop_kind, "why the run stopped")
      ->required()
      ->check(CLI::IsMember({"target", "time", "workers-gone"}));
  summary->add_option("--stopped", s.stopped, "the stop, in words")->required();
  summary->add_option("--network", s.network, "loopback or netns")->required();
  summary->add_option(
      "--reached", s.reached,
      "the timeline.csv row that met the target (elapsed_s,version,test_accuracy,...)");
  summary->add_option("--target-accuracy", s.target,
                      "target accuracy of the table (default: the report's)");
  summary->add_option("--mode", s.mode, "the run's mode (gossip: peers, no server)")
      ->check(CLI::IsMember({"async", "rounds", "gossip"}))
      ->capture_default_str();
  summary
      ->add_option("--checkpoint-every", s.checkpoint_every,
                   "gossip: the peers' --checkpoint-every (restart check)")
      ->capture_default_str();
}

// The wiring and the evaluations of a gossip run (emulation/gossip_report.h).
struct GossipCommands {
  std::string run, network = "loopback", eval, out;
  std::vector<std::string> runs;
  double target = 0.97;
  int subnet = 100;
  double elapsed = 0;
};

void add_gossip_commands(CLI::App& app, GossipCommands& g) {
  CLI::App* wiring =
      app.add_subcommand("gossip-wiring",
                         "gossip: from RUN_DIR/plan.csv and topology.json, write every "
                         "peer's address into topology.json, peers.csv and the "
                         "impairer's links.toml (a link per directed edge)");
  wiring->add_option("run", g.run, "run directory")->required()->check(CLI::ExistingDirectory);
  wiring->add_option("--network", g.network, "loopback or netns")
      ->check(CLI::IsMember({"loopback", "netns"}))
      ->required();
  wiring->add_option("--subnet", g.subnet, "S of the run's addresses")
      ->check(CLI::Range(0, 255))
      ->required();
  wiring->callback([&g] { write_gossip_wiring(g.run, g.network, g.subnet); });
  CLI::App* topologies = app.add_subcommand("gossip-topologies",
                                            "gossip: once the impairer listens, write "
                                            "RUN_DIR/peers/NAME.topology.json (neighbours' "
                                            "addresses: the impairer's ends of the links)");
  topologies->add_option("run", g.run, "run directory")->required()->check(CLI::ExistingDirectory);
  topologies->callback([&g] { write_peer_topologies(g.run); });
  CLI::App* row =
      app.add_subcommand("gossip-row",
                         "gossip: append one fleet evaluation (edgetrain-fleet-eval's "
                         "JSON) to RUN_DIR/gossip-timeline.csv and timeline.csv, and print "
                         "the timeline.csv row");
  row->add_option("run", g.run, "run directory")->required()->check(CLI::ExistingDirectory);
  row->add_option("--elapsed", g.elapsed,
                  "seconds since the peers started, when the checkpoints were evaluated")
      ->required();
  row->add_option("--eval", g.eval, "edgetrain-fleet-eval's JSON")
      ->required()
      ->check(CLI::ExistingFile);
  row->callback([&g] { std::printf("%s\n", append_gossip_row(g.run, g.elapsed, g.eval).c_str()); });
  CLI::App* compare =
      app.add_subcommand("gossip-compare",
                         "gossip runs beside each other and beside server runs of "
                         "the same fleet: a markdown table (time to the target, "
                         "speed-up against the first run, bytes per device) and plots");
  compare->add_option("runs", g.runs, "finished run directories (gossip or server)")
      ->required()
      ->check(CLI::ExistingDirectory);
  compare
      ->add_option("--out", g.out,
                   "directory for summary.md, accuracy-vs-time.svg, accuracy-vs-bytes.svg")
      ->required();
  compare->add_option("--target-accuracy", g.target, "the target accuracy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  compare->callback([&g] {
    std::vector<std::filesystem::path> runs(g.runs.begin(), g.runs.end());
    std::fputs(compare_gossip_runs(runs, g.out, g.target).c_str(), stdout);
  });
}

// The quota changes of a run with CPU classes (emulation/cpu_plan.h), as CSV for the launcher.
struct CpuPlanCommand {
  unsigned workers = 1;
  std::string classes, schedule;
  std::uint64_t period_us = 100000;
};

void add_cpu_plan_command(CLI::App& app, CpuPlanCommand& c) {
  CLI::App* command =
      app.add_subcommand("cpu-plan",
                         "print the CPU quota of every worker at 0 s and each change of "
                         "the schedule, as CSV: elapsed_s,worker,class,share,quota_us,period_us");
  command->add_option("--workers", c.workers, "number of workers")
      ->required()
      ->check(CLI::Range(1u, 4000u));
  command->add_option("--cpu-classes", c.classes, "NAME=SHARE,... (see edgetrain-emulate --help)")
      ->required();
  command->add_option("--cpu-schedule", c.schedule, "START-END:FACTOR[@CLASS],...");
  command->add_option("--cpu-period", c.period_us, "µs")->capture_default_str();
  command->callback([&c] {
    const auto classes = edgetrain::emulation::parse_cpu_classes(c.classes);
    const auto schedule = edgetrain::emulation::parse_cpu_schedule(c.schedule, classes);
    std::fputs(edgetrain::emulation::cpu_changes_csv(edgetrain::emulation::plan_cpu_changes(
                                                         c.workers, classes, schedule, c.period_us))
                   .c_str(),
               stdout);
  });
}

// A line chart from a CSV of (series, x, y) rows, one line per series in order of first
// appearance: scripts (docs/regenerate.sh) draw their aggregated curves with the programs'
// own plotting code.
struct PlotCommand {
  std::string csv, out;
  edgetrain::plot::PlotOptions options;
};

void plot_csv(const PlotCommand& p) {
  const CsvTable table = read_csv(p.csv);
  if (table.header.empty()) throw std::invalid_argument(p.csv + ": missing or empty");
  if (!(p.options.y_max > p.options.y_min))
    throw std::invalid_argument("--y-max must be above --y-min");
  const std::size_t series_column = table.column("series"), x_column = table.column("x"),
                    y_column = table.column("y");
  std::vector<edgetrain::plot::PlotSeries> series;
  for (std::size_t row = 0; row < table.rows.size(); ++row) {
    const auto& fields = table.rows[row];
    if (fields.size() != table.header.size())
      throw std::invalid_argument(p.csv + " line " + std::to_string(row + 2) + ": expected " +
                                  std::to_string(table.header.size()) + " fields");
    const std::string& name = fields[series_column];
    auto it =
        std::find_if(series.begin(), series.end(), [&](const auto& s) { return s.label == name; });
    if (it == series.end()) it = series.insert(series.end(), {name, {}, {}});
    it->x.push_back(std::stod(fields[x_column]));
    it->y.push_back(std::stod(fields[y_column]));
  }
  std::ofstream out(p.out);
  out << edgetrain::plot::render_svg_line_chart(series, p.options);
  if (!out.flush()) throw std::runtime_error("cannot write " + p.out);
}

void add_plot_command(CLI::App& app, PlotCommand& p) {
  CLI::App* plot =
      app.add_subcommand("plot",
                         "an SVG line chart from a CSV with the columns series,x,y (one line per "
                         "series; y in [0, 1] unless --y-min/--y-max say otherwise)");
  plot->add_option("csv", p.csv, "the CSV file")->required()->check(CLI::ExistingFile);
  plot->add_option("--out", p.out, "the SVG file to write")->required();
  plot->add_option("--title", p.options.title, "chart title");
  plot->add_option("--x-label", p.options.x_label, "x axis label");
  plot->add_option("--y-label", p.options.y_label, "y axis label")->capture_default_str();
  plot->add_flag("--log-x", p.options.log_x, "logarithmic x axis");
  plot->add_option("--y-min", p.options.y_min, "bottom of the y axis")->capture_default_str();
  plot->add_option("--y-max", p.options.y_max, "top of the y axis (e.g. 10 for an MNIST score)")
      ->capture_default_str();
  plot->add_option("--reference-y", p.options.reference_y,
                   "a dashed horizontal line at this y (e.g. a target)");
  plot->callback([&p] { plot_csv(p); });
}

}  // namespace

int main(int argc, char** argv) {
  // The emulator's settings have their own table (and command line): see print_emulator_settings.
  if (argc >= 2 && std::string(argv[1]) == "settings")
    return print_emulator_settings(argc - 1, argv + 1);
  CLI::App app{
      "edgetrain-emulation-report: the plan, checks and reports of edgetrain-emulate runs.\n"
      "Without a subcommand (or with `compare`): plots and a markdown table from run directories; "
      "the\n"
      "first run is the reference of the traffic ratio (give the ASGD run first)."};
  app.set_version_flag(
      "--version",
      "edgetrain-emulation-report " + std::string(edgetrain::settings::project_version()),
      "print the version and exit");
  PlanOptions plan;
  std::string run;
  SummarizeOptions summary;
  std::vector<std::string> directories;
  std::string out;
  double target = -1;
  add_plan_command(app, plan);
  add_run_commands(app, run, summary);
  GossipCommands gossip;
  add_gossip_commands(app, gossip);
  PlotCommand plot;
  plot.options.y_label = "test accuracy";
  add_plot_command(app, plot);
  CpuPlanCommand cpu_plan;
  add_cpu_plan_command(app, cpu_plan);
  CLI::App* compare = app.add_subcommand(
      "compare", "plots and a markdown table from run directories (the default)");
  for (CLI::App* command : {&app, compare}) {
    command
        ->add_option("runs", directories,
                     "run directories (each with timeline.csv, written by edgetrain-emulate)")
        ->check(CLI::ExistingDirectory);
    command->add_option(
        "--out", out, "directory for accuracy-vs-ingress.svg, accuracy-vs-time.svg and summary.md");
    command->add_option(
        "--target-accuracy", target,
        "target test accuracy of the ratio (default: half a point below the lowest best accuracy)");
  }
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
    if (app.got_subcommand("summarize") && summary.mode == "gossip") {
      return summarize_gossip({summary.run, summary.stop_kind, summary.stopped, summary.network,
                               summary.reached, summary.target, summary.checkpoint_every});
    }
    if (app.got_subcommand("summarize")) return summarize(summary);
    if (app.get_subcommands().empty() || app.got_subcommand("compare")) {
      if (directories.empty() || out.empty())
        throw CLI::ValidationError("compare needs run directories and --out");
      std::fputs(compare_runs(directories, out, target, true).c_str(), stdout);
      std::printf("plots: %s/accuracy-vs-ingress.svg, %s/accuracy-vs-time.svg\n", out.c_str(),
                  out.c_str());
    }
    return 0;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-emulation-report: %s\n", e.what());
    return 1;
  }
}
