#include "sim/sim_reports.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/svg_plot.h"

namespace edgetrain::sim {

namespace {

void write_chart(const std::string& path, const std::vector<plot::PlotSeries>& series,
                 const plot::PlotOptions& options) {
  std::ofstream(path) << plot::render_svg_line_chart(series, options);
}

std::string optional_time(const GossipEvalPoint* point) {
  return point ? time_text(point->time) : "never";
}

}  // namespace

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 4) bytes /= 1000, unit++;
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, unit ? "%.2f %s" : "%.0f %s", bytes, units[unit]);
  return buffer;
}

std::string time_text(std::optional<double> time) {
  if (!time) return "never";
  char text[32];
  std::snprintf(text, sizeof text, "%.0f", *time);
  return text;
}

std::string runs_summary_json(const std::vector<SimResult>& results, double target_accuracy) {
  nlohmann::json runs = nlohmann::json::array();
  for (const SimResult& r : results)
    runs.push_back({{"label", r.label},
                    {"final_accuracy", r.final_accuracy()},
                    {"best_accuracy", r.best_accuracy()},
                    {"updates_applied", r.updates_applied},
                    {"updates_refused", r.updates_refused},
                    {"updates_lost", r.updates_lost},
                    {"ingress_bytes", r.ingress_bytes},
                    {"virtual_time", r.virtual_time},
                    {"round_stragglers", r.round_stragglers},
                    {"round_deltas_refused", r.round_deltas_refused},
                    {"round_deltas_clipped", r.round_deltas_clipped},
                    {"stalled", r.stalled},
                    {"dp_epsilon_by_round", r.dp_epsilon_by_round},
                    {"clip_norm_by_round", r.clip_norm_by_round},
                    {"privacy_exhausted", r.privacy_exhausted},
                    {"local_dp_epsilon", r.local_dp_epsilon},
                    {"offline_steps", r.offline_steps},
                    {"offline_updates_applied", r.offline_updates_applied},
                    {"offline_updates_refused", r.offline_updates_refused},
                    {"kept_updates", r.kept_updates},
                    {"time_to_target", r.time_to(target_accuracy) ? nlohmann::json(*r.time_to(target_accuracy)) : nlohmann::json()}});
  return nlohmann::json{{"target_accuracy", target_accuracy}, {"runs", runs}}.dump(2) + "\n";
}

namespace {
// The devices' traffic in both directions to the target (upload + download), first run over
// second: what a device owner on a metered link pays (issue 38).
std::string both_directions_line(const std::vector<SimResult>& results, double target_accuracy) {
  const auto a = results[0].traffic_bytes_to(target_accuracy),
             b = results[1].traffic_bytes_to(target_accuracy);
  if (!a || !b || *b == 0) return {};
  char line[200];
  std::snprintf(line, sizeof line,
                "both directions (upload + download) to %.1f%%: %.1fx (%s vs %s)\n",
                target_accuracy * 100, static_cast<double>(*a) / static_cast<double>(*b),
                human_bytes(static_cast<double>(*a)).c_str(),
                human_bytes(static_cast<double>(*b)).c_str());
  return line;
}
}  // namespace

