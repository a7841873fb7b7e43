#include "emulation/gossip_report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "common/svg_plot.h"
#include "emulation/emulator_settings.h"
#include "emulation/report_files.h"

namespace edgetrain::emulation {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kPeerPort = 5684;

// The topology file (edgetrain-topology's JSON) as the report needs it: names and each
// peer's neighbours, checked enough that a bad file is a clear error, not a crash.
struct Fleet {
  json topology;
  std::vector<std::string> names;
  std::vector<std::set<std::size_t>> neighbours;
};

Fleet read_fleet(const fs::path& run) {
  Fleet f;
  f.topology = read_json(run / "topology.json");
  const json& peers = f.topology.at("peers");
  for (const json& p : peers) f.names.push_back(p.at("name").get<std::string>());
  f.neighbours.resize(f.names.size());
  for (const json& e : f.topology.at("edges")) {
    const auto a = e.at(0).get<std::size_t>(), b = e.at(1).get<std::size_t>();
    if (a >= f.names.size() || b >= f.names.size() || a == b)
      throw std::invalid_argument((run / "topology.json").string() + ": an edge names no peer");
    f.neighbours[a].insert(b);
    f.neighbours[b].insert(a);
  }
  return f;
}

std::string link_name(const Fleet& f, std::size_t from, std::size_t to) {
  return f.names[from] + "-" + f.names[to];
}

double number_or(const json& j, const char* key, double otherwise) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : otherwise;
}

// A peer's counters over its incarnations (each starts its counters at 0; its iteration
// is resumed from the checkpoint, so the last incarnation's is the peer's).
struct PeerTotals {
  std::uint64_t iteration = 0, steps = 0, exchanges = 0, skipped = 0, models_refused = 0,
                requests_refused = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0, batch = 0, incarnations = 0;
  std::vector<std::uint64_t> last_iterations, resumed_iterations;  // per incarnation
  // From its stats files' "neighbours": what it refused, clipped and mixed in of the
  // attackers' models, and what it refused and clipped of its honest neighbours'.
  std::uint64_t attacker_refused = 0, attacker_clipped = 0, attacker_mixed = 0,
                honest_refused = 0, honest_clipped = 0;
};

using Attackers = std::map<std::string, std::string>;  // name -> attack

Attackers attackers_of(const fs::path& run) {
  const auto list = gossip_attackers(run);
  return {list.begin(), list.end()};
}

PeerTotals peer_totals(const fs::path& run, unsigned peer, const Attackers& attackers = {}) {
  PeerTotals t;
  for (const fs::path& file : worker_stats_files(run, peer)) {
    json stats;
    try {
      stats = read_json(file);
    } catch (const std::exception&) {
      continue;  // written atomically: absent (never written) or whole
    }
    t.incarnations++;
    t.iteration = stats.value("iteration", std::uint64_t{0});
    t.steps += stats.value("steps", std::uint64_t{0});
    t.exchanges += stats.value("exchanges", std::uint64_t{0});
    t.skipped += stats.value("neighbours_skipped", std::uint64_t{0});
    t.models_refused += stats.value("models_refused", std::uint64_t{0});
    t.requests_refused += stats.value("requests_refused", std::uint64_t{0});
    t.bytes_sent += stats.value("bytes_sent", std::uint64_t{0});
    t.bytes_received += stats.value("bytes_received", std::uint64_t{0});
    t.batch = stats.value("batch", std::uint64_t{0});
    t.last_iterations.push_back(t.iteration);
    t.resumed_iterations.push_back(stats.value("resumed_iteration", std::uint64_t{0}));
    if (!stats.contains("neighbours") || !stats["neighbours"].is_object()) continue;
    for (const auto& [name, n] : stats["neighbours"].items()) {
      const auto refused = n.value("refused", std::uint64_t{0}),
                 clipped = n.value("clipped", std::uint64_t{0});
      if (attackers.count(name)) {
        t.attacker_refused += refused, t.attacker_clipped += clipped;
        t.attacker_mixed += n.value("mixed", std::uint64_t{0});
      } else {
        t.honest_refused += refused, t.honest_clipped += clipped;
      }
    }
  }
  return t;
}

