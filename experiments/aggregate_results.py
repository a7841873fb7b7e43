#!/usr/bin/env python3
"""Tables and plots of a experiments/regenerate.sh matrix, over its seeds.

Reads OUT/jobs.tsv (name, group, data set, seed, program and arguments), each job's
OUT/jobs/NAME/sim.csv (edgetrain-sim) or metrics.csv (edgetrain-gan) and OUT/machine.json; writes OUT/results.md (the section that
experiments/regenerate.sh --update-docs puts into docs/results.md), OUT/tables/*.csv (one row per
setting, method and seed) and OUT/figures/*.svg (drawn by edgetrain-emulation-report plot).

Each figure is a mean over seeds with its sample standard deviation ("97.10 ± 0.12"). The
target accuracy of a data set is ASGD's best accuracy in the paper's setting (10 workers,
methods group), averaged over seeds, minus 0.3 points (the issue's "same accuracy as ASGD
within 0.3 points"). A ratio divides the ingress the same seed's ASGD run needed to reach the
target by the ingress of the run in the row; seeds that never reach it are counted apart. A
setting of the workers or speeds group, whose rows compare with their own ASGD run, uses its
own ASGD's mean best less 0.3 points when that ASGD never comes within 0.3 points of the data
set's target (more workers make ASGD staler: without it those rows would only say "never").
The pull group's rows compare with ASGD at as many workers (the workers group's run), by the
same rule.
This is not the programs' default target (edgetrain-sim, edgetrain-emulation-report compare:
half a point below the lowest best of one command's runs); common/target_accuracy.h and
docs/README.md state both rules and why they differ.
Standard library only.
"""
import argparse
import csv
import shutil
import json
import math
import os
import re
import statistics
import subprocess
import sys

GROUP_TITLES = {
    "methods": "Methods: ASGD, AdaComp, top-k without the staleness rule, and the options (10 workers)",
    "rates": "Compression-rate sweep: AdaComp (10 workers)",
    "workers": "Workers: ASGD against AdaComp at more workers",
    "reliability": "Reliability: a share of the workers fails (2% of their steps) and rejoins or leaves for good",
    "speeds": "Speeds: equal workers (spread 0) against a wide spread (1) of log-normal speeds",
    "pull": "Pulls: the exact model's deltas against the published model, at the most workers (a pull before every step; D = 4N)",
    "gan": "MD-GAN against FL-GAN and the standalone GAN (edgetrain-gan, one process)",
}
# A row from another group that a group's table shows first, to compare with: (its group,
# setting, method, what it is here). The failures are judged against the same run without them.
REFERENCE_ROWS = {"reliability": ("methods", "methods-paper", "AdaComp c=0.01", "no failures")}
# What each emulator group of experiments/run-emulation-experiments.sh compares (its --help says the same).
EMULATION_CAPTIONS = {
    "paper": "Paper CNN, MNIST, 10 workers, a pull before every step, to 97% on the whole test set: ASGD, the "
             "paper's method and the two best option sets of the simulator.",
    "pull100": "Paper CNN, MNIST, 100 workers, a pull before every step: the exact model's deltas against the "
               "published model (issue 13 part 4: the server's socket ingress per update against its payload).",
    "speeds": "Heterogeneity with real CPU quotas (cgroup v1 cpu.cfs_quota_us per worker process): four speed "
              "classes named after the boards (0.35, 0.25, 0.12 and 0.08 of a core) against 0.2 of a core for "
              "every worker, the same two cores in total; paper CNN, MNIST, 10 workers, to 92%.",
}
DATA_TITLES = {"mnist": "MNIST", "mnist-small": "MNIST subset (mnist-small)", "fashion-mnist": "Fashion-MNIST"}


def read_jobs(out):
    jobs = []
    with open(os.path.join(out, "jobs.tsv")) as f:
        for line in f:
            name, group, data, seed, args = line.rstrip("\n").split("\t")
            setting = re.sub(r"-%s-s%s$" % (re.escape(data), seed), "", name)
            jobs.append({"name": name, "group": group, "data": data, "seed": int(seed), "args": args,
                         "setting": setting})
    return jobs


def read_curves(path):
    """sim.csv: method -> list of (updates, ingress_bytes, pull_bytes, accuracy)."""
    curves = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            curves.setdefault(row["method"], []).append(
                (int(row["updates"]), int(row["ingress_bytes"]), int(row["pull_bytes"]), float(row["test_accuracy"])))
    return curves


def first_reaching(curve, target):
    for updates, ingress, _, accuracy in curve:
        if accuracy >= target:
            return updates, ingress
    return None


def target_below(bests):
    """The target that ASGD's best accuracies set: their mean less 0.3 points, rounded down to 0.1."""
    return math.floor((statistics.fmean(bests) - 0.003) * 1000) / 1000


def mean_sd(values, scale=1.0, digits=2):
    if not values:
        return "–"
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"


def human_bytes(n):
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000.0
    return f"{n:.3g} TB"


