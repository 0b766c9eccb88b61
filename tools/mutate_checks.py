"""Mutation sampling of the checks' core: do the tests fail when the code that judges reads and writes is wrong?

    python tools/mutate_checks.py                       # every mutation, against the checks' tests
    python tools/mutate_checks.py --ignore tests/analysis/test_copies.py   # as if that file did not exist
    python tools/mutate_checks.py --deselect tests/test_bugs.py::test_x    # as if that test did not exist
    python tools/mutate_checks.py --only memory.lo      # one mutation, by its name

Each mutation is one realistic slip in ``analysis/memory.py``, ``operators.py``, ``inplace.py`` or
``checked_call.py`` (an off-by-one in a byte span, a read taken for a write, a schema alias
dropped, a copy's new memory taken for what it copies, ...): a single text replaced in one file.
For each, the tool copies ``src/`` to a temporary folder, applies the replacement there (the
working tree is never touched), and runs the checks' tests against the copy with ``-x``. A
mutation is *killed* when some test fails, and *survives* when they all pass. It prints one row
per mutation and exits 1 if any survived.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, NamedTuple, Sequence

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path("src/swpipeline/analysis")
TESTS = ["tests/analysis", "tests/shortcut", "tests/training", "tests/test_bugs.py"]


class Mutation(NamedTuple):
    name: str
    file: str  # in src/swpipeline/analysis
    old: str  # occurs exactly once in the file
    new: str
    what: str


MUTATIONS: List[Mutation] = [
    Mutation("memory.hi", "memory.py", "return Region(key, lo, lo + extent * size, shape, stride, size)",
             "return Region(key, lo, lo + extent * size - 1, shape, stride, size)",
             "a region's span ends one byte short"),
    Mutation("memory.lo", "memory.py", "lo = int(tensor.storage_offset()) * size", "lo = 0 * size",
             "a view's span starts at its storage's start, not at its offset"),
    Mutation("memory.adjacent", "memory.py", "if a.storage != b.storage or a.hi <= b.lo or b.hi <= a.lo:",
             "if a.storage != b.storage or a.hi < b.lo or b.hi < a.lo:",
             "spans that only touch are taken to share a byte"),
    Mutation("memory.dense", "memory.py", "return self.hi - self.lo == math.prod(self.shape) * self.itemsize",
             "return self.hi - self.lo >= math.prod(self.shape) * self.itemsize",
             "every strided view is taken as dense (columns meet)"),
    Mutation("memory.byte", "memory.py", "for byte in range(size):", "for byte in range(1):",
             "interleaved views compare only each element's first byte"),
    Mutation("memory.key", "memory.py", "return int(tensor.untyped_storage()._cdata)", "return int(tensor.data_ptr())",
             "a storage is known by the tensor's data pointer (views at an offset are other storages)"),
    Mutation("memory.index", "memory.py", "            if region == found:\n                return known",
             "            if region.storage == found.storage:\n                return known",
             "two names in one storage are taken as one name"),
    Mutation("operators.swap", "operators.py",
             "tuple((k, arg.name) for k, arg in arguments if arg.alias_info is None),\n"
             "            tuple((k, arg.name) for k, arg in arguments if arg.alias_info is not None and "
             "arg.alias_info.is_write),",
             "tuple((k, arg.name) for k, arg in arguments if arg.alias_info is not None and "
             "arg.alias_info.is_write),\n"
             "            tuple((k, arg.name) for k, arg in arguments if arg.alias_info is None),",
             "the schema's read and written arguments swapped"),
    Mutation("operators.alias", "operators.py",
             "tuple((k, arg.name) for k, arg in arguments if arg.alias_info is None),",
             "tuple((k, arg.name) for k, arg in arguments),",
             "a schema alias dropped: a view's base (or a written argument) counted as read"),
    Mutation("operators.write_alias", "operators.py", "if arg.alias_info is not None and arg.alias_info.is_write),",
             "if arg.alias_info is not None),", "every aliased argument taken as written (a view writes its base)"),
    Mutation("operators.after", "operators.py", "                self.wrote(tensor, region)",
             "                self.wrote(tensor, region_of(tensor))",
             "the memory written is looked up after the call (a copy's new tensor taken for what it copied)"),
    Mutation("operators.rebind", "operators.py", '_REBINDING = frozenset({"set_"})', "_REBINDING = frozenset()",
             "set_ taken as a write of the bytes the tensor covered"),
    Mutation("operators.lists", "operators.py",
             "        elif isinstance(value, (list, tuple)):\n"
             "            yield from (v for v in value if isinstance(v, torch.Tensor))",
             "        elif False:\n            yield",
             "the tensors of a list argument (foreach ops) not seen"),
    Mutation("operators.warn", "operators.py", "            if self.warns_before_writes:\n",
             "            if not self.warns_before_writes:\n", "writes not announced before the operator runs"),
    Mutation("operators.watched", "operators.py", "if storage_key(tensor) in watched:",
             "if storage_key(tensor) not in watched:", "reads handed on for the storages not watched"),
    Mutation("inplace.rebound", "inplace.py", "            if id(tensor) in rebound:",
             "            if id(tensor) in rebound and False:", "a rebound tensor is no write of its attribute"),
    Mutation("inplace.nesting", "inplace.py",
             "    if depth >= MAX_NESTING or not isinstance(value, WATCHED):",
             "    if depth >= 1 or not isinstance(value, WATCHED):", "tensors nested in a container not looked at"),
    Mutation("inplace.identity", "inplace.py", "all(map(operator.is_, was, now))", "all(map(operator.eq, was, now))",
             "a container's items compared by equality, not identity"),
    Mutation("inplace.reported", "inplace.py", "and storage_key(obj) not in reported",
             "and storage_key(obj) in reported", "a version that moved behind the dispatcher not reported"),
    Mutation("inplace.any", "inplace.py", "any(meet(mine, region) for region in near)",
             "all(meet(mine, region) for region in near)", "an attribute is written only if every region meets it"),
    Mutation("inplace.rewatch", "inplace.py", "        if key not in self._watched:\n",
             "        if True:\n", "a value read twice is watched again (its first look forgotten)"),
    Mutation("inplace.regions", "inplace.py", "                regions.append(region)",
             "                rebound.append(tensor)", "written memory taken as rebound objects"),
    Mutation("checked_call.writing", "checked_call.py",
             "named = [region for region in regions if region is not None and region.storage in storages]",
             "named = [region for region in regions if region is not None and region.storage not in storages]",
             "a write of the named state not judged before it lands"),
    Mutation("checked_call.rebound", "checked_call.py",
             "                                     written) if self.written else []",
             "                                     written) if written.regions else []",
             "a call that only rebinds tensors changes no attribute"),
    Mutation("checked_call.containers", "checked_call.py", "            changed += self.values.changed()",
             "            changed += []", "a container changed in place is no write"),
    Mutation("checked_call.compare", "checked_call.py",
             "            entries.append(access)\n            self.checker._compare(self.log, name, entries, access)",
             "            entries.append(access)", "an access through the journal is logged but never compared"),
    Mutation("checked_call.setattr", "checked_call.py", "            if len(entries) > 1 or EVERY in log:",
             "            if len(entries) > 2 or EVERY in log:", "an assignment after one other access not compared"),
    Mutation("checked_call.state_reads", "checked_call.py",
             "        if self.state_reads is None:\n            self.state_reads = []",
             "        if self.state_reads is None:\n            return",
             "reads of the named state dropped"),
    Mutation("checked_call.unit", "checked_call.py",
             "if other_kind != READ and other != unit and", "if other_kind != READ and other == unit and",
             "a read compared only with its own unit's writes"),
]


def apply(mutation: Mutation, src: Path) -> None:
    """Replace the mutation's text in the copy under ``src`` (it must occur exactly once)."""
    path = src / "swpipeline" / "analysis" / mutation.file
    text = path.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(f"{mutation.name}: its text occurs {text.count(mutation.old)} times in {mutation.file}, "
                         "not once: update the mutation to the code")
    path.write_text(text.replace(mutation.old, mutation.new))


def killed(mutation: Mutation, tests: Sequence[str], left_out: Sequence[str]) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        src = Path(folder) / "src"
        shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
        apply(mutation, src)
        env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests, *left_out]
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return done.returncode != 0


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ignore", action="append", default=[], help="a test path to leave out (repeatable)")
    parser.add_argument("--deselect", action="append", default=[], help="a test's node id to leave out (repeatable)")
    parser.add_argument("--only", action="append", default=[], help="a mutation's name (repeatable)")
    args = parser.parse_args(list(argv) or None)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    print(f"{'mutation':24} {'verdict':8} {'s':>5}  what it breaks")
    survivors = 0
    for mutation in chosen:
        start = time.monotonic()
        left_out = [*(f"--ignore={path}" for path in args.ignore), *(f"--deselect={node}" for node in args.deselect)]
        verdict = "killed" if killed(mutation, TESTS, left_out) else "SURVIVED"
        survivors += verdict == "SURVIVED"
        print(f"{mutation.name:24} {verdict:8} {time.monotonic() - start:5.0f}  {mutation.what}", flush=True)
    print(f"{len(chosen) - survivors} of {len(chosen)} killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
