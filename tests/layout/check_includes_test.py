#!/usr/bin/env python3
"""The include check's own rules, on small repositories made in a temporary folder: that it
refuses a table row naming files, an include its table forbids, a program over the limit
and a long program that grew, and passes a tree that keeps them."""
import os
import subprocess
import sys
import tempfile
import unittest

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_includes.py")

TABLE = """# x

## Layout

| folder | what | may depend on |
|---|---|---|
{rows}
"""


def make_tree(root, rows, files):
    with open(os.path.join(root, "README.md"), "w") as f:
        f.write(TABLE.format(rows="\n".join(rows)))
    for path, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)


def run(root):
    done = subprocess.run([sys.executable, CHECK, "--no-long-programs", root], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


ROWS = ["| `lib/` | a library | nothing of ours |", "| `programs/` | programs | `lib/` |"]


class CheckIncludesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def test_a_tree_that_keeps_the_rules_passes(self):
        make_tree(self.root, ROWS, {"lib/a.h": "#pragma once\n", "programs/p.cc": '#include "lib/a.h"\n'})
        code, out = run(self.root)
        self.assertEqual(code, 0, out)

    def test_a_row_naming_stems_is_refused(self):
        make_tree(self.root, ["| `lib/{a,b}` | stems | nothing of ours |"] + ROWS[1:], {"lib/a.h": ""})
        code, out = run(self.root)
        self.assertNotEqual(code, 0)
        self.assertIn("names one folder", out)

    def test_a_forbidden_include_is_reported_with_its_line(self):
        make_tree(self.root, ROWS, {"lib/a.h": '\n#include "programs/p.h"\n', "programs/p.h": ""})
        code, out = run(self.root)
        self.assertEqual(code, 1)
        self.assertIn("lib/a.h:2: includes programs/p.h", out)

    def test_a_program_over_the_limit_fails(self):
        make_tree(self.root, ROWS, {"lib/a.h": "", "programs/p.cc": "int x;\n" * 301})
        code, out = run(self.root)
        self.assertEqual(code, 1)
        self.assertIn("programs/p.cc:301: a program has at most 300 lines", out)


if __name__ == "__main__":
    unittest.main()