def reached_text(values, count):
    """A mean over the seeds that reached the target, marked when not all did."""
    if not values:
        return "never"
    return ("%s" if len(values) == count else "%s (" + f"{len(values)}/{count}" + " seeds)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the directory experiments/regenerate.sh wrote")
    parser.add_argument("--report", required=True, help="the edgetrain-emulation-report program (for the plots)")
    parser.add_argument("--emulation", help="an experiments/run-emulation-experiments.sh output directory whose runs were all "
                        "made at the matrix's commit: its groups' tables (bytes at the server's socket beside the "
                        "payload) join the page")
    parser.add_argument("--emulation-any-commit", action="store_true",
                        help="take --emulation runs made at other commits than the matrix's (for example the wire "
                        "regenerated after a transport change): each group then names the commit and date of its runs")
    parser.add_argument("--emulation-before", metavar="DIR",
                        help="an older --emulation directory: each group also present there gets one sentence with "
                        "its older socket-bytes ratios and commit, for comparison")
    args = parser.parse_args()
    machine = json.load(open(os.path.join(args.out, "machine.json")))
    jobs = read_jobs(args.out)
    os.makedirs(os.path.join(args.out, "tables"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "figures"), exist_ok=True)

    runs = []  # one per (job, method in its sim.csv)
    for job in jobs:
        path = os.path.join(args.out, "jobs", job["name"], "sim.csv")
        if job["group"] == "gan" or not os.path.exists(path):
            continue  # failed or not run: the tables say how many seeds they hold
        for method, curve in read_curves(path).items():
            runs.append(dict(job, method=method, curve=curve))

    # The reference of each (data set, seed): ASGD of the paper's setting; of the workers and
    # speeds groups: the same job's ASGD run.
    def asgd_of(run):
        if run["group"] == "pull":  # ASGD at as many workers: the workers group's run of the same seed
            setting = reference_setting(run["group"], run["setting"])
            return next((r for r in runs if r["method"] == "ASGD" and r["group"] == "workers" and r["setting"] == setting
                         and r["data"] == run["data"] and r["seed"] == run["seed"]), None)
        for r in runs:
            if r["method"] == "ASGD" and r["data"] == run["data"] and r["seed"] == run["seed"]:
                if run["group"] in ("workers", "speeds") and r["name"] == run["name"]:
                    return r
                if run["group"] not in ("workers", "speeds") and r["setting"] == "methods-paper":
                    return r
        return None

    targets = {}
    for data in sorted({j["data"] for j in jobs}):
        bests = [max(p[3] for p in r["curve"]) for r in runs
                 if r["data"] == data and r["setting"] == "methods-paper" and r["method"] == "ASGD"]
        if bests:
            targets[data] = target_below(bests)

    # Our choice (the paper gives no rule for it): a setting of a group that runs its own ASGD
    # (workers, speeds) whose ASGD never comes within 0.3 points of the data set's target is
    # measured against its own ASGD's mean best less 0.3 points, so that the table still
    # compares the payloads to the same accuracy rather than saying "never" on every row.
    def reference_setting(group, setting):
        """The setting whose ASGD run a group's setting is compared with."""
        if group == "pull":
            workers = {flag_value(j["args"], "--workers") for j in jobs if j["group"] == group and j["setting"] == setting}
            return f"workers-{workers.pop()}" if len(workers) == 1 else None
        return setting

    def own_target(group, data, setting):
        if group not in ("workers", "speeds", "pull") or data not in targets:
            return targets.get(data)
        reference = reference_setting(group, setting)
        bests = [max(p[3] for p in r["curve"]) for r in runs
                 if r["data"] == data and r["setting"] == reference and r["method"] == "ASGD"]
        if not bests:
            return targets[data]
        own = target_below(bests)
        return own if own < targets[data] else targets[data]

    lines = []
    if all(j["group"] == "gan" for j in jobs):  # `experiments/regenerate.sh gan` alone
        lines.append("## MD-GAN, regenerated (issue 16)\n")
        lines.append(
            f"Made by `experiments/regenerate.sh{' --quick' if machine['quick'] else ''} gan` at commit "
            f"`{machine['commit'][:12]}`{' (with uncommitted changes)' if machine['dirty'] else ''} on "
            f"{machine['date'][:10]}, on a {machine['cores']}-core {machine['cpu']} ({machine['isa']}). The script's "
            "other groups (the AdaComp experiments of issue 13) were not run at this commit.\n")
        lines += gan_section(args, jobs)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write("\n".join(lines))
        return
    lines.append("## The simulator's experiments, regenerated (issue 13)\n")
    lines.append(
        f"Made by `experiments/regenerate.sh{' --quick' if machine['quick'] else ''}` at commit `{machine['commit'][:12]}`"
        f"{' (with uncommitted changes)' if machine['dirty'] else ''}, started on {machine['date'][:10]}, on a {machine['cores']}-core "
        f"{machine['cpu']} ({machine['isa']}); {machine['seeds']} seed(s) per setting, {machine['updates']} applied "
        "updates per run, batch 10, lr 0.1, D = 256. Figures are means over the seeds ± their standard deviation. "
        "Bytes are the paper's count: the encoded update payloads the workers send (the wire codec, "
        "`transport/CODEC.md`); what reaches the server's socket (DTLS, CoAP, pulls) is the emulator's count "
        + ("(\"On the wire\" below, " + ("each group at the commit it names" if args.emulation_any_commit else "at the same commit")
           + ", where the socket's bytes stand beside the payload). " if args.emulation
           else "([emulation-results.md](emulation-results.md), where the socket's bytes stand beside the payload). ")
        + "The target of a data set is ASGD's mean best accuracy in the paper's setting minus 0.3 points; "
        "\"ASGD / this\" divides the ingress the same seed's ASGD run needed to reach it by this run's. XNNPACK "
        "chooses its kernels by the CPU, so another machine repeats these figures closely, not bit for bit.\n")
    lines += machines_text(args.out, jobs, machine)
    finished = {r["name"] for r in runs}
    matrix = [j for j in jobs if j["group"] != "gan"]
    if len(finished) < len(matrix):
        lines.append(f"**Partial:** {len(finished)} of the matrix's {len(matrix)} jobs have finished; the tables hold "
                     "those (a mean over fewer seeds where a setting's seeds are missing, and no row for a setting "
                     "none of whose jobs has run). The rest resume at the same commit (docs/README.md).\n")
    goals_at = len(lines)  # the summary against the goals goes here, once the tables are made
    table_rows = []
    for group in [g for g in GROUP_TITLES if any(r["group"] == g for r in runs) and g != "gan"]:
        lines.append(f"### {GROUP_TITLES[group]}\n")
        for data in [d for d in DATA_TITLES if any(r["data"] == d and r["group"] == group for r in runs)] + \
                sorted({r["data"] for r in runs if r["data"] not in DATA_TITLES and r["group"] == group}):
            target = targets.get(data)
            seeds = sorted({r["seed"] for r in runs if r["data"] == data and r["group"] == group})
            lines.append(f"{DATA_TITLES.get(data, data)}, target {target * 100:.1f}%:\n" if target is not None
                         else f"{DATA_TITLES.get(data, data)} (no ASGD reference run: no target):\n")
            pulls = group == "pull"  # its point is the pull: pulled bytes per applied update too
            lines.append("| setting | method | best acc % | final acc % | bytes / update | updates to target | "
                         "ingress to target | ASGD / this |" + (" pulled bytes / update |" if pulls else ""))
            lines.append("|---|---|---|---|---|---|---|---|" + ("---|" if pulls else ""))
            keys = []  # (the group its runs are in, setting, method)
            if group in REFERENCE_ROWS:
                source, setting, method, _ = REFERENCE_ROWS[group]
                if any(r["group"] == source and r["data"] == data and r["setting"] == setting and r["method"] == method
                       for r in runs):
                    keys.append((source, setting, method))
            for r in runs:
                if r["group"] == group and r["data"] == data and (group, r["setting"], r["method"]) not in keys:
                    keys.append((group, r["setting"], r["method"]))
            own_targets = []
            for source, setting, method in keys:
                same = [r for r in runs if r["group"] == source and r["data"] == data and r["setting"] == setting
                        and r["method"] == method]
                target = own_target(group, data, setting)
                if target is not None and target != targets.get(data) and (setting, target) not in own_targets:
                    own_targets.append((setting, target))
                bests = [max(p[3] for p in r["curve"]) for r in same]
                finals = [r["curve"][-1][3] for r in same]
                per_update = [r["curve"][-1][1] / max(1, r["curve"][-1][0]) for r in same]
                to_updates, to_bytes, ratios = [], [], []
                for r in same:
                    reached = first_reaching(r["curve"], target) if target is not None else None
                    reference = asgd_of(r)
                    ref_reached = first_reaching(reference["curve"], target) if reference and target is not None else None
                    if reached:
                        to_updates.append(reached[0])
                        to_bytes.append(reached[1])
                        if ref_reached and reached[1] > 0:
                            ratios.append(ref_reached[1] / reached[1])
                    if source != group:
                        continue  # a reference row: its own group's table lists it in runs.csv
                    table_rows.append({"group": group, "data": data, "setting": setting, "method": method,
                                       "seed": r["seed"], "best_accuracy": max(p[3] for p in r["curve"]),
                                       "final_accuracy": r["curve"][-1][3], "updates": r["curve"][-1][0],
                                       "ingress_bytes": r["curve"][-1][1], "pull_bytes": r["curve"][-1][2],
                                       "target": target, "updates_to_target": reached[0] if reached else "",
                                       "ingress_to_target": reached[1] if reached else "",
                                       "asgd_ingress_to_target": ref_reached[1] if ref_reached else ""})
                n = len(same)
                updates_cell = reached_text(to_updates, n)
                if to_updates:
                    updates_cell = updates_cell % f"{statistics.fmean(to_updates):,.0f}"
                bytes_cell = reached_text(to_bytes, n)
                if to_bytes:
                    bytes_cell = bytes_cell % human_bytes(statistics.fmean(to_bytes))
                ratio_cell = "1x" if method == "ASGD" and setting in ("methods-paper",) or (
                    method == "ASGD" and group in ("workers", "speeds")) else (
                    (mean_sd(ratios, 1, 1) + "x" + ("" if len(ratios) == n else f" ({len(ratios)}/{n} seeds)"))
                    if ratios else "–")
                pulled = [r["curve"][-1][2] / max(1, r["curve"][-1][0]) for r in same]
                shown = setting if source == group else f"{setting} ({REFERENCE_ROWS[group][3]})"
                lines.append(f"| {shown} | {method} | {mean_sd(bests, 100)} | {mean_sd(finals, 100)} | "
                             f"{human_bytes(statistics.fmean(per_update))} | {updates_cell} | {bytes_cell} | {ratio_cell} |"
                             + (f" {human_bytes(statistics.fmean(pulled))} |" if pulls else ""))
            target = targets.get(data)
            if own_targets and group == "pull":
                lines.append(f"\nThese rows compare with ASGD at as many workers ({reference_setting(group, own_targets[0][0])} "
                             "of the workers group, same seed), which never came within 0.3 points of the target, so "
                             "each is measured to that ASGD's mean best less 0.3 points (our choice): "
                             + ", ".join(f"{setting} to {t * 100:.1f}%" for setting, t in own_targets) + ".")
            elif own_targets:
                lines.append("\nIn these settings ASGD itself never came within 0.3 points of the target, so each is measured "
                             "against its own ASGD's mean best less 0.3 points (our choice): "
                             + ", ".join(f"{setting} to {t * 100:.1f}%" for setting, t in own_targets) + ".")
            lines.append(f"\nSeeds: {', '.join(map(str, seeds))}. Commands: `{args.out}/jobs/<setting>-{data}-s<seed>/command`.\n")
            figure = plot_group(args, group, data, runs, target)
            if figure:
                lines.append(f"![{GROUP_TITLES[group]}, {DATA_TITLES.get(data, data)}](figures/{figure})\n")

    goals, wire = goals_text(table_rows, targets), wire_goal_text(args)
    if wire:  # one list: the wire's line joins the payload's
        goals = (goals[:-1] if goals else ["### Against the goals\n"]) + wire
    lines[goals_at:goals_at] = goals + findings_text(table_rows)
    if args.emulation:
        lines += emulation_text(args, machine)

    if any(j["group"] == "gan" for j in jobs):
        lines += gan_section(args, [j for j in jobs if j["group"] == "gan"])

    with open(os.path.join(args.out, "tables", "runs.csv"), "w", newline="") as f:
        if table_rows:
            writer = csv.DictWriter(f, fieldnames=list(table_rows[0].keys()))
            writer.writeheader()
            writer.writerows(table_rows)
    lines.append("Every run's curve: `sim.csv` in its job directory; every row of the tables above, per seed: "
                 "`tables/runs.csv`.\n")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines))


