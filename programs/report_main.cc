// edgetrain-emulation-report: the numbers of edgetrain-emulate, which is a bash launcher and
// so does no arithmetic and reads no program output itself. Subcommands: `settings` (the
// emulator's settings as shell assignments), `plan` and `cpu-plan` (a run's seeded draws and
// CPU quotas, as CSV), `acknowledged`, `shard-row` and the gossip ones (during a run),
// `summarize` (a finished run), `compare` (also the default: `edgetrain-emulation-report
// RUN_DIR... --out DIR`) and `gossip-compare` (runs side by side), `plot` (a CSV's chart).
// What it computes is the library edgetrain::emulation_report (emulation/README.md); this
// file is its command line (common/settings.h).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/settings.h"
#include "common/svg_plot.h"
#include "emulation/cpu_plan.h"
#include "emulation/csv_plot.h"
#include "emulation/emulator_settings.h"
#include "emulation/gossip_report.h"
#include "emulation/plan_draws.h"
#include "emulation/run_checks.h"
#include "emulation/run_comparison.h"
#include "emulation/run_summary.h"
#include "emulation/shard_report.h"

namespace {

using namespace edgetrain;
using namespace edgetrain::emulation;
namespace fs = std::filesystem;

constexpr const char* kProgram = "edgetrain-emulation-report";

// Every subcommand's settings: a field per flag or positional argument.
struct Options {
  PlanOptions plan;
  SummarizeOptions summary;
  std::uint32_t cpu_workers = 1;
  std::uint64_t cpu_period = 100000;
  std::string cpu_classes, cpu_schedule, run, eval, out, csv, svg;
  std::uint32_t shard = 0;  // acknowledged --shard, when given
  double elapsed = 0, target = -1, gossip_target = 0.97;
  GossipWiringOptions wiring;
  std::vector<std::string> runs;  // compare (and the default), gossip-compare
  plot::PlotOptions chart;
};

// A path a command reads that is not there: bad usage (exit status 2), as a bad flag is.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

void require(const char* what, const std::string& path, bool directory = true) {
  if (directory ? fs::is_directory(path) : fs::is_regular_file(path)) return;
  throw UsageError(std::string(what) + ": " + (directory ? "directory" : "file") +
                   " does not exist: " + path);
}

// The subcommands: each one's table and what it does once its flags are checked.
struct Commands {
  struct Command {
    const char* name;
    settings::Table* table;
    std::function<int(const settings::Table&)> run;
  };
  settings::Table& main;
  std::vector<Command> list;
  settings::Table& add(const char* name, const char* description,
                       std::function<int(const settings::Table&)> run) {
    list.push_back({name, &main.subcommand(name, description), std::move(run)});
    return *list.back().table;
  }
  // One that reads and writes RUN_DIR, its positional argument (checked before `run`).
  settings::Table& add_run(const char* name, const char* description, std::string& run_dir,
                           std::function<int(const settings::Table&)> run) {
    settings::Table& t = add(name, description, [&run_dir, run](const settings::Table& t) {
      require("run", run_dir);
      return run(t);
    });
    t.positional("run", run_dir, "run directory");
    return t;
  }
};

// After parsing: the subcommand given, or the default (compare) without one.
int run_given(const Commands& commands, const std::function<int()>& compare) {
  const Commands::Command* given = nullptr;
  try {
    for (const Commands::Command& c : commands.list) {
      if (!c.table->parsed()) continue;
      if (given) throw UsageError(std::string("give one subcommand, not also ") + c.name);
      given = &c;
    }
    return given ? given->run(*given->table) : compare();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s %s: %s\n", kProgram, given ? given->name : "compare", e.what());
    return 2;
  }
}

int print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  return 0;
}

void declare_plan(Commands& commands, Options& o) {
  settings::Table& plan = commands.add(
      "plan",
      "print a run's per-worker plan as CSV: address, the impairer's listen address, link "
      "profile and slowdown drawn for the seed, link seed",
      [&o](auto&) { return print(plan_csv(o.plan)); });
  declare_plan_settings(plan, o.plan);
}