double links_bytes_in(const fs::path& run) {
  const CsvTable links = read_csv(run / "links.csv");
  double sum = 0;
  for (std::size_t r = 0; r < links.rows.size(); r++)
    sum += links.number(r, "to_server_bytes_in") + links.number(r, "to_worker_bytes_in");
  return sum;
}

std::string percent(double accuracy) { return fixed(100 * accuracy, 2) + "%"; }

}  // namespace

void declare_gossip_wiring_settings(settings::Table& t, GossipWiringOptions& o) {
  t.add("network", o.network, "the run's network (required)")
      .choices({"loopback", "netns"})
      .required();
  t.add("subnet", o.subnet, "S of the run's addresses (required)").range(0, 255).required();
  t.add("malicious-peers", o.malicious_peers,
        "peers 0..N-1 are attackers (edgetrain-gossip-attacker), marked with --attack in "
        "peers.csv's attack column")
      .range(0, 4000);
  t.add("attack", o.attack, "the attackers' bias:V or scale:F (needed with --malicious-peers)");
}

void write_gossip_wiring(const fs::path& run, const std::string& network, int subnet,
                         std::uint32_t malicious, const std::string& attack) {
  const CsvTable plan = read_csv(run / "plan.csv");
  Fleet f = read_fleet(run);
  if (plan.rows.size() != f.names.size())
    throw std::invalid_argument("plan.csv has " + std::to_string(plan.rows.size()) +
                                " workers, topology.json " + std::to_string(f.names.size()) +
                                " peers");
  if (malicious >= f.names.size())
    throw std::invalid_argument("--malicious-peers " + std::to_string(malicious) +
                                " leaves no honest peer of " + std::to_string(f.names.size()));
  if (malicious > 0) check_gossip_attack(attack);
  if (malicious == 0 && !attack.empty())
    throw std::invalid_argument("--attack needs --malicious-peers N");
  std::vector<std::string> listen(f.names.size()), link_host(f.names.size());
  for (std::size_t i = 0; i < f.names.size(); i++) {
    const std::string address = plan.rows[i].at(plan.column("address"));
    const std::string impairer = plan.rows[i].at(plan.column("listen"));
    link_host[i] = impairer.substr(0, impairer.rfind(':'));
    if (network == "netns") {
      listen[i] = address + ":" + std::to_string(kPeerPort);
    } else {
      // Every 127/8 address is this machine's: one per peer, so all can use the CoAPs port.
      listen[i] = "127." + std::to_string(subnet) + "." + std::to_string(i / 200) + "." +
                  std::to_string(i % 200 + 10) + ":" + std::to_string(kPeerPort);
    }
    f.topology["peers"][i]["address"] = listen[i];
  }
  write_file(run / "topology.json", f.topology.dump(1) + "\n");
  std::ostringstream peers, links;
  peers << "peer,name,listen,neighbours,attack\n";
  for (std::size_t i = 0; i < f.names.size(); i++) {
    std::string list;
    for (std::size_t j : f.neighbours[i]) list += (list.empty() ? "" : ";") + std::to_string(j);
    peers << i << ',' << f.names[i] << ',' << listen[i] << ',' << list << ','
          << (i < malicious ? attack : "") << '\n';
    const auto& p = plan.rows[i];
    const auto seed = static_cast<std::uint64_t>(std::stoull(p.at(plan.column("link_seed"))));
    for (std::size_t j : f.neighbours[i]) {
      links << "[[link]]\nname = \"" << link_name(f, i, j) << "\"\nlisten = \"" << link_host[i]
            << ":0\"\nupstream = \"" << listen[j] << "\"\n";
      for (const char* column : {"delay_ms", "jitter_ms", "loss", "bandwidth_kbps"})
        links << column << " = " << p.at(plan.column(column)) << '\n';
      links << "seed = " << seed * 4099 + j << "\n\n";
    }
  }
  write_file(run / "peers.csv", peers.str());
  write_file(run / "links.toml", links.str());
}