def emulation_text(args, machine):
    """The emulator's groups in ARGS.emulation (experiments/run-emulation-experiments.sh OUT): each group's
    table (edgetrain-emulation-report's summary.md), its commands and its two plots. Refused
    unless every run there was made at the matrix's commit (RUN.commit beside each run), so
    that the page still holds one commit's numbers."""
    root = args.emulation
    commits = {}
    for name in sorted(os.listdir(root)):
        if name.endswith(".commit"):
            commits[name[:-len(".commit")]] = open(os.path.join(root, name)).read().strip()
    if not commits:
        sys.exit(f"aggregate_results.py: {root} holds no emulator runs (no RUN.commit files)")
    others = {run: c for run, c in commits.items() if not machine["commit"].startswith(c)}
    if others and not args.emulation_any_commit:
        sys.exit(f"aggregate_results.py: emulator runs of another commit than {machine['commit'][:12]} in {root} "
                 "(--emulation-any-commit takes them): "
                 + ", ".join(f"{run} ({c})" for run, c in sorted(others.items())))
    same_commit = not others
    lines = ["### On the wire: the emulator " + ("at the same commit\n" if same_commit else "(each group at its own commit)\n"),
             "The real server and workers (`emulation/edgetrain-emulate`: DTLS, CoAP block-wise transfers, a pull "
             "before every step, each worker in its own network namespace, CPU quotas), one run per row, made by "
             "`EDGETRAIN_BUILD_DIR=<a build of "
             + ("the commit above" if same_commit else "the group's commit") + "> "
             "experiments/run-emulation-experiments.sh GROUP` (the commands "
             f"below; the runs' tables and curves are in `{root}`). \"socket "
             "ingress\" is everything that reached the server's UDP socket, \"payload ingress\" the update payloads "
             "the paper counts; the ratios divide the first run's bytes to the target by each run's.\n"]
    if not same_commit:
        lines[-1] = lines[-1][:-1] + (" The groups were run after the simulator's matrix, each at the commit it names "
                                      "(a group compares runs of one commit among themselves).\n")
    for group_dir in sorted(d for d in os.listdir(root) if d.startswith("group-")):
        title = group_dir[len("group-"):]
        summary = os.path.join(root, group_dir, "summary.md")
        if not os.path.exists(summary):
            continue
        runs = sorted(run for run in commits if run.startswith(title + "-"))
        lines.append(f"#### The `{title}` group\n")
        if title in EMULATION_CAPTIONS:
            lines.append(EMULATION_CAPTIONS[title] + "\n")
        if not same_commit:
            lines.append(f"Runs made at commit {runs_made_at(root, runs)}.\n")
        lines.append(open(summary).read().strip() + "\n")
        before = ratios_before(args, title)
        if before:
            lines.append(before + "\n")
        lines += datagram_table(root, title, runs)
        lines.append("```sh")
        for run in runs:
            command = os.path.join(root, run + ".command")
            if os.path.exists(command):
                lines.append(open(command).read().strip())
        lines.append("```\n")
        for kind, what in (("accuracy-vs-ingress", "socket ingress"), ("accuracy-vs-time", "time")):
            source = os.path.join(root, group_dir, kind + ".svg")
            if os.path.exists(source):
                target = f"regenerated-emulation-{title}-{kind}.svg"
                shutil.copy(source, os.path.join(args.out, "figures", target))
                lines.append(f"![{title}: accuracy against {what}](figures/{target})")
        lines.append("")
    return lines


