#include "emulation/run_summary.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <stdexcept>

#include "emulation/gossip_report.h"
#include "emulation/run_comparison.h"

namespace edgetrain::emulation {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string integer_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f", value);
  return text;
}

// The sum of COLUMNS over every row of TABLE (0 for a missing file).
// The columns a table has of `columns`, summed (links.csv of runs before a column came).
double column_sum_if_present(const CsvTable& table, std::initializer_list<const char*> columns) {
  double sum = 0;
  for (const char* c : columns)
    if (std::find(table.header.begin(), table.header.end(), c) != table.header.end())
      for (std::size_t r = 0; r < table.rows.size(); r++) sum += table.number(r, c);
  return sum;
}

double column_sum(const CsvTable& table, std::initializer_list<const char*> columns) {
  double sum = 0;
  for (std::size_t r = 0; r < table.rows.size(); r++)
    for (const char* c : columns) sum += table.number(r, c);
  return sum;
}

}  // namespace

void declare_summarize_settings(settings::Table& t, SummarizeOptions& s) {
  t.add("stop-kind", s.stop_kind, "why the run stopped (required)")
      .choices({"target", "time", "workers-gone"})
      .required();
  t.add("stopped", s.stopped, "the stop, in words (required)").required();
  t.add("network", s.network, "loopback or netns (required)").required();
  t.add("reached", s.reached,
        "the timeline.csv row that met the target (elapsed_s,version,test_accuracy,...)");
  t.add("target-accuracy", s.target, "target accuracy of the table (-1: compare's default)");
  t.add("mode", s.mode, "the run's mode (gossip: peers, no server)")
      .choices({"async", "rounds", "gossip"});
  t.add("checkpoint-every", s.checkpoint_every,
        "gossip: the peers' --checkpoint-every (restart check)");
}

std::vector<WorkerTotals> write_workers_csv(const fs::path& run, const CsvTable& plan) {
  std::vector<WorkerTotals> totals;
  std::ofstream out(run / "workers.csv");
  out << "worker,address,delay_ms,jitter_ms,loss,bandwidth_kbps,slowdown,steps,updates_accepted,"
         "refused_stale,"
         "payload_bytes_sent,retries,restarts,offline_s,offline_steps,offline_updates_accepted,"
         "offline_updates_refused,offline_steps_refused,buffered_steps\n";
  for (std::size_t i = 0; i < plan.rows.size(); i++) {
    const auto& p = plan.rows[i];
    const WorkerTotals t = worker_totals(run, static_cast<unsigned>(i));
    out << i;
    for (const char* column :
         {"address", "delay_ms", "jitter_ms", "loss", "bandwidth_kbps", "slowdown"}) {
      out << ',' << p.at(plan.column(column));
    }
    out << ',' << t.steps << ',' << t.accepted << ',' << t.refused << ',' << t.bytes_sent << ','
        << t.retries << ',' << (t.incarnations ? t.incarnations - 1 : 0) << ','
        << integer_text(t.offline_seconds) << ',' << t.offline_steps << ','
        << t.offline_updates_accepted << ',' << t.offline_updates_refused << ','
        << t.offline_steps_refused << ',' << t.buffered_steps << '\n';
    totals.push_back(t);
  }
  return totals;
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
                                 "to_worker_dropped_loss", "to_worker_dropped_queue_full"}) +
              column_sum_if_present(links, {"to_server_dropped_down", "to_worker_dropped_down"}))
       << "\n";
  // Intermittent links (issue 38 part 1): the impairer's down time and what the workers did
  // with it.
  const double down_seconds = column_sum_if_present(links, {"down_s"});
  WorkerTotals offline;
  for (const WorkerTotals& t : totals) {
    offline.offline_seconds += t.offline_seconds;
    offline.offline_steps += t.offline_steps;
    offline.offline_updates_accepted += t.offline_updates_accepted;
    offline.offline_updates_refused += t.offline_updates_refused;
    offline.offline_steps_refused += t.offline_steps_refused;
    offline.buffered_steps += t.buffered_steps;
  }
  if (down_seconds > 0 || offline.offline_seconds > 0)
    text << "- offline: links down " << integer_text(down_seconds)
         << " s in all (links.csv down_s; datagrams dropped while down "
         << integer_text(
                column_sum_if_present(links, {"to_server_dropped_down", "to_worker_dropped_down"}))
         << "), workers offline " << integer_text(offline.offline_seconds) << " s, "
         << offline.offline_steps << " offline steps, offline updates accepted "
         << offline.offline_updates_accepted << " / refused " << offline.offline_updates_refused
         << " (" << offline.offline_steps_refused << " steps), " << offline.buffered_steps
         << " steps buffered at the end\n";
  return text.str();
}

int summarize(const SummarizeOptions& o) {
  if (o.mode == "gossip") {
    return summarize_gossip(
        {o.run, o.stop_kind, o.stopped, o.network, o.reached, o.target, o.checkpoint_every});
  }
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

}  // namespace edgetrain::emulation