std::string rounds_summary_table(const std::vector<SimResult>& results, double target_accuracy) {
  std::ostringstream summary;
  summary << "| method | final acc | best acc | rounds | virtual time | ingress | download | "
             "bytes/delta | deltas/round | "
             "stragglers | lost | left | empty rounds | rounds to target | time to target | "
             "ingress to target | up + down to target | "
             "bytes/pull |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    auto to_bytes = r.ingress_bytes_to(target_accuracy);
    auto to_traffic = r.traffic_bytes_to(target_accuracy);
    auto to_rounds = r.updates_to(target_accuracy);
    char row[600];
    std::snprintf(row, sizeof row,
                  "| %s | %.2f%% | %.2f%% | %llu | %.0f | %s | %s | %s | %.1f | %llu | %llu | %llu | "
                  "%llu | %s | %s | %s | %s | %s |\n",
                  r.label.c_str(), r.final_accuracy() * 100, r.best_accuracy() * 100,
                  static_cast<unsigned long long>(r.updates_applied), r.virtual_time,
                  human_bytes(r.ingress_bytes).c_str(), human_bytes(r.pull_bytes).c_str(),
                  human_bytes(r.mean_update_bytes).c_str(),
                  r.mean_round_deltas, static_cast<unsigned long long>(r.round_stragglers),
                  static_cast<unsigned long long>(r.updates_lost),
                  static_cast<unsigned long long>(r.workers_left),
                  static_cast<unsigned long long>(r.empty_rounds),
                  to_rounds ? std::to_string(*to_rounds).c_str() : "never",
                  time_text(r.time_to(target_accuracy)).c_str(),
                  to_bytes ? human_bytes(static_cast<double>(*to_bytes)).c_str() : "never",
                  to_traffic ? human_bytes(static_cast<double>(*to_traffic)).c_str() : "never",
                  human_bytes(r.mean_pull_bytes).c_str());
    summary << row;
  }
  for (const auto& r : results) {
    if (r.stalled)
      summary << "\n"
              << r.label << ": stopped after " << r.updates_applied << " rounds: " << kStallRounds
              << " rounds in a row left the model unchanged (every delta lost, or the server "
                 "refused the close: a "
                 "diverged model beyond the parameter bound)\n";
  }
  for (const auto& r : results)
    if (r.round_deltas_refused > 0 || r.round_deltas_clipped > 0)
      summary << "\n" << r.label << ": the server refused " << r.round_deltas_refused
              << " deltas (a value past the parameter bound) and clipped "
              << r.round_deltas_clipped << "\n";
  for (const auto& r : results)
    if (!r.dp_epsilon_by_round.empty())
      summary << "\n" << r.label << ": client-level differential privacy, epsilon "
              << r.dp_epsilon_by_round.back() << " after " << r.dp_epsilon_by_round.size()
              << " rounds"
              << (r.privacy_exhausted ? " (stopped: the next round would pass --dp-target-epsilon)"
                                      : "")
              << (r.clip_norm_by_round.empty()
                      ? ""
                      : ", adaptive clip norm " + std::to_string(r.clip_norm_by_round.front()) +
                            " -> " + std::to_string(r.clip_norm_by_round.back()))
              << "\n";
  summary << "\nrounds: `updates` in sim.csv; time in mean step times (virtual); ingress counts "
             "stragglers' deltas "
             "too, which the server receives but leaves out of the aggregate\n";
  summary << "target accuracy: " << target_accuracy * 100 << "%\n";
  if (results.size() != 2) return summary.str();
  auto a = results[0].ingress_bytes_to(target_accuracy),
       b = results[1].ingress_bytes_to(target_accuracy);
  if (!a || !b || *b == 0)
    return summary.str() + "traffic ratio: not available (a run never reached the target)\n";
  char line[240];
  std::snprintf(line, sizeof line,
                "traffic ratio dense / AdaComp deltas to %.1f%%: %.1fx (%s vs %s); per delta: "
                "%.1fx; accuracy gap "
                "(best): %+.2f points\n",
                target_accuracy * 100, static_cast<double>(*a) / static_cast<double>(*b),
                human_bytes(static_cast<double>(*a)).c_str(),
                human_bytes(static_cast<double>(*b)).c_str(),
                results[0].mean_update_bytes / results[1].mean_update_bytes,
                (results[1].best_accuracy() - results[0].best_accuracy()) * 100);
  return summary.str() + line + both_directions_line(results, target_accuracy);
}

std::string async_summary_table(const std::vector<SimResult>& results, double target_accuracy) {
  std::ostringstream summary;
  summary << "| method | final acc | best acc | updates | ingress | download | bytes/update | "
             "mean delay | refused | lost | left | "
             "updates to target | ingress to target | up + down to target | bytes/pull "
             "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    auto to_bytes = r.ingress_bytes_to(target_accuracy);
    auto to_traffic = r.traffic_bytes_to(target_accuracy);
    auto to_updates = r.updates_to(target_accuracy);
    char row[500];
    std::snprintf(
        row, sizeof row,
        "| %s | %.2f%% | %.2f%% | %llu | %s | %s | %s | %.1f | %llu | %llu | %llu | %s | %s | %s | "
        "%s |\n",
        r.label.c_str(), r.final_accuracy() * 100, r.best_accuracy() * 100,
        static_cast<unsigned long long>(r.updates_applied), human_bytes(r.ingress_bytes).c_str(),
        human_bytes(r.pull_bytes).c_str(), human_bytes(r.mean_update_bytes).c_str(), r.mean_delay,
        static_cast<unsigned long long>(r.updates_refused),
        static_cast<unsigned long long>(r.updates_lost),
        static_cast<unsigned long long>(r.workers_left),
        to_updates ? std::to_string(*to_updates).c_str() : "never",
        to_bytes ? human_bytes(static_cast<double>(*to_bytes)).c_str() : "never",
        to_traffic ? human_bytes(static_cast<double>(*to_traffic)).c_str() : "never",
        human_bytes(r.mean_pull_bytes).c_str());
    summary << row;
  }
  for (const auto& r : results) {
    if (r.stalled)
      summary << "\n"
              << r.label << ": stopped after " << r.updates_applied
              << " applied updates: the server refused every update for a long while (a diverged "
                 "model at the "
                 "parameter bound, or every worker beyond the staleness bound)\n";
  }
  summary << "\ntarget accuracy: " << target_accuracy * 100 << "%\n";
  if (results.size() != 2) return summary.str();
  auto a = results[0].ingress_bytes_to(target_accuracy),
       b = results[1].ingress_bytes_to(target_accuracy);
  if (!a || !b || *b == 0)
    return summary.str() + "traffic ratio: not available (a run never reached the target)\n";
  char line[200];
  std::snprintf(
      line, sizeof line,
      "traffic ratio ASGD / AdaComp to %.1f%%: %.1fx (%s vs %s); per update: %.1fx; accuracy gap "
      "(best): %+.2f points\n",
      target_accuracy * 100, static_cast<double>(*a) / static_cast<double>(*b),
      human_bytes(static_cast<double>(*a)).c_str(), human_bytes(static_cast<double>(*b)).c_str(),
      results[0].mean_update_bytes / results[1].mean_update_bytes,
      (results[1].best_accuracy() - results[0].best_accuracy()) * 100);
  return summary.str() + line + both_directions_line(results, target_accuracy);
}