def runs_made_at(root, runs):
    """The commits (RUN.commit) and dates (RUN.date, written when the run started) of a group's runs."""
    def read(run, kind):
        path = os.path.join(root, f"{run}.{kind}")
        return open(path).read().strip() if os.path.exists(path) else None
    commits = sorted({read(run, "commit") or "unknown" for run in runs})
    dates = sorted({read(run, "date") for run in runs} - {None})
    # RUN.load: the machine's 5- and 15-minute load averages when the run ended (its own
    # processes included), so a reader can tell a time-to-target measured on a busy machine.
    loads = [read(run, "load").split() for run in runs if read(run, "load")]
    five, fifteen = [float(load[0]) for load in loads], [float(load[1]) for load in loads]
    cores = sorted({load[2] for load in loads if len(load) > 2})
    return (", ".join(f"`{c}`" for c in commits) + (f" on {', '.join(dates)}" if dates else "")
            + (f", load average at each run's end{' (' + '/'.join(cores) + ' cores)' if cores else ''} "
               f"{min(five):.1f}–{max(five):.1f} over 5 minutes, {min(fifteen):.1f}–{max(fifteen):.1f} over 15"
               if loads else ""))


def datagram_table(root, title, runs):
    """Per run, from the server's final stats file (the run's logs/server-1.stats.json, or its copy
    RUN/server.stats.json where only a run's summary files are kept; runs without a server restart
    only), the datagrams through the server's socket per applied update and the socket ingress
    over the update payload, whole run (handshakes and every worker's first, dense, pull
    included): issue 36's measures."""
    rows = []
    summary = os.path.join(root, f"group-{title}", "summary.md")
    order = [label for label, _ in summary_column(summary, "run")] if os.path.exists(summary) else []
    for run in runs:
        path = os.path.join(root, run, "server.stats.json")
        if not os.path.exists(path) and not os.path.exists(os.path.join(root, run, "logs", "server-2.stats.json")):
            path = os.path.join(root, run, "logs", "server-1.stats.json")
        if not os.path.exists(path):
            continue
        stats = json.load(open(path))
        updates = stats.get("updates_applied", 0)
        if updates <= 0 or "ingress_socket_datagrams" not in stats:
            continue
        label = open(os.path.join(root, run, "run.label")).read().strip() if os.path.exists(
            os.path.join(root, run, "run.label")) else run
        datagrams_in, datagrams_out = stats["ingress_socket_datagrams"], stats["egress_socket_datagrams"]
        rows.append((order.index(label) if label in order else len(order), f"| {label} | {updates:,} | {(datagrams_in + datagrams_out) / updates:,.1f} | "
                    f"{datagrams_in / updates:,.1f} | {stats['ingress_socket_bytes'] / stats['ingress_payload_bytes']:.2f} |"))
    if not rows:
        return []
    return ["Datagrams through the server's socket, from its stats file at the end of each run (whole run: the "
            "handshakes and each worker's first, dense, pull included):\n",
            "| run | updates applied | datagrams in + out / update | datagrams in / update | socket ingress / update payload |",
            "|---|---|---|---|---|"] + [row for _, row in sorted(rows)] + [""]