// `shard-row` and `gossip-row`: an evaluation's JSON appended to the run's timelines.
void declare_row(settings::Table& t, Options& o, const char* started) {
  t.add("elapsed", o.elapsed,
        std::string("seconds since the ") + started +
            " started, when the checkpoints were evaluated (required)")
      .required();
  t.add("eval", o.eval, "edgetrain-fleet-eval's JSON (required)").required();
}

void declare_run_commands(Commands& commands, Options& o) {
  settings::Table& acknowledged = commands.add_run(
      "acknowledged",
      "print the highest server version any worker of RUN_DIR got in a 2.04 (from "
      "logs/worker-*.stats.json)",
      o.run, [&o](const settings::Table& t) {
        const auto shard = t.was_set("shard") ? std::optional(o.shard) : std::nullopt;
        return print(std::to_string(highest_acknowledged_in_run(o.run, shard)) + "\n");
      });
  acknowledged.add("shard", o.shard,
                   "a sharded server's shard J: the highest version it acknowledged (not given: "
                   "the highest version of any worker)");
  const auto shard_row = [&o](auto&) {
    require("--eval", o.eval, false);
    return print(append_shard_row(o.run, o.elapsed, o.eval) + "\n");
  };
  declare_row(commands.add_run("shard-row",
                               "--shards: append one evaluation of the assembled model "
                               "(edgetrain-fleet-eval --shards's JSON) to RUN_DIR/timeline.csv, "
                               "with the shards' ingress, and print the row",
                               o.run, shard_row),
              o, "workers");
  SummarizeOptions& s = o.summary;
  settings::Table& summary = commands.add_run(
      "summarize",
      "write workers.csv, outcome.json, the plots and summary.md of a finished run; exit status 3 "
      "if an acknowledged update was lost",
      s.run, [&s](auto&) { return summarize(s); });
  declare_summarize_settings(summary, s);
}

void declare_gossip_commands(Commands& commands, Options& o) {
  const auto wire = [&o](auto&) {
    const GossipWiringOptions& w = o.wiring;
    write_gossip_wiring(w.run, w.network, w.subnet, w.malicious_peers, w.attack);
    return 0;
  };
  declare_gossip_wiring_settings(
      commands.add_run("gossip-wiring",
                       "gossip: from RUN_DIR/plan.csv and topology.json, write every peer's "
                       "address into topology.json, peers.csv (with the attackers' attack) and "
                       "the impairer's links.toml (a link per directed edge)",
                       o.wiring.run, wire),
      o.wiring);
  const auto topologies = [&o](auto&) {
    write_peer_topologies(o.run);
    return 0;
  };
  commands.add_run("gossip-topologies",
                   "gossip: once the impairer listens, write RUN_DIR/peers/NAME.topology.json "
                   "(neighbours' addresses: the impairer's ends of the links)",
                   o.run, topologies);
  const auto gossip_row = [&o](auto&) {
    require("--eval", o.eval, false);
    return print(append_gossip_row(o.run, o.elapsed, o.eval) + "\n");
  };
  declare_row(commands.add_run("gossip-row",
                               "gossip: append one fleet evaluation (edgetrain-fleet-eval's JSON) "
                               "to RUN_DIR/gossip-timeline.csv and timeline.csv, and print the "
                               "timeline.csv row",
                               o.run, gossip_row),
              o, "peers");
  settings::Table& compare = commands.add(
      "gossip-compare",
      "gossip runs beside each other and beside server runs of the same fleet: a markdown table "
      "(time to the target, speed-up against the first run, bytes per device) and plots",
      [&o](auto&) {
        if (o.runs.empty()) throw UsageError("runs: give at least one run directory");
        for (const std::string& run : o.runs) require("runs", run);
        return print(compare_gossip_runs({o.runs.begin(), o.runs.end()}, o.out, o.gossip_target));
      });
  compare.positional("runs", o.runs, "finished run directories, gossip or server (required)");
  compare
      .add("out", o.out,
           "directory for summary.md, accuracy-vs-time.svg, accuracy-vs-bytes.svg (required)")
      .required();
  compare.add("target-accuracy", o.gossip_target, "the target accuracy").range(0, 1);
}

