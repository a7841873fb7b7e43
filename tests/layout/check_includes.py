#!/usr/bin/env python3
"""Checks every #include of the tree's C and C++ files against the layout table of the
top-level README.md (section "Layout"), the one place the module rules are written.

How the table reads (README.md says the same under the table):
  - the first column names the one folder a row governs (`dir/`: every file below it); a
    row that names files or a list of stems is refused: a folder is one module;
  - the last column ("may depend on") lists, `backticked` in the same syntax, what the
    row's files may include besides the row's own files; "everything" allows all;
    anything else in that column ("nothing of ours", remarks) is for people.
An include counts when it names a file of the repository: "x/..." from the root, or a
name next to the including file. Every violation is printed as file:line with the rule,
and the exit status is 1.

It also holds the programs thin: a file of programs/ has at most PROGRAM_LINES lines, but
for those LONG_PROGRAMS names, which may not grow past the length they had when the rule
came and leave the list once they are short. Usage: check_includes.py [--no-long-programs] [REPOSITORY_ROOT]
"""
import os
import re
import subprocess
import sys

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hh", ".hpp")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
TOKEN = re.compile(r"`([^`]+)`")

PROGRAM_LINES = 300
# Programs longer than PROGRAM_LINES when the rule came (issue 34), with that length: a
# ratchet, not a licence. Each entry goes when its program is thinned below the limit; the
# last one (sim_main.cc) went in issue 34 part 2, and the list stays for the mechanism.
LONG_PROGRAMS = {}


class Pattern:
    """One `backticked` path of the table."""

    def __init__(self, text):
        self.text = text
        brace = re.fullmatch(r"(.*/)\{([^}]*)\}", text)
        if brace:
            self.kind, self.folder = "stems", brace.group(1)
            self.stems = [s.strip() for s in brace.group(2).split(",") if s.strip()]
        elif text.endswith("/"):
            self.kind, self.folder = "folder", text
        else:
            self.kind, self.folder = "file", os.path.dirname(text) + "/"

    def matches(self, path):
        if self.kind == "folder":
            return path.startswith(self.folder)
        if self.kind == "file":
            return path == self.text
        folder, name = os.path.dirname(path) + "/", os.path.basename(path)
        return folder == self.folder and name.split(".")[0] in self.stems

    def specificity(self):
        return 0 if self.kind == "folder" else 1

    def missing_files(self, root):
        """Names of the table that match no file (a renamed file must not pass silently)."""
        if self.kind == "folder":
            return [] if os.path.isdir(os.path.join(root, self.folder)) else [self.text]
        if self.kind == "file":
            return [] if os.path.isfile(os.path.join(root, self.text)) else [self.text]
        present = set()
        directory = os.path.join(root, self.folder)
        if os.path.isdir(directory):
            present = {name.split(".")[0] for name in os.listdir(directory)}
        return [self.folder + stem for stem in self.stems if stem not in present]


class Row:
    def __init__(self, line_number, governs, allowed, everything, text):
        self.line_number, self.governs, self.allowed, self.everything, self.text = (
            line_number, governs, allowed, everything, text)

    def may_include(self, path):
        if self.everything:
            return True
        return any(p.matches(path) for p in self.governs + self.allowed)

    def rule(self):
        names = [p.text for p in self.allowed]
        own = ", ".join(p.text for p in self.governs)
        return "%s may include itself and %s" % (own, ", ".join(names) if names else "nothing of ours")


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def read_table(readme):
    """The rows of the first table under a "## Layout" heading."""
    rows, in_layout, in_table = [], False, False
    with open(readme, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("## "):
                if in_table:
                    break
                in_layout = line.strip() == "## Layout"
                continue
            if not in_layout:
                continue
            if not line.lstrip().startswith("|"):
                if in_table:
                    break
                continue
            row = cells(line)
            if not in_table:  # the header row, then the |---| row
                in_table = True
                header = [c.lower() for c in row]
                if header[-1] != "may depend on":
                    sys.exit("%s:%d: the layout table's last column must be 'may depend on', not '%s'"
                             % (readme, number, row[-1]))
                continue
            if set(row[0]) <= set("-: "):
                continue
            governs = [Pattern(t) for t in TOKEN.findall(row[0]) if "/" in t]
            allowed = [Pattern(t) for t in TOKEN.findall(row[-1]) if "/" in t]
            if len(governs) != 1 or governs[0].kind != "folder":
                sys.exit("%s:%d: a layout row names one folder (`dir/`) in its first column, never files or "
                         "a list of stems: %s" % (readme, number, row[0]))
            rows.append(Row(number, governs, allowed, "everything" in row[-1].lower(), row[0]))
    if not rows:
        sys.exit("%s: no layout table under '## Layout'" % readme)
    return rows


def source_files(root):
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                                check=True, capture_output=True, text=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        listed = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "build"]
            listed += [os.path.relpath(os.path.join(folder, f), root) for f in files]
    return sorted(p for p in listed if p.endswith(SOURCE_SUFFIXES) and os.path.isfile(os.path.join(root, p)))