def socket_ratios(summary):
    """The rows of an emulator group's summary.md as (socket-bytes ratio of the first run to this one, label)."""
    rows = []
    for line in open(summary):
        match = re.search(r"\*\*([0-9.]+)x\*\*", line)
        if line.startswith("| ") and match:
            rows.append((float(match.group(1)), line.split("|")[1].strip()))
    return rows


def ratios_before(args, title):
    """One sentence: the socket-bytes ratios the same group had in --emulation-before, and its commit."""
    if not args.emulation_before:
        return None
    summary = os.path.join(args.emulation_before, f"group-{title}", "summary.md")
    if not os.path.exists(summary):
        return None
    runs = sorted(name[:-len(".commit")] for name in os.listdir(args.emulation_before)
                  if name.endswith(".commit") and name.startswith(title + "-"))
    rows = socket_ratios(summary)[1:]  # the first run is the reference: 1.0x
    overheads = summary_column(summary, "transport overhead")
    same_runs = all(os.path.exists(os.path.join(args.emulation, f"{run}.commit")) and
                    open(os.path.join(args.emulation, f"{run}.commit")).read() ==
                    open(os.path.join(args.emulation_before, f"{run}.commit")).read() for run in runs)
    if not rows or same_runs:  # nothing older to compare with
        return None
    return (f"For comparison, the same group at commit {runs_made_at(args.emulation_before, runs)} "
            f"(`{args.emulation_before}`): socket bytes to the target, the first run's over each run's, "
            + ", ".join(f"{ratio:.1f}x ({label})" for ratio, label in rows)
            + ("; socket ingress beyond the payload (transport overhead) " + ", ".join(
                f"{overhead} ({label})" for label, overhead in overheads) if overheads else "") + ".")


def summary_column(summary, name):
    """(run label, cell) of one column of an emulator group's summary.md table, by its header."""
    header, cells = None, []
    for line in open(summary):
        if not line.startswith("| "):
            continue
        fields = [field.strip() for field in line.strip().strip("|").split("|")]
        if header is None:
            header = fields
        elif name in header and len(fields) == len(header):
            cells.append((fields[0], fields[header.index(name)]))
    return cells


def goals_text(table_rows, targets):
    """Issue 13's goals in the paper's terms (update payload): the paper's method (AdaComp
    c = 0.01 at 10 workers) against ASGD to the same accuracy within 0.3 points, and the best
    setting of the methods and rates groups (options included) whose every seed reached it."""
    lines = ["### Against the goals\n"]
    for data in [d for d in DATA_TITLES if d in targets] + sorted(d for d in targets if d not in DATA_TITLES):
        rows = [r for r in table_rows if r["data"] == data and r["group"] in ("methods", "rates") and r["method"] != "ASGD"]
        by_setting = {}
        for r in rows:
            by_setting.setdefault((r["setting"], r["method"]), []).append(r)

        def ratios(same):
            return [r["asgd_ingress_to_target"] / r["ingress_to_target"] for r in same
                    if r["ingress_to_target"] != "" and r["asgd_ingress_to_target"] != "" and r["ingress_to_target"] > 0]

        asgd_best = [r["best_accuracy"] for r in table_rows if r["data"] == data and r["setting"] == "methods-paper"
                     and r["method"] == "ASGD"]
        paper = by_setting.get(("methods-paper", "AdaComp c=0.01"), [])
        title = DATA_TITLES.get(data, data)
        if paper:
            paper_ratios = ratios(paper)
            best_gap = (statistics.fmean(r["best_accuracy"] for r in paper) - statistics.fmean(asgd_best)) * 100
            lines.append(
                f"- {title}, the paper's method (AdaComp c = 0.01, 10 workers), to {targets[data] * 100:.1f}% "
                f"(ASGD's mean best less 0.3 points): "
                + (f"**{mean_sd(paper_ratios, 1, 1)}x** less update payload than ASGD"
                   + ("" if len(paper_ratios) == len(paper) else f" ({len(paper_ratios)} of {len(paper)} seeds reached it)")
                   if paper_ratios else "never reached it")
                + f"; its best accuracy {best_gap:+.2f} points against ASGD's. The paper's 191x: "
                + ("**met**." if paper_ratios and len(paper_ratios) == len(paper) and statistics.fmean(paper_ratios) >= 191
                   else "not met."))
            # Why: the ratio to the target is the payload ratio per update times ASGD's updates to
            # the target over AdaComp's, so the reader sees which of the two falls short of 191x.
            asgd = [r for r in table_rows if r["data"] == data and r["setting"] == "methods-paper" and r["method"] == "ASGD"]
            per_update = [r["ingress_bytes"] / max(1, r["updates"]) for r in asgd]
            paper_per_update = [r["ingress_bytes"] / max(1, r["updates"]) for r in paper]
            asgd_updates = [r["updates_to_target"] for r in asgd if r["updates_to_target"] != ""]
            paper_updates = [r["updates_to_target"] for r in paper if r["updates_to_target"] != ""]
            if per_update and paper_per_update:
                payload_ratio = statistics.fmean(per_update) / statistics.fmean(paper_per_update)
                text = (f"  - Why: per update, its payload is **{payload_ratio:.1f}x** smaller than ASGD's "
                        f"({human_bytes(statistics.fmean(paper_per_update))} against "
                        f"{human_bytes(statistics.fmean(per_update))}: c = 0.01 of the entries, each with its index)")
                if asgd_updates and paper_updates:
                    update_ratio = statistics.fmean(asgd_updates) / statistics.fmean(paper_updates)
                    text += (f"; it needed {statistics.fmean(paper_updates):,.0f} updates to the target against ASGD's "
                             f"{statistics.fmean(asgd_updates):,.0f}, a factor of {update_ratio:.2f}. The ratio to "
                             f"the target is about the product of the two ({payload_ratio:.1f} x {update_ratio:.2f} = "
                             f"{payload_ratio * update_ratio:.1f}x; the mean above is over each seed's own ratio). "
                             f"191x at this payload would need "
                             f"AdaComp to reach the target in {payload_ratio / 191:.2f}x ASGD's updates, i.e. to "
                             "learn faster per update than dense ASGD.")
                else:
                    text += "."
                lines.append(text)
        reached = {key: (ratios(same), len(same)) for key, same in by_setting.items() if ratios(same)}
        if reached:
            # Settings whose every seed reached the target first, then by their mean ratio.
            (setting, method), (best, count) = max(
                reached.items(), key=lambda item: (len(item[1][0]) == item[1][1], statistics.fmean(item[1][0])))
            seeds_text = "every seed" if len(best) == count else f"{len(best)} of {count} seeds; none reached it with every seed"
            lines.append(
                f"- {title}, the best setting of the methods and rates groups to reach the target ({seeds_text}): "
                f"{setting} ({method}), **{mean_sd(best, 1, 1)}x**; the goal of 300x with options: "
                + ("**met**" if statistics.fmean(best) >= 300 and len(best) == count else "not met")
                + " in payload terms.")
        # More workers: the paper's method against ASGD at the same worker count (each to the
        # target its table names).
        scaled = {}
        for r in table_rows:
            if r["data"] == data and r["group"] == "workers" and r["method"] != "ASGD":
                scaled.setdefault(r["setting"], []).append(r)
        parts = []
        for setting, same in scaled.items():
            got = ratios(same)
            parts.append(f"{setting}: " + (f"**{mean_sd(got, 1, 1)}x**" + ("" if len(got) == len(same) else
                                                                              f" ({len(got)} of {len(same)} seeds)")
                                           if got else "never reached it")
                         + f" to {same[0]['target'] * 100:.1f}%")
        if parts:
            lines.append(f"- {title}, the paper's method at more workers against ASGD at as many: " + "; ".join(parts)
                         + " (ASGD's accuracy falls as the workers grow staler; see the workers table).")
    lines.append("")
    return lines if len(lines) > 2 else []