std::vector<std::pair<std::string, std::string>> gossip_attackers(const fs::path& run) {
  const CsvTable peers = read_csv(run / "peers.csv");
  std::vector<std::pair<std::string, std::string>> found;
  const auto attack = std::find(peers.header.begin(), peers.header.end(), "attack");
  if (attack == peers.header.end()) return found;
  const auto a = static_cast<std::size_t>(attack - peers.header.begin());
  const std::size_t name = peers.column("name");
  for (const auto& row : peers.rows)  // an honest peer's empty attack ends its row: not read
    if (a < row.size() && !row[a].empty()) found.emplace_back(row.at(name), row[a]);
  return found;
}

void write_peer_topologies(const fs::path& run) {
  const Fleet f = read_fleet(run);
  const json ports = read_json(run / "logs" / "impairer.ports.json").at("links");
  fs::create_directories(run / "peers");
  for (std::size_t i = 0; i < f.names.size(); i++) {
    json topology = f.topology;
    for (std::size_t j : f.neighbours[i]) {
      const std::string name = link_name(f, i, j);
      if (!ports.contains(name)) throw std::invalid_argument("the impairer has no link " + name);
      topology["peers"][j]["address"] = ports.at(name);
    }
    write_file(run / "peers" / (f.names[i] + ".topology.json"), topology.dump(1) + "\n");
  }
}

std::string append_gossip_row(const fs::path& run, double elapsed, const fs::path& eval_path) {
  const json eval = read_json(eval_path);
  const Fleet f = read_fleet(run);
  const Attackers attackers = attackers_of(run);
  double iterations = 0, min_iteration = std::numeric_limits<double>::infinity(), max_iteration = 0;
  for (const json& p : eval.at("peers")) {
    if (p.contains("peer") && p["peer"].is_string() && attackers.count(p["peer"].get<std::string>()))
      throw std::invalid_argument(eval_path.string() + " holds attacker " +
                                  p["peer"].get<std::string>() +
                                  "'s checkpoint: evaluate the honest peers only (the consensus "
                                  "model would hold it too)");
    const double i = number_or(p, "iteration", 0);
    iterations += i, min_iteration = std::min(min_iteration, i),
                     max_iteration = std::max(max_iteration, i);
  }
  const double peers = static_cast<double>(std::max<std::size_t>(1, eval.at("peers").size()));
  double sent = 0, refused = 0, clipped = 0;
  for (unsigned i = 0; i < f.names.size(); i++) {
    const PeerTotals t = peer_totals(run, i, attackers);
    sent += static_cast<double>(t.bytes_sent);
    if (attackers.count(f.names[i])) continue;
    refused += static_cast<double>(t.attacker_refused);
    clipped += static_cast<double>(t.attacker_clipped);
  }
  const double link_bytes = links_bytes_in(run);
  const double n = static_cast<double>(f.names.size());
  const double mean_accuracy = eval.at("mean_accuracy").get<double>();
  const fs::path gossip_timeline = run / "gossip-timeline.csv", timeline = run / "timeline.csv";
  if (!fs::exists(gossip_timeline))
    write_file(gossip_timeline,
               "elapsed_s,mean_iteration,min_iteration,max_iteration,mean_accuracy,min_accuracy,"
               "max_accuracy,consensus_accuracy,bytes_sent_per_peer,link_bytes_per_peer,"
               "honest_peers,attacker_models_refused,attacker_terms_clipped\n");
  if (!fs::exists(timeline))
    write_file(timeline,
               "elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes\n");
  std::ofstream(gossip_timeline, std::ios::app)
      << fixed(elapsed, 1) << ',' << fixed(iterations / peers, 1) << ',' << fixed(min_iteration, 0)
      << ',' << fixed(max_iteration, 0) << ',' << fixed(mean_accuracy, 4) << ','
      << fixed(eval.at("min_accuracy").get<double>(), 4) << ','
      << fixed(eval.at("max_accuracy").get<double>(), 4) << ','
      << fixed(eval.at("consensus_accuracy").get<double>(), 4) << ',' << fixed(sent / n, 0) << ','
      << fixed(link_bytes / n, 0) << ',' << f.names.size() - attackers.size() << ','
      << fixed(refused, 0) << ',' << fixed(clipped, 0) << '\n';
  const std::string row = fixed(elapsed, 0) + "," + fixed(std::round(iterations / peers), 0) + "," +
                          fixed(mean_accuracy, 4) + "," + fixed(sent, 0) + "," +
                          fixed(link_bytes, 0);
  std::ofstream(timeline, std::ios::app) << row << '\n';
  return row;
}

