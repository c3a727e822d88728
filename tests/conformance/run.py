"""Run a framework's own test suite plain and routed through `teola.optimize`; list regressions.

    python tests/conformance/run.py langchain            # fetches langchain-core's tests
    python tests/conformance/run.py langgraph -- tests/test_pregel.py   # these paths instead of the suite's
    python tests/conformance/run.py llamaindex            # the line installed (0.12 or 0.14)

Each suite runs twice in fresh pytest processes with the same interpreter: once with its
`route_<suite>` plugin in record mode (calls go to the original; results recorded), once
routed (top-level calls go to `teola.optimize(obj)`; results recorded). A regression is a
test that passed plain and did not pass routed, or a routed call whose result differs from
the plain run's (the differential mode), and that does so again when those tests are run
once more in both modes (some of the suites' own tests depend on timing). Known, by-design
differences live in `known_differences.py` with their reason; anything else fails the run
(exit 1).
The suites' own test dependencies are installed by `--install` (CI does this).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
# LlamaIndex's release tests are not on the registry: a shared copy beside the checkout,
# or wherever $TEOLA_CONFORMANCE_DIR points (a folder holding llama_index/v0.12.52/... and v0.14.13/...).
SHARED = Path(os.environ.get("TEOLA_CONFORMANCE_DIR") or HERE.parents[2] / "shared" / "conformance")


@dataclass(frozen=True)
class Suite:
    """Where a framework's tests come from and how to run them."""

    name: str
    distribution: str  # whose source release (or shared copy) holds the tests
    paths: tuple[str, ...]  # test paths inside the source tree
    test_requirements: tuple[str, ...]
    pytest_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


class Unavailable(Exception):
    """The suite's tests are not here (the run is skipped, with this reason)."""


def _llamaindex_paths() -> tuple[str, ...]:
    common = (
        "tests/query_engine",
        "tests/response_synthesizers",
        "tests/indices/query",
        "tests/indices/struct_store",
        "tests/indices/test_loading_graph.py",
        "tests/chat_engine/test_condense_question.py",
        "tests/token_predictor",
        "tests/tools/test_query_engine_tool.py",
        "tests/tools/test_eval_query_engine_tool.py",
        "tests/tools/tool_spec/test_load_and_search.py",
    )
    if _version("llama-index-core").startswith("0.12"):
        return ("tests/query_pipeline", *common, "tests/agent/custom")
    return common


def _llamaindex() -> Suite:
    """The release-commit tests of the installed llama-index-core line (0.12 or 0.14)."""
    try:
        spec = importlib.util.find_spec("llama_index.core")
    except ModuleNotFoundError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("llama-index-core is not installed")
    package = Path(next(iter(spec.submodule_search_locations)))
    # Offline, NLTK must find the data llama-index-core ships: 0.12 appends `_static/nltk_cache`
    # to $NLTK_DATA itself, 0.14 takes the folder as it is.
    nltk = package if _version("llama-index-core").startswith("0.12") else package / "_static" / "nltk_cache"
    return Suite(
        name="llamaindex",
        distribution="llama-index-core",
        paths=_llamaindex_paths(),
        test_requirements=("pytest-asyncio>=0.23",),
        env={"NLTK_DATA": str(nltk)},
    )