def wire_goal_text(args):
    """The 300x goal on the wire: the best socket-bytes ratio of the emulator's `paper` group
    (its summary.md, bold ratio column), when that group was run at the matrix's commit."""
    summary = os.path.join(args.emulation, "group-paper", "summary.md") if args.emulation else None
    if not summary or not os.path.exists(summary):
        return []
    others = socket_ratios(summary)[1:]  # the first run is ASGD, the reference
    if not others:
        return []
    ratio, label = max(others)
    paper = [r for r in others if r[1].startswith("AdaComp c=0.01 (")]  # its label: no option named
    before = ""
    old_summary = os.path.join(args.emulation_before, "group-paper", "summary.md") if args.emulation_before else None
    if old_summary and os.path.exists(old_summary):
        old_others = socket_ratios(old_summary)[1:]
        old_paper = [r for r in old_others if r[1].startswith("AdaComp c=0.01 (")]
        if old_others:
            before = ("; before, " + (f"{old_paper[0][0]:.1f}x and " if old_paper else "")
                      + f"{max(old_others)[0]:.1f}x (the group's older runs, below)")
    # Issue 36's goals on the wire: the paper's method >= 100x, the best with options >= 300x.
    return [f"- On the wire (the emulator's `paper` group below: everything that reached the server's UDP socket, "
            f"one run each, MNIST, to its target): "
            + (f"the paper's method {paper[0][0]:.1f}x (goal 100x: " + ("**met**" if paper[0][0] >= 100 else "not met")
               + "), " if paper else "") + "the best with options "
            f"{label}, **{ratio:.1f}x**; the goal of 300x on the wire: "
            + ("**met**" if ratio >= 300 else "not met") + before + ".", ""]


