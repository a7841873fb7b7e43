#!/usr/bin/env python3
"""Tables and plots of a docs/regenerate.sh matrix, over its seeds.

Reads OUT/jobs.tsv (name, group, data set, seed, edgetrain-sim arguments), each job's
OUT/jobs/NAME/sim.csv and OUT/machine.json; writes OUT/results.md (the section that
docs/regenerate.sh --update-docs puts into docs/results.md), OUT/tables/*.csv (one row per
setting, method and seed) and OUT/figures/*.svg (drawn by edgetrain-emulation-report plot).

Each figure is a mean over seeds with its sample standard deviation ("97.10 ± 0.12"). The
target accuracy of a data set is ASGD's best accuracy in the paper's setting (10 workers,
methods group), averaged over seeds, minus 0.3 points (the issue's "same accuracy as ASGD
within 0.3 points"). A ratio divides the ingress the same seed's ASGD run needed to reach the
target by the ingress of the run in the row; seeds that never reach it are counted apart.
Standard library only.
"""
import argparse
import csv
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
    parser.add_argument("--out", required=True, help="the directory docs/regenerate.sh wrote")
    parser.add_argument("--report", required=True, help="the edgetrain-emulation-report program (for the plots)")
    args = parser.parse_args()
    machine = json.load(open(os.path.join(args.out, "machine.json")))
    jobs = read_jobs(args.out)
    os.makedirs(os.path.join(args.out, "tables"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "figures"), exist_ok=True)

    runs = []  # one per (job, method in its sim.csv)
    for job in jobs:
        path = os.path.join(args.out, "jobs", job["name"], "sim.csv")
        if not os.path.exists(path):
            continue  # failed or not run: the tables say how many seeds they hold
        for method, curve in read_curves(path).items():
            runs.append(dict(job, method=method, curve=curve))

    # The reference of each (data set, seed): ASGD of the paper's setting; of the workers and
    # speeds groups: the same job's ASGD run.
    def asgd_of(run):
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
            targets[data] = math.floor((statistics.fmean(bests) - 0.003) * 1000) / 1000

    lines = []
    lines.append("## The simulator's experiments, regenerated (issue 13)\n")
    lines.append(
        f"Made by `docs/regenerate.sh{' --quick' if machine['quick'] else ''}` at commit `{machine['commit'][:12]}`"
        f"{' (with uncommitted changes)' if machine['dirty'] else ''} on {machine['date'][:10]}, on a {machine['cores']}-core "
        f"{machine['cpu']} ({machine['isa']}); {machine['seeds']} seed(s) per setting, {machine['updates']} applied "
        "updates per run, batch 10, lr 0.1, D = 256. Figures are means over the seeds ± their standard deviation. "
        "Bytes are the paper's count: the encoded update payloads the workers send (the wire codec, "
        "`transport/CODEC.md`); what reaches the server's socket (DTLS, CoAP, pulls) is the emulator's count "
        "(below). The target of a data set is ASGD's mean best accuracy in the paper's setting minus 0.3 points; "
        "\"ASGD / this\" divides the ingress the same seed's ASGD run needed to reach it by this run's. XNNPACK "
        "chooses its kernels by the CPU, so another machine repeats these figures closely, not bit for bit.\n")
    table_rows = []
    for group in [g for g in GROUP_TITLES if any(j["group"] == g for j in jobs)]:
        lines.append(f"### {GROUP_TITLES[group]}\n")
        for data in [d for d in DATA_TITLES if any(j["data"] == d and j["group"] == group for j in jobs)] + \
                sorted({j["data"] for j in jobs if j["data"] not in DATA_TITLES and j["group"] == group}):
            target = targets.get(data)
            seeds = sorted({j["seed"] for j in jobs if j["data"] == data and j["group"] == group})
            lines.append(f"{DATA_TITLES.get(data, data)}, target {target * 100:.1f}%:\n" if target is not None
                         else f"{DATA_TITLES.get(data, data)} (no ASGD reference run: no target):\n")
            lines.append("| setting | method | best acc % | final acc % | bytes / update | updates to target | "
                         "ingress to target | ASGD / this |")
            lines.append("|---|---|---|---|---|---|---|---|")
            keys = []
            for r in runs:
                if r["group"] == group and r["data"] == data and (r["setting"], r["method"]) not in keys:
                    keys.append((r["setting"], r["method"]))
            for setting, method in keys:
                same = [r for r in runs if r["group"] == group and r["data"] == data and r["setting"] == setting
                        and r["method"] == method]
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
                lines.append(f"| {setting} | {method} | {mean_sd(bests, 100)} | {mean_sd(finals, 100)} | "
                             f"{human_bytes(statistics.fmean(per_update))} | {updates_cell} | {bytes_cell} | {ratio_cell} |")
            lines.append(f"\nSeeds: {', '.join(map(str, seeds))}. Commands: `{args.out}/jobs/<setting>-{data}-s<seed>/command`.\n")
            figure = plot_group(args, group, data, runs, target)
            if figure:
                lines.append(f"![{GROUP_TITLES[group]}, {DATA_TITLES.get(data, data)}](figures/{figure})\n")

    with open(os.path.join(args.out, "tables", "runs.csv"), "w", newline="") as f:
        if table_rows:
            writer = csv.DictWriter(f, fieldnames=list(table_rows[0].keys()))
            writer.writeheader()
            writer.writerows(table_rows)
    lines.append("Every run's curve: `sim.csv` in its job directory; every row of the tables above, per seed: "
                 "`tables/runs.csv`.\n")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines))


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