def governing_row(rows, path):
    best = None
    for row in rows:
        for pattern in row.governs:
            if pattern.matches(path) and (best is None or pattern.specificity() > best[0]):
                best = (pattern.specificity(), row)
    return best[1] if best else None


def resolve(root, including, target):
    """The repository path an include names, or None when it is not one of ours."""
    beside = os.path.normpath(os.path.join(os.path.dirname(including), target))
    if "/" not in target and os.path.isfile(os.path.join(root, beside)):
        return beside
    top = target.split("/")[0]
    if "/" in target and os.path.isdir(os.path.join(root, top)) and not top.startswith("."):
        return os.path.normpath(target)
    return None


def program_length_problems(root):
    problems = []
    folder = os.path.join(root, "programs")
    names = sorted(n for n in os.listdir(folder) if n.endswith(SOURCE_SUFFIXES)) if os.path.isdir(folder) else []
    for name in names:
        path = "programs/" + name
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            lines = sum(1 for _ in f)
        ceiling = LONG_PROGRAMS.get(path)
        if ceiling is None and lines > PROGRAM_LINES:
            problems.append("%s:%d: a program has at most %d lines (README.md, Layout): move what it computes "
                            "into its library" % (path, lines, PROGRAM_LINES))
        elif ceiling is not None and lines > ceiling:
            problems.append("%s:%d: this long program may shrink, never grow past its %d lines (LONG_PROGRAMS in %s)"
                            % (path, lines, ceiling, os.path.relpath(__file__, root)))
        elif ceiling is not None and lines <= PROGRAM_LINES:
            problems.append("%s:%d: now under %d lines: remove it from LONG_PROGRAMS in %s"
                            % (path, lines, PROGRAM_LINES, os.path.relpath(__file__, root)))
    for path in LONG_PROGRAMS:
        if path[len("programs/"):] not in names:
            problems.append("%s: named in LONG_PROGRAMS but not there" % path)
    return problems


def main():
    args = sys.argv[1:]
    if "--no-long-programs" in args:  # a tree of the check's own test, which has none of ours
        args.remove("--no-long-programs")
        LONG_PROGRAMS.clear()
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), "..", ".."))
    readme = os.path.join(root, "README.md")
    rows = read_table(readme)
    problems = []
    for row in rows:
        for pattern in row.governs + row.allowed:
            for missing in pattern.missing_files(root):
                problems.append("README.md:%d: the layout table names %s, which does not exist"
                                % (row.line_number, missing))
    for path in source_files(root):
        row = governing_row(rows, path)
        if row is None:
            problems.append("%s:1: no row of the layout table (README.md, Layout) covers this file" % path)
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                target = match.group(2)
                if ".." in target.split("/"):
                    problems.append('%s:%d: #include "%s" climbs out of its folder: name it from the root'
                                    % (path, number, target))
                    continue
                included = resolve(root, path, target)
                if included is None or row.may_include(included):
                    continue
                problems.append("%s:%d: includes %s, but the layout table (README.md:%d) says %s"
                                % (path, number, included, row.line_number, row.rule()))
    problems += program_length_problems(root)
    for problem in problems:
        print(problem)
    if problems:
        print("include_layout: %d violation(s) of the module rules" % len(problems))
        return 1
    print("include_layout: every #include of %d files obeys README.md's layout table" % len(source_files(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