std::string gossip_summary_table(const GossipResult& r, double target_accuracy) {
  std::ostringstream out;
  const GossipEvalPoint& last = r.curve.back();
  const GossipEvalPoint* reached = r.first_reaching(target_accuracy);
  char row[700];
  out << "| run | topology | mean acc | peers min-max | consensus acc | mean iterations | virtual "
         "time | local steps | "
         "skipped steps | bytes/peer | time to target | bytes/peer to target | consensus time to "
         "target | wall s |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::snprintf(row, sizeof row,
                "| %s | %s | %.2f%% | %.2f-%.2f%% | %.2f%% | %.0f | %.0f | %llu | %llu | %s | %s | "
                "%s | %s | %.0f |\n",
                r.label.c_str(), r.topology.c_str(), last.mean_accuracy * 100,
                last.min_accuracy * 100, last.max_accuracy * 100, last.consensus_accuracy * 100,
                r.mean_iterations, r.virtual_time, static_cast<unsigned long long>(r.local_steps),
                static_cast<unsigned long long>(r.skipped_steps),
                human_bytes(r.bytes_per_peer).c_str(), optional_time(reached).c_str(),
                reached ? human_bytes(reached->bytes_per_peer).c_str() : "never",
                optional_time(r.consensus_first_reaching(target_accuracy)).c_str(), r.wall_seconds);
  out << row;
  out << "\n| speed class (budget) | peers | compute per step | steps per iteration | waiting per "
         "iteration | mean batch |\n"
         "|---|---|---|---|---|---|\n";
  for (const auto& c : r.classes) {
    std::snprintf(row, sizeof row, "| %g | %d | %.2f | %.2f | %.2f | %.1f |\n", c.budget, c.peers,
                  c.compute_per_step, c.steps_per_iteration, c.wait_per_iteration, c.mean_batch);
    out << row;
  }
  out << "\ntarget accuracy (mean peer): " << target_accuracy * 100
      << "%; time in mean step times of the fastest "
      << "class (virtual); bytes: sent per peer, mean over the peers\n";
  out << "consensus distance at the end (mean |x_i - mean| / |mean|): " << r.consensus_distance
      << "\n";
  out << "largest |value| of an honest peer's model at the end: " << r.honest_max_abs_parameter
      << "\n";
  if (r.malicious_peers > 0 || r.neighbour_models_refused > 0 || r.neighbour_terms_clipped > 0)
    out << "malicious peers: " << r.malicious_peers
        << " (accuracy and consensus over the honest peers); neighbour models refused by honest "
           "peers: "
        << r.neighbour_models_refused
        << "; neighbour differences clipped: " << r.neighbour_terms_clipped << "\n";
  if (r.validations > 0)
    out << "accuracy-aware: " << r.validations << " validations, " << r.lr_decays
        << " lr halvings, " << r.peers_stopped << " peers stopped, " << r.skipped_steps
        << " iterations without a local step\n";
  return out.str();
}

std::vector<std::string> sim_plot_files(bool rounds) {
  return {"accuracy-vs-ingress.svg", rounds ? "accuracy-vs-rounds.svg" : "accuracy-vs-updates.svg",
          "accuracy-vs-time.svg"};
}