def findings_text(table_rows):
    """One line per group on what its table shows, computed from the same rows (best accuracy,
    mean over the seeds), so the summary cannot drift from the tables."""
    def best(data, group, setting, method):
        values = [r["best_accuracy"] for r in table_rows if r["data"] == data and r["group"] == group
                  and r["setting"] == setting and r["method"] == method]
        return statistics.fmean(values) * 100 if values else None

    def settings(data, group):
        found = []
        for r in table_rows:
            if r["data"] == data and r["group"] == group and r["setting"] not in found:
                found.append(r["setting"])
        return found

    lines = []
    for data in [d for d in DATA_TITLES if any(r["data"] == d for r in table_rows)]:
        title = DATA_TITLES[data]
        paper = best(data, "methods", "methods-paper", "AdaComp c=0.01")
        asgd = best(data, "methods", "methods-paper", "ASGD")
        facts = []
        norule = best(data, "methods", "methods-norule", "AdaComp c=0.01")
        if paper is not None and norule is not None:
            facts.append(f"the staleness rule is worth {paper - norule:+.2f} points of best accuracy to top-k "
                         f"({paper:.2f}% with it, {norule:.2f}% without)")
        rates = [(float(s.split("-")[1]), best(data, "rates", s, f"AdaComp c={s.split('-')[1]}"))
                 for s in settings(data, "rates")]
        if paper is not None:
            rates.append((0.01, paper))
        rates = sorted((c, a) for c, a in rates if a is not None)
        if len(rates) > 1:
            facts.append("best accuracy by compression rate: " + ", ".join(f"c = {c:g}: {a:.2f}%" for c, a in rates))
        scale = [(int(s.split("-")[1]), best(data, "workers", s, "ASGD"), best(data, "workers", s, "AdaComp c=0.01"))
                 for s in settings(data, "workers")]
        if scale and asgd is not None and paper is not None:
            facts.append("from 10 workers to " + ", ".join(str(n) for n, _, _ in scale) + ": ASGD's best accuracy "
                         + " → ".join(f"{a:.2f}%" for a in [asgd] + [a for _, a, _ in scale if a is not None])
                         + ", AdaComp's " + " → ".join(f"{a:.2f}%" for a in [paper] + [a for _, _, a in scale if a is not None]))
        failing = [(s, best(data, "reliability", s, "AdaComp c=0.01")) for s in settings(data, "reliability")]
        if failing and paper is not None:
            facts.append(f"with failing workers the paper's method kept a best accuracy of "
                         + ", ".join(f"{a:.2f}% ({s.replace('reliability-', '').replace('-', ' ')})"
                                     for s, a in failing if a is not None)
                         + f" against {paper:.2f}% without failures")
        spread = {s: (best(data, "speeds", s, "ASGD"), best(data, "speeds", s, "AdaComp c=0.01"))
                  for s in settings(data, "speeds")}
        if "speeds-0" in spread and "speeds-1" in spread and None not in spread["speeds-0"] + spread["speeds-1"]:
            facts.append(f"a wide spread of speeds against equal ones: ASGD {spread['speeds-1'][0]:.2f}% against "
                         f"{spread['speeds-0'][0]:.2f}%, AdaComp {spread['speeds-1'][1]:.2f}% against "
                         f"{spread['speeds-0'][1]:.2f}%")
        pulls = []
        for s in settings(data, "pull"):
            same = [r for r in table_rows if r["data"] == data and r["group"] == "pull" and r["setting"] == s]
            pulled = statistics.fmean(r["pull_bytes"] / max(1, r["updates"]) for r in same)
            pulls.append(f"{s.replace('pull-', '')} {human_bytes(pulled)} pulled per update, best "
                         f"{statistics.fmean(r['best_accuracy'] for r in same) * 100:.2f}%")
        if pulls:
            facts.append("pulls at the most workers: " + "; ".join(pulls))
        lines += [f"- {title}: {fact}." for fact in facts]
    return (["### What the tables show\n", "Best accuracies are means over the seeds; the tables below hold "
             "the spreads.\n"] + lines + [""]) if lines else []


def machines_text(out, jobs, machine):
    """When the matrix was resumed on other CPUs (docs/regenerated/ across sessions), which
    jobs ran where: each job directory's `cpu` file, written where the job ran."""
    if not machine.get("resumed_on"):
        return []
    counts = {}
    for job in jobs:
        path = os.path.join(out, "jobs", job["name"], "cpu")
        cpu = open(path).read().strip() if os.path.exists(path) else "not recorded"
        counts.setdefault(cpu, []).append(job["name"])
    parts = [f"{cpu}: {len(names)} jobs" + (f" ({', '.join(sorted({n.split('-')[0] for n in names}))})")
             for cpu, names in sorted(counts.items(), key=lambda item: -len(item[1]))]
    return ["The matrix was run over several sessions, on more than one machine (the same commit): "
            + "; ".join(parts) + ". A job's `cpu` file names the machine it ran on.\n"]


def flag_value(args_text, flag, default=""):
    words = args_text.split()
    return words[words.index(flag) + 1] if flag in words else default