int summarize_gossip(const GossipSummaryOptions& o) {
  const fs::path& run = o.run;
  const Fleet f = read_fleet(run);
  const CsvTable plan = read_csv(run / "plan.csv"), cpu_plan = read_csv(run / "cpu-plan.csv");
  std::map<std::size_t, std::string> cpu_class;
  for (std::size_t r = 0; r < cpu_plan.rows.size(); r++)
    if (cpu_plan.number(r, "elapsed_s") == 0)
      cpu_class[static_cast<std::size_t>(cpu_plan.number(r, "worker"))] =
          cpu_plan.rows[r].at(cpu_plan.column("class"));

  // workers.csv and the restart checks.
  std::ofstream workers(run / "workers.csv");
  workers << "peer,name,address,delay_ms,jitter_ms,loss,bandwidth_kbps,cpu_class,neighbours,"
             "iterations,steps,exchanges,"
             "neighbours_skipped,models_refused,requests_refused,bytes_sent,bytes_received,last_"
             "batch,restarts,"
             "resumed_iterations,attack,attacker_models_refused,attacker_terms_clipped,"
             "attacker_models_mixed,terms_clipped\n";
  json restarts = json::array();
  bool resumed_ok = true;
  double sent = 0, iterations = 0;
  const Attackers attackers = attackers_of(run);
  PeerTotals honest;  // the honest peers' counts of their neighbours, summed
  for (unsigned i = 0; i < f.names.size(); i++) {
    const PeerTotals t = peer_totals(run, i, attackers);
    const auto attacker = attackers.find(f.names[i]);
    if (attacker == attackers.end()) {
      honest.attacker_refused += t.attacker_refused, honest.attacker_clipped += t.attacker_clipped;
      honest.attacker_mixed += t.attacker_mixed, honest.honest_refused += t.honest_refused;
      honest.honest_clipped += t.honest_clipped;
    }
    sent += static_cast<double>(t.bytes_sent);
    iterations += static_cast<double>(t.iteration);
    std::string resumed;
    for (std::size_t k = 1; k < t.resumed_iterations.size(); k++) {
      const std::uint64_t last = t.last_iterations[k - 1],
                          every = std::max<std::uint32_t>(1, o.checkpoint_every);
      // The stats file may show an iteration whose checkpoint was still being written.
      const std::uint64_t required = last == 0 ? 0 : (last - 1) / every * every;
      const bool ok = t.resumed_iterations[k] >= required;
      resumed_ok = resumed_ok && ok;
      restarts.push_back({{"peer", i},
                          {"last_iteration_seen", last},
                          {"required", required},
                          {"resumed_iteration", t.resumed_iterations[k]},
                          {"ok", ok}});
      resumed += (resumed.empty() ? "" : ";") + std::to_string(t.resumed_iterations[k]);
    }
    workers << i << ',' << f.names[i];
    for (const char* column : {"address", "delay_ms", "jitter_ms", "loss", "bandwidth_kbps"})
      workers << ',' << (i < plan.rows.size() ? plan.rows[i].at(plan.column(column)) : "");
    workers << ',' << (cpu_class.count(i) ? cpu_class[i] : "") << ',' << f.neighbours[i].size()
            << ',' << t.iteration << ',' << t.steps << ',' << t.exchanges << ',' << t.skipped << ','
            << t.models_refused << ',' << t.requests_refused << ',' << t.bytes_sent << ','
            << t.bytes_received << ',' << t.batch << ','
            << (t.incarnations ? t.incarnations - 1 : 0) << ',' << resumed << ','
            << (attacker == attackers.end() ? "" : attacker->second) << ',' << t.attacker_refused
            << ',' << t.attacker_clipped << ',' << t.attacker_mixed << ','
            << t.attacker_clipped + t.honest_clipped << '\n';
  }
  workers.close();

  const CsvTable timeline = read_csv(run / "gossip-timeline.csv");
  const double n = static_cast<double>(f.names.size()), link_bytes = links_bytes_in(run);
  json outcome = {{"mode", "gossip"},
                  {"stop", o.stop_kind},
                  {"stopped", o.stopped},
                  {"network", o.network},
                  {"peers", f.names.size()},
                  {"peer_restarts", restarts},
                  {"checkpoints_resumed", resumed_ok},
                  {"mean_iteration", iterations / n},
                  {"bytes_sent_per_peer", sent / n},
                  {"link_bytes_per_peer", link_bytes / n}};
  outcome["target_reached"] = nullptr;
  if (const auto fields = split_fields(o.reached); fields.size() >= 3)
    outcome["target_reached"] = {{"elapsed_s", std::stod(fields[0])},
                                 {"mean_iteration", std::stod(fields[1])},
                                 {"accuracy", std::stod(fields[2])}};
  outcome["final"] = nullptr;
  if (fs::exists(run / "logs" / "final-eval.json")) {
    const json final_eval = read_json(run / "logs" / "final-eval.json");
    outcome["final"] = {{"mean_accuracy", final_eval.at("mean_accuracy")},
                        {"min_accuracy", final_eval.at("min_accuracy")},
                        {"max_accuracy", final_eval.at("max_accuracy")},
                        {"consensus_accuracy", final_eval.at("consensus_accuracy")},
                        {"test_examples", final_eval.at("test_examples")},
                        {"peers_evaluated", final_eval.value("peers", json::array()).size()}};
  }
  // Who attacked how, and what the honest peers (whose accuracies these are) took of them.
  outcome["attack"] = nullptr;
  std::string attacker_names;
  if (!attackers.empty()) {
    json names = json::array();
    for (const auto& [name, attack] : attackers) {
      names.push_back(name);
      attacker_names += (attacker_names.empty() ? "" : ", ") + name;
    }
    outcome["attack"] = {{"attackers", names},
                         {"attack", attackers.begin()->second},
                         {"honest_peers", f.names.size() - attackers.size()},
                         {"attacker_models_refused", honest.attacker_refused},
                         {"attacker_terms_clipped", honest.attacker_clipped},
                         {"attacker_models_mixed", honest.attacker_mixed},
                         {"honest_neighbours_refused", honest.honest_refused},
                         {"honest_terms_clipped", honest.honest_clipped}};
  }
  // The first evaluation at or above the target, of the mean peer and of the consensus model.
  const auto first_at = [&](const char* column) -> json {
    if (o.target < 0) return nullptr;
    for (std::size_t r = 0; r < timeline.rows.size(); r++)
      if (timeline.number(r, column) >= o.target)
        return {{"elapsed_s", timeline.number(r, "elapsed_s")},
                {"mean_iteration", timeline.number(r, "mean_iteration")},
                {"bytes_sent_per_peer", timeline.number(r, "bytes_sent_per_peer")}};
    return nullptr;
  };
  outcome["target_accuracy"] = o.target < 0 ? json(nullptr) : json(o.target);
  outcome["mean_peer_at_target"] = first_at("mean_accuracy");
  outcome["consensus_at_target"] = first_at("consensus_accuracy");
  write_file(run / "outcome.json", outcome.dump(2) + "\n");

  // Plots: accuracy against time (mean, least and greatest peer, consensus) and against the
  // bytes a peer sent.
  plot::PlotSeries mean{"mean peer", {}, {}}, least{"least peer", {}, {}},
      greatest{"best peer", {}, {}}, consensus{"consensus model", {}, {}},
      by_bytes{"mean peer", {}, {}}, consensus_by_bytes{"consensus model", {}, {}};
  for (std::size_t r = 0; r < timeline.rows.size(); r++) {
    const double t = timeline.number(r, "elapsed_s"),
                 bytes = timeline.number(r, "bytes_sent_per_peer");
    for (auto [series, column] :
         {std::pair{&mean, "mean_accuracy"}, std::pair{&least, "min_accuracy"},
          std::pair{&greatest, "max_accuracy"}, std::pair{&consensus, "consensus_accuracy"}}) {
      series->x.push_back(t);
      series->y.push_back(timeline.number(r, column));
    }
    if (bytes > 0) {
      by_bytes.x.push_back(bytes), by_bytes.y.push_back(timeline.number(r, "mean_accuracy"));
      consensus_by_bytes.x.push_back(bytes),
          consensus_by_bytes.y.push_back(timeline.number(r, "consensus_accuracy"));
    }
  }
  plot::PlotOptions options;
  options.y_label = "test accuracy";
  options.reference_y = o.target;
  options.title = "edgetrain-emulate, gossip: test accuracy of the peers against time";
  options.x_label = "seconds since the peers started";
  std::ofstream(run / "accuracy-vs-time.svg")
      << plot::render_svg_line_chart({mean, least, greatest, consensus}, options);
  options.title = "edgetrain-emulate, gossip: test accuracy against the model bytes a peer sent";
  options.x_label = "model bytes sent per peer (its answers and AD-PSGD posts)";
  options.log_x = true;
  std::ofstream(run / "accuracy-vs-bytes.svg")
      << plot::render_svg_line_chart({by_bytes, consensus_by_bytes}, options);

  std::string label = read_text(run / "run.label");
  if (!label.empty() && label.back() == '\n') label.pop_back();
  std::ostringstream md;
  md << "# " << label << "\n\n"
     << read_text(run / "settings.md") << "- stopped: " << o.stopped << "\n";
  if (!outcome["final"].is_null()) {
    const json& fin = outcome["final"];
    md << "- at the end, on " << fin["test_examples"].get<std::uint64_t>() << " test images: mean "
       << (attackers.empty() ? "" : "honest ") << "peer "
       << percent(fin["mean_accuracy"].get<double>()) << " ("
       << percent(fin["min_accuracy"].get<double>()) << "-"
       << percent(fin["max_accuracy"].get<double>()) << "), consensus model "
       << percent(fin["consensus_accuracy"].get<double>()) << "\n";
  }
  md << "- iterations per peer (mean): " << fixed(iterations / n, 0)
     << "; model bytes sent per peer: " << bytes_text(sent / n)
     << "; UDP bytes per peer on its links (both ways): " << bytes_text(link_bytes / n)
     << "\n- peer restarts: " << restarts.size()
     << (resumed_ok ? ", each resumed from its last checkpoint\n"
                    : ", A PEER DID NOT RESUME FROM ITS LAST CHECKPOINT\n");
  if (!attackers.empty()) {
    const json& a = outcome["attack"];
    md << "- attackers: " << attacker_names << " (edgetrain-gossip-attacker --attack "
       << a["attack"].get<std::string>() << "); the accuracies are the "
       << a["honest_peers"].get<std::size_t>()
       << " honest peers', which refused the attackers' models "
       << a["attacker_models_refused"].get<std::uint64_t>() << " times, clipped their differences "
       << a["attacker_terms_clipped"].get<std::uint64_t>() << " times and mixed them in "
       << a["attacker_models_mixed"].get<std::uint64_t>() << " times (honest neighbours: "
       << a["honest_neighbours_refused"].get<std::uint64_t>() << " refused, "
       << a["honest_terms_clipped"].get<std::uint64_t>() << " clipped)\n";
  }
  if (o.target >= 0) {
    for (auto [what, key] : {std::pair{"mean peer", "mean_peer_at_target"},
                             std::pair{"consensus model", "consensus_at_target"}}) {
      md << "- " << what << " at " << percent(o.target) << ": ";
      if (outcome[key].is_null())
        md << "not reached\n";
      else
        md << fixed(outcome[key]["elapsed_s"].get<double>(), 0) << " s, iteration "
           << fixed(outcome[key]["mean_iteration"].get<double>(), 0) << ", "
           << bytes_text(outcome[key]["bytes_sent_per_peer"].get<double>()) << " sent per peer\n";
    }
  }
  md << "\n![accuracy against time](accuracy-vs-time.svg)\n![accuracy against "
        "bytes](accuracy-vs-bytes.svg)\n";
  write_file(run / "summary.md", md.str());
  for (const json& r : restarts)
    if (!r["ok"].get<bool>())
      std::printf(
          "CHECKPOINT NOT RESUMED: peer %llu resumed at iteration %llu, its checkpoint of "
          "iteration %llu was due\n",
          static_cast<unsigned long long>(r["peer"].get<std::uint64_t>()),
          static_cast<unsigned long long>(r["resumed_iteration"].get<std::uint64_t>()),
          static_cast<unsigned long long>(r["required"].get<std::uint64_t>()));
  return resumed_ok ? 0 : 3;
}

}  // namespace edgetrain::emulation