SUITES: dict[str, Suite | Callable[[], Suite]] = {
    "langchain": Suite(
        name="langchain",
        distribution="langchain-core",
        paths=("tests/unit_tests/runnables",),
        test_requirements=(
            "syrupy>=5,<6",
            "pytest-asyncio>=1.3,<2",
            "freezegun>=1.2.2",
            "pytest-mock>=3.10",
            "blockbuster>=1.5.18,<1.6",
            "responses>=0.25",
            "pytest-socket>=0.7,<0.9",
            "grandalf>=0.8",
        ),
    ),
    "llamaindex": _llamaindex,
    "langgraph": Suite(
        name="langgraph",
        distribution="langgraph",
        paths=("tests",),  # every file: the ones needing Docker select themselves out below
        test_requirements=(
            "pytest-mock>=3.10",
            "syrupy>=6,<7",
            "pytest-timeout>=2.3",
            "pycryptodome>=3",
            # imported by the suite's conftests (their parametrizations are deselected below)
            "redis>=5",
            "langgraph-checkpoint-sqlite>=3.1,<4",
            "langgraph-checkpoint-postgres>=3.2,<4",
            "psycopg[binary]>=3.1",
            "psycopg-pool>=3.2",
        ),
        pytest_args=("-k", "not sqlite and not postgres and not redis", "--timeout=300"),
        env={"NO_DOCKER": "true"},
    ),
}


def _version(distribution: str) -> str:
    return importlib.metadata.version(distribution)


def fetch_source(suite: Suite, cache: Path) -> Path:
    """The source tree holding the suite's tests, for the installed version of its package."""
    version = _version(suite.distribution)
    if suite.name == "llamaindex":  # the registry's packages ship no tests: a shared copy of the release's
        line = "v0.12.52" if version.startswith("0.12") else "v0.14.13"
        tree = SHARED / "llama_index" / line / "llama-index-core"
        if not tree.is_dir():
            raise Unavailable(
                f"LlamaIndex's tests are not at {tree} "
                "(set TEOLA_CONFORMANCE_DIR to the folder holding llama_index/, or pass --source)"
            )
        return tree
    stem = f"{suite.distribution.replace('-', '_')}-{version}"
    tree = cache / stem
    if tree.is_dir():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    spec = f"{suite.distribution}=={version}"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(cache), spec],
        check=True,
    )
    (archive,) = [p for p in cache.glob("*.tar.gz") if p.name.lower().startswith(stem.lower())]
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter="data")
    return tree


@dataclass
class Run:
    outcomes: dict[str, str]  # test id -> passed / failed / skipped
    records: dict[str, list[dict[str, object]]]  # test id -> recorded calls, in order


def run_pytest(
    suite: Suite, tree: Path, mode: str, workdir: Path, extra: list[str], options: str = "{}", tag: str = ""
) -> Run:
    report = workdir / f"{suite.name}-{mode}{tag}.xml"
    records = workdir / f"{suite.name}-{mode}{tag}.jsonl"
    records.unlink(missing_ok=True)
    env = {
        **os.environ,
        **suite.env,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(tree), os.environ.get("PYTHONPATH", "")]),
        "TEOLA_CONFORMANCE_MODE": mode,
        "TEOLA_CONFORMANCE_OPTIONS": options,
        "TEOLA_CONFORMANCE_RECORDS": str(records),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", f"route_{suite.name}"]
    chosen = [a for a in extra if not a.startswith("-") and (tree / a.split("::")[0]).exists()]  # test paths given
    options = [a for a in extra if a not in chosen]
    command += ["-o", "addopts=", f"--junitxml={report}", *suite.pytest_args, *(chosen or suite.paths), *options]
    log = workdir / f"{suite.name}-{mode}{tag}.log"
    print(f"== conformance {suite.name} ({mode}): {' '.join(command[3:])} > {log}", flush=True)
    with log.open("w") as out:
        subprocess.run(command, cwd=tree, env=env, check=False, stdout=out, stderr=subprocess.STDOUT)
    lines = log.read_text().strip().splitlines()
    print(f"   {lines[-1] if lines else '(no output)'}", flush=True)
    return Run(_outcomes(report), _records(records))


def _outcomes(report: Path) -> dict[str, str]:
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        outcomes[test] = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
    return outcomes