def gan_section(args, jobs):
    """The gan group: one row per run (seed 1), the scores of its last and best evaluation,
    the worker's compute and traffic per iteration; a plot of the MNIST score per batch size;
    the last image grid of every run."""
    lines = [f"### {GROUP_TITLES['gan']}\n"]
    rows = []
    for job in jobs:
        path = os.path.join(args.out, "jobs", job["name"], "metrics.csv")
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            evaluations = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
        if not evaluations:
            continue
        mode = flag_value(job["args"], "--mode")
        rows.append({"job": job, "mode": mode, "k": flag_value(job["args"], "--k") if mode == "md-gan" else "",
                     "arch": flag_value(job["args"], "--arch") or "mlp",
                     "b": int(flag_value(job["args"], "--batch")), "workers": int(flag_value(job["args"], "--workers")),
                     "evaluations": evaluations, "scored": "mnist_score" in evaluations[-1]})
    if not rows:
        return lines + ["(no finished run)\n"]
    scored = all(r["scored"] for r in rows)
    lines.append(
        "Seed 1 only, MLP generator and discriminator unless the run says CNN (`model/gan_network.h`), "
        "Adam 2e-4 (0.5, 0.999), "
        "N = %d workers in one process (`sim/gan_simulation.h`); each run's last evaluation against its best. " %
        rows[0]["workers"] +
        ("MNIST score and Fréchet distance (FID's formula) with the paper CNN classifier of "
         "`experiments/train-classifier.sh` (at least 99%% on the MNIST test set, checked when it is made), on %s generated samples against as many test images. "
         % "500" if scored else "No classifier was given: conditional accuracy only. ") +
        "\"worker s / it\" is the mean compute time of one worker per generator iteration; traffic is per worker "
        "and iteration, measured (bytes) and, for MD-GAN, the paper's formula (2·b·d down, b·d up, d = 784, 4 bytes "
        "a value). FL-GAN's traffic is its model averaging, spread over the iterations.\n")
    lines.append("| run | iterations | MNIST score last (best) | FID last (best) | conditional accuracy last (best) | "
                 "worker s / it | down B / worker / it | up B / worker / it | formula down / up |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        e = r["evaluations"]
        last, iterations = e[-1], int(e[-1]["iteration"])
        per = max(1, iterations * r["workers"])
        label = {"md-gan": f"MD-GAN k={r['k']}", "fl-gan": "FL-GAN", "standalone": "standalone"}[r["mode"]] + f", b={r['b']}"
        if r["arch"] != "mlp":
            label += ", " + r["arch"].upper()
        score = (f"{last['mnist_score']:.2f} ({max(x['mnist_score'] for x in e):.2f})" if r["scored"] else "–")
        fid = (f"{last['frechet_distance']:.1f} ({min(x['frechet_distance'] for x in e):.1f})" if r["scored"] else "–")
        accuracy = f"{last['conditional_accuracy']:.3f} ({max(x['conditional_accuracy'] for x in e):.3f})"
        worker = f"{last.get('worker_seconds_per_iteration', 0):.4f}" if r["mode"] != "standalone" else "–"
        formula = f"{2 * r['b'] * 784 * 4:,} / {r['b'] * 784 * 4:,}" if r["mode"] == "md-gan" else "–"
        down = f"{last.get('down_bytes', 0) / per:,.0f}" if r["mode"] != "standalone" else "–"
        up = f"{last.get('up_bytes', 0) / per:,.0f}" if r["mode"] != "standalone" else "–"
        lines.append(f"| {label} | {iterations:,} | {score} | {fid} | {accuracy} | {worker} | {down} | {up} | {formula} |")
        r["label"] = label
    lines.append("\nCommands: `%s/jobs/gan-*/command`.\n" % args.out)
    # The comparison: at equal generator iterations (the most that every run of a batch
    # size and architecture reached), scores and the worker's compute against FL-GAN's.
    for b, arch in sorted({(r["b"], r["arch"]) for r in rows}):
        same = [r for r in rows if r["b"] == b and r["arch"] == arch]
        common = min(int(r["evaluations"][-1]["iteration"]) for r in same)
        if common == 0 or len(same) < 2:
            continue
        fl = [r for r in same if r["mode"] == "fl-gan"]
        fl_seconds = fl[0]["evaluations"][-1].get("worker_seconds_per_iteration", 0) if fl else 0
        lines.append(f"At {common:,} iterations (the most every b = {b}{', ' + arch.upper() if arch != 'mlp' else ''} "
                     "run reached):\n")
        lines.append("| run | MNIST score | FID | conditional accuracy | worker s / it | worker compute / FL-GAN's |")
        lines.append("|---|---|---|---|---|---|")
        for r in same:
            at = [x for x in r["evaluations"] if int(x["iteration"]) == common]
            if not at:
                continue
            x = at[0]
            seconds = r["evaluations"][-1].get("worker_seconds_per_iteration", 0)
            ratio = f"{seconds / fl_seconds:.2f}" if fl_seconds and r["mode"] != "standalone" else "–"
            lines.append(f"| {r['label']} | " + (f"{x['mnist_score']:.2f} | {x['frechet_distance']:.1f}" if r["scored"]
                                                 else "– | –") +
                         f" | {x['conditional_accuracy']:.3f} | " +
                         (f"{seconds:.4f}" if r["mode"] != "standalone" else "–") + f" | {ratio} |")
        lines.append("")
    metric = "mnist_score" if scored else "conditional_accuracy"

    def plot_metric(b, name, key, title, y_axis):
        """One curve per run of batch size b: `key` of every evaluation against the iteration."""
        csv_path = os.path.join(args.out, "figures", name[:-4] + ".csv")
        with open(csv_path, "w") as f:
            f.write("series,x,y\n")
            for r in rows:
                if r["b"] == b:
                    for x in r["evaluations"]:
                        f.write("%s,%r,%r\n" % (r["label"].replace(",", ";"), x["iteration"], x[key]))
        subprocess.run([args.report, "plot", csv_path, "--out", os.path.join(args.out, "figures", name), "--title",
                        title, "--x-label", "generator iterations"] + y_axis, check=True)

    for b in sorted({r["b"] for r in rows}):
        name = f"regenerated-gan-b{b}.svg"
        plot_metric(b, name, metric, f"MD-GAN, FL-GAN and standalone, b = {b}",
                    ["--y-label", "MNIST score (paper CNN)", "--y-min", "1", "--y-max", "10"] if scored else
                    ["--y-label", "conditional accuracy of the samples"])
        lines.append(f"![{metric} against iterations, b = {b}](figures/{name})\n")
        if scored:
            name = f"regenerated-gan-fid-b{b}.svg"
            plot_metric(b, name, "frechet_distance",
                        f"MD-GAN, FL-GAN and standalone, b = {b}: Frechet distance to test digits (lower is better)",
                        ["--y-label", "Frechet distance (paper CNN features)"])
            lines.append(f"![Fréchet distance against iterations, b = {b}](figures/{name})\n")
    grids = []
    for r in rows:
        grid = os.path.join(args.out, "jobs", r["job"]["name"], "samples.png")
        if os.path.exists(grid):
            target = f"regenerated-{r['job']['name']}.png"
            shutil.copyfile(grid, os.path.join(args.out, "figures", target))
            grids.append(f"![{r['label']}](figures/{target})")
    if grids:
        lines.append("Generated digits at the last evaluation (one column per class), in the table's order:\n")
        lines.append(" ".join(grids) + "\n")
    return lines


def plot_group(args, group, data, runs, target):
    """Mean curve over seeds (accuracy against ingress), one line per setting and method."""
    series = {}
    for r in runs:
        if r["group"] != group or r["data"] != data:
            continue
        label = r["method"] if group == "methods" else f"{r['setting']}: {r['method']}"
        series.setdefault(label, []).append(r["curve"])
    if not series:
        return None
    name = f"regenerated-{group}-{data}.svg"
    csv_path = os.path.join(args.out, "figures", name[:-4] + ".csv")
    with open(csv_path, "w") as f:
        f.write("series,x,y\n")
        for label, curves in series.items():
            length = min(len(c) for c in curves)
            for i in range(length):
                ingress = statistics.fmean(c[i][1] for c in curves)
                if ingress <= 0:
                    continue  # the log axis starts at the first update
                f.write('%s,%r,%r\n' % (label.replace(',', ';'), ingress,
                                          statistics.fmean(c[i][3] for c in curves)))
    command = [args.report, "plot", csv_path, "--out", os.path.join(args.out, "figures", name), "--log-x",
               "--title", f"{GROUP_TITLES[group].split(':')[0]}, {DATA_TITLES.get(data, data)} (mean over seeds)",
               "--x-label", "update bytes the workers sent (payload)"]
    if target is not None:
        command += ["--reference-y", str(target)]
    subprocess.run(command, check=True)
    return name


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, KeyError) as e:
        print(f"aggregate_results.py: {e}", file=sys.stderr)
        sys.exit(1)