// `compare`, on the main table (the default) and as a subcommand.
void declare_compare(settings::Table& t, Options& o) {
  t.positional("runs", o.runs,
               "run directories, each with timeline.csv written by edgetrain-emulate (required)");
  t.add("out", o.out,
        "directory for accuracy-vs-ingress.svg, accuracy-vs-time.svg and summary.md (required)");
  t.add("target-accuracy", o.target,
        "target test accuracy of the ratio (-1: half a point below the lowest best accuracy)");
}

int compare(const Options& o) {
  if (o.runs.empty() || o.out.empty())
    throw UsageError("needs run directories and --out (see --help)");
  for (const std::string& run : o.runs) require("runs", run);
  print(compare_runs(o.runs, o.out, o.target, true));
  return print("plots: " + o.out + "/accuracy-vs-ingress.svg, " + o.out +
               "/accuracy-vs-time.svg\n");
}

void declare_plot(Commands& commands, Options& o) {
  settings::Table& t = commands.add(
      "plot",
      "an SVG line chart from a CSV with the columns series,x,y (one line per series; y in [0, "
      "1] unless --y-min/--y-max say otherwise)",
      [&o](auto&) {
        require("csv", o.csv, false);
        plot_csv(o.csv, o.svg, o.chart);
        return 0;
      });
  t.positional("csv", o.csv, "the CSV file");
  t.add("out", o.svg, "the SVG file to write (required)").required();
  declare_chart_settings(t, o.chart);
}

void declare_cpu_plan(Commands& commands, Options& o) {
  settings::Table& cpu = commands.add(
      "cpu-plan",
      "print the CPU quota of every worker at 0 s and each change of the schedule, as CSV: "
      "elapsed_s,worker,class,share,quota_us,period_us",
      [&o](auto&) {
        const auto classes = parse_cpu_classes(o.cpu_classes);
        const auto schedule = parse_cpu_schedule(o.cpu_schedule, classes);
        return print(
            cpu_changes_csv(plan_cpu_changes(o.cpu_workers, classes, schedule, o.cpu_period)));
      });
  cpu.add("workers", o.cpu_workers, "number of workers (required)").range(1, 4000).required();
  cpu.add("cpu-classes", o.cpu_classes, "NAME=SHARE,... (see edgetrain-emulate --help; required)")
      .required();
  cpu.add("cpu-schedule", o.cpu_schedule, "START-END:FACTOR[@CLASS],...");
  cpu.add("cpu-period", o.cpu_period, "the cgroups' CPU period, in µs");
}

}  // namespace

int main(int argc, char** argv) {
  // The emulator's settings have their own table and command line (emulator_settings.h).
  if (argc >= 2 && std::string(argv[1]) == "settings")
    return print_emulator_settings(argc - 1, argv + 1);
  Options o;
  settings::Table table(
      kProgram,
      "edgetrain-emulation-report: the plan, checks and reports of edgetrain-emulate runs.\n"
      "Without a subcommand (or with `compare`): plots and a markdown table from run directories; "
      "the\nfirst run is the reference of the traffic ratio (give the ASGD run first).");
  declare_compare(table, o);
  Commands commands{table, {}};
  declare_plan(commands, o);
  declare_run_commands(commands, o);
  declare_gossip_commands(commands, o);
  declare_plot(commands, o);
  declare_cpu_plan(commands, o);
  declare_compare(
      commands.add("compare", "plots and a markdown table from run directories (the default)",
                   [&o](auto&) { return compare(o); }),
      o);
  table.footer(
      "Also: `edgetrain-emulation-report settings [--help]`, edgetrain-emulate's settings checked "
      "and printed as shell assignments.\nEach subcommand's --help lists its flags. Exit status: "
      "0 done; 1 error; 2 bad usage; 3 summarize found a lost acknowledged update.");
  return table.run_program(argc, argv,
                           [&] { return run_given(commands, [&o] { return compare(o); }); });
}