def _records(path: Path) -> dict[str, list[dict[str, object]]]:
    calls: dict[str, list[dict[str, object]]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            calls.setdefault(record["test"], []).append(record)
    return calls


def _node_id(tree: Path, test: str) -> str:
    """The pytest node id of a JUnit test name (`pkg.module.Class::name` -> `pkg/module.py::Class::name`)."""
    classname, name = test.split("::", 1)
    parts = classname.split(".")
    for k in range(len(parts), 0, -1):
        path = "/".join(parts[:k]) + ".py"
        if (tree / path).exists():
            return "::".join([path, *parts[k:], name])
    raise ValueError(f"conformance: no test file for {test!r} under {tree}")


def compare(plain: Run, routed: Run) -> tuple[list[str], list[str]]:
    """(tests that regressed, tests whose routed results differ from plain)."""
    regressed = [t for t, o in plain.outcomes.items() if o == "passed" and routed.outcomes.get(t) != "passed"]
    differing = []
    for test, calls in plain.records.items():
        if routed.outcomes.get(test) != "passed":
            continue
        theirs = [c["result"] for c in routed.records.get(test, [])]
        if [c["result"] for c in calls] != theirs:
            differing.append(test)
    return regressed, differing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=sorted(SUITES), help="whose test suite to run")
    parser.add_argument("--install", action="store_true", help="pip install the suite's test dependencies first")
    parser.add_argument("--workdir", type=Path, default=None, help="where sources and reports go (default: a temp dir)")
    parser.add_argument(
        "--options", default="{}", help='options for teola.optimize, as JSON (e.g. \'{"execution": "graph"}\')'
    )
    parser.add_argument("--source", type=Path, default=None, help="a source tree holding the suite's tests to use")
    parser.add_argument("--least-passed", type=int, default=0, help="fail if fewer tests than this pass plain")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    try:
        entry = SUITES[args.suite]
        suite = entry if isinstance(entry, Suite) else entry()
        if args.install:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", *suite.test_requirements], check=True)
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="teola-conformance-"))
        workdir.mkdir(parents=True, exist_ok=True)
        tree = args.source or fetch_source(suite, workdir / "sources")
    except Unavailable as exc:
        print(f"== conformance {args.suite}: skipped: {exc}")
        return 0
    plain = run_pytest(suite, tree, "record", workdir, args.pytest_args)
    routed = run_pytest(suite, tree, "route", workdir, args.pytest_args, args.options)
    from known_differences import KNOWN

    known = KNOWN.get(suite.name, {})
    regressed, differing = compare(plain, routed)
    flagged = sorted(set(regressed) | set(differing))
    if flagged:  # a difference counts only if it shows again: some of the suites' own tests are timing-dependent
        ids = [_node_id(tree, test) for test in flagged]
        options = [a for a in args.pytest_args if a.startswith("-")]
        again = compare(
            run_pytest(suite, tree, "record", workdir, [*ids, *options], tag="-rerun"),
            run_pytest(suite, tree, "route", workdir, [*ids, *options], tag="-rerun"),
        )
        for test in flagged:
            if test not in again[0] and test not in again[1]:
                print(f"   flaky, not counted (passed and agreed on a rerun): {test}")
        regressed, differing = [t for t in regressed if t in again[0]], [t for t in differing if t in again[1]]
    calls = sum(len(c) for c in routed.records.values())
    reached = sum(1 for cs in routed.records.values() for c in cs if c.get("teola"))
    passed = sum(1 for o in plain.outcomes.values() if o == "passed")
    print(f"== conformance {suite.name}: {passed} tests pass plain; {calls} routed calls, {reached} on Teola's graph")
    failures = 0
    for title, tests in (("regressed", regressed), ("results differ", differing)):
        for test in tests:
            reason = known.get(test)
            print(f"   {title}: {test}" + (f"  (known: {reason})" if reason else ""))
            failures += reason is None
    print(f"== conformance {suite.name}: {failures} unexplained difference(s)")
    if passed < args.least_passed:
        print(f"== conformance {suite.name}: only {passed} tests pass plain, expected at least {args.least_passed}")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