namespace edgetrain::emulation {

namespace {

// One run as compare_gossip_runs sees it.
struct DeviceRun {
  std::string label;
  bool gossip = false;
  std::vector<double> seconds, accuracy, consensus, bytes_per_device;
  double final_accuracy = 0, final_min = 0, final_max = 0, final_consensus = -1,
         bytes_whole_run = 0, iterations = 0;
  double steps =
      0;  // local steps per device (a gossip peer's exceed its iterations with --wait-steps)
};

DeviceRun read_device_run(const fs::path& run) {
  DeviceRun r;
  r.label = read_text(run / "run.label");
  if (!r.label.empty() && r.label.back() == '\n') r.label.pop_back();
  const json outcome = read_json(run / "outcome.json");
  r.gossip = outcome.value("mode", "") == "gossip";
  if (r.gossip) {
    const CsvTable t = read_csv(run / "gossip-timeline.csv");
    for (std::size_t i = 0; i < t.rows.size(); i++) {
      r.seconds.push_back(t.number(i, "elapsed_s"));
      r.accuracy.push_back(t.number(i, "mean_accuracy"));
      r.consensus.push_back(t.number(i, "consensus_accuracy"));
      r.bytes_per_device.push_back(t.number(i, "bytes_sent_per_peer"));
    }
    if (outcome.contains("final") && outcome["final"].is_object()) {
      r.final_accuracy = outcome["final"]["mean_accuracy"].get<double>();
      r.final_min = outcome["final"]["min_accuracy"].get<double>();
      r.final_max = outcome["final"]["max_accuracy"].get<double>();
      r.final_consensus = outcome["final"]["consensus_accuracy"].get<double>();
    }
    r.bytes_whole_run = outcome.value("bytes_sent_per_peer", 0.0);
    r.iterations = r.steps = outcome.value("mean_iteration", 0.0);
    if (fs::exists(run / "workers.csv")) {
      const CsvTable workers = read_csv(run / "workers.csv");
      const auto attack = std::find(workers.header.begin(), workers.header.end(), "attack");
      const auto a = static_cast<std::size_t>(attack - workers.header.begin());
      double steps = 0, honest = 0;  // the honest peers' (an attacker's row names its attack)
      for (std::size_t i = 0; i < workers.rows.size(); i++) {
        if (attack != workers.header.end() && a < workers.rows[i].size() &&
            !workers.rows[i][a].empty())
          continue;
        steps += workers.number(i, "steps"), honest++;
      }
      if (honest > 0) r.steps = steps / honest;
    }
  } else {
    const CsvTable t = read_csv(run / "timeline.csv"), workers = read_csv(run / "workers.csv");
    const double n = static_cast<double>(std::max<std::size_t>(1, workers.rows.size()));
    for (std::size_t i = 0; i < t.rows.size(); i++) {
      r.seconds.push_back(t.number(i, "elapsed_s"));
      r.accuracy.push_back(t.number(i, "test_accuracy"));
      r.bytes_per_device.push_back(t.number(i, "ingress_payload_bytes") / n);
    }
    if (!t.rows.empty()) r.final_accuracy = r.final_min = r.final_max = r.accuracy.back();
    double steps = 0;
    for (std::size_t i = 0; i < workers.rows.size(); i++) {
      r.bytes_whole_run += workers.number(i, "payload_bytes_sent") / n;
      steps += workers.number(i, "steps") / n;
    }
    r.iterations = r.steps = steps;
  }
  return r;
}

// The index of the first row at or above TARGET in VALUES, or -1.
long first_at(const std::vector<double>& values, double target) {
  for (std::size_t i = 0; i < values.size(); i++)
    if (values[i] >= target) return static_cast<long>(i);
  return -1;
}

}  // namespace

std::string compare_gossip_runs(const std::vector<fs::path>& directories, const fs::path& out,
                                double target) {
  std::vector<DeviceRun> runs;
  for (const fs::path& d : directories) runs.push_back(read_device_run(d));
  if (runs.empty()) throw std::invalid_argument("gossip-compare needs run directories");
  fs::create_directories(out);
  const long reference_row = first_at(runs.front().accuracy, target);
  std::ostringstream table;
  const std::string t = percent(target);
  table << "| run | final accuracy | peers min-max | consensus | time to " << t
        << " | speed-up | consensus time to " << t << " | bytes sent per device to " << t
        << " | bytes sent per device | iterations (steps) per device |\n"
        << "|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<plot::PlotSeries> by_time, by_bytes;
  for (const DeviceRun& r : runs) {
    const long row = first_at(r.accuracy, target), consensus_row = first_at(r.consensus, target);
    std::string speedup = "—";
    if (row >= 0 && reference_row >= 0 && r.seconds[row] > 0)
      speedup = fixed(runs.front().seconds[reference_row] / r.seconds[row], 2) + "x";
    table << "| " << r.label << " | " << percent(r.final_accuracy) << " | "
          << (r.gossip ? percent(r.final_min) + "-" + percent(r.final_max) : "(server model)")
          << " | " << (r.final_consensus >= 0 ? percent(r.final_consensus) : "—") << " | "
          << (row >= 0 ? fixed(r.seconds[row], 0) + " s" : "not reached") << " | " << speedup
          << " | "
          << (!r.gossip            ? "—"
              : consensus_row >= 0 ? fixed(r.seconds[consensus_row], 0) + " s"
                                   : "not reached")
          << " | " << (row >= 0 ? bytes_text(r.bytes_per_device[row]) : "—") << " | "
          << bytes_text(r.bytes_whole_run) << " | " << fixed(r.iterations, 0)
          << (r.steps > r.iterations * 1.01 ? " (" + fixed(r.steps, 0) + ")" : std::string())
          << " |\n";
    std::string legend = r.label.size() > 34 ? r.label.substr(0, 34) : r.label;
    plot::PlotSeries time{legend, r.seconds, r.accuracy}, bytes{legend, {}, {}};
    for (std::size_t i = 0; i < r.seconds.size(); i++)
      if (r.bytes_per_device[i] > 0)
        bytes.x.push_back(r.bytes_per_device[i]), bytes.y.push_back(r.accuracy[i]);
    by_time.push_back(std::move(time));
    by_bytes.push_back(std::move(bytes));
  }
  plot::PlotOptions options;
  options.y_label = "test accuracy (gossip: mean peer; server: its model)";
  options.reference_y = target;
  options.title = "edgetrain-emulate: gossip and server runs, accuracy against time";
  options.x_label = "seconds since the start";
  std::ofstream(out / "accuracy-vs-time.svg") << plot::render_svg_line_chart(by_time, options);
  options.title =
      "edgetrain-emulate: gossip and server runs, accuracy against model bytes sent per device";
  options.x_label = "model bytes sent per device (peer: answers and posts; worker: update payload)";
  options.log_x = true;
  std::ofstream(out / "accuracy-vs-bytes.svg") << plot::render_svg_line_chart(by_bytes, options);
  write_file(out / "summary.md", table.str());
  return table.str();
}

}  // namespace edgetrain::emulation