void write_sim_curves(const std::string& out_dir, const PlotContext& context, bool rounds,
                      const std::vector<SimResult>& results, double target_accuracy) {
  std::ofstream csv(out_dir + "/sim.csv");
  csv << "method,updates,virtual_time,ingress_bytes,pull_bytes,test_accuracy,test_loss\n";
  std::vector<plot::PlotSeries> by_bytes, by_updates, by_time;
  for (const auto& r : results) {
    plot::PlotSeries b{r.label, {}, {}}, u{r.label, {}, {}}, t{r.label, {}, {}};
    for (const auto& p : r.curve) {
      csv << '"' << r.label << "\"," << p.updates << ',' << p.time << ',' << p.ingress_bytes << ','
          << p.pull_bytes << ',' << p.accuracy << ',' << p.loss << '\n';
      b.x.push_back(static_cast<double>(p.ingress_bytes));
      b.y.push_back(p.accuracy);
      u.x.push_back(static_cast<double>(p.updates));
      u.y.push_back(p.accuracy);
      t.x.push_back(p.time);
      t.y.push_back(p.accuracy);
    }
    by_bytes.push_back(b);
    by_updates.push_back(u);
    by_time.push_back(t);
  }
  const std::vector<std::string> files = sim_plot_files(rounds);
  plot::PlotOptions plot;
  plot.title = std::string(rounds ? "Federated rounds: test" : "Test") +
               " accuracy against server ingress (" + context.data + ", " + context.model + ", " +
               std::to_string(context.workers) + " workers)";
  plot.x_label = "bytes ingested by the server";
  plot.y_label = "test accuracy";
  plot.log_x = true;
  plot.reference_y = target_accuracy;
  write_chart(out_dir + "/" + files[0], by_bytes, plot);
  plot.title =
      rounds ? "Test accuracy against rounds closed" : "Test accuracy against applied updates";
  plot.x_label = rounds ? "rounds closed" : "updates applied";
  plot.log_x = false;
  write_chart(out_dir + "/" + files[1], by_updates, plot);
  // The clock is virtual: a mean step time of a worker is its unit, so slow workers and
  // stragglers show here and not in the other two plots.
  plot.title = "Test accuracy against virtual time";
  plot.x_label = "virtual time (mean step times)";
  write_chart(out_dir + "/" + files[2], by_time, plot);
}

void write_gossip_curves(const std::string& out_dir, const PlotContext& context,
                         const GossipResult& r, double target_accuracy) {
  std::ofstream csv(out_dir + "/sim.csv");
  csv << "method,virtual_time,mean_iterations,bytes_per_peer,mean_accuracy,min_accuracy,max_"
         "accuracy,"
         "consensus_accuracy,mean_loss,consensus_loss,local_steps\n";
  plot::PlotSeries mean{"mean peer", {}, {}}, lowest{"least accurate peer", {}, {}},
      consensus{"consensus (average model)", {}, {}};
  plot::PlotSeries mean_by_bytes = mean, consensus_by_bytes = consensus;
  for (const auto& p : r.curve) {
    csv << '"' << r.label << "\"," << p.time << ',' << p.mean_iterations << ',' << p.bytes_per_peer
        << ',' << p.mean_accuracy << ',' << p.min_accuracy << ',' << p.max_accuracy << ','
        << p.consensus_accuracy << ',' << p.mean_loss << ',' << p.consensus_loss << ','
        << p.local_steps << '\n';
    for (auto* series : {&mean, &lowest, &consensus}) series->x.push_back(p.time);
    mean.y.push_back(p.mean_accuracy);
    lowest.y.push_back(p.min_accuracy);
    consensus.y.push_back(p.consensus_accuracy);
    if (p.bytes_per_peer > 0) {  // log axis: the start (no bytes yet) has no place on it
      mean_by_bytes.x.push_back(p.bytes_per_peer);
      mean_by_bytes.y.push_back(p.mean_accuracy);
      consensus_by_bytes.x.push_back(p.bytes_per_peer);
      consensus_by_bytes.y.push_back(p.consensus_accuracy);
    }
  }
  plot::PlotOptions plot;
  plot.title = "Gossip (" + r.label + "): test accuracy against virtual time (" + context.data +
               ", " + context.model + ")";
  plot.x_label = "virtual time (mean step times of the fastest class)";
  plot.y_label = "test accuracy";
  plot.reference_y = target_accuracy;
  write_chart(out_dir + "/accuracy-vs-time.svg", {mean, lowest, consensus}, plot);
  plot.title = "Gossip (" + r.label + "): test accuracy against bytes sent per peer";
  plot.x_label = "bytes sent per peer (mean)";
  plot.log_x = true;
  write_chart(out_dir + "/accuracy-vs-bytes.svg", {mean_by_bytes, consensus_by_bytes}, plot);
}

}  // namespace edgetrain::sim
