"""Conformance corpus: real third-party pytest suites, plain pytest against devpool, test by test.

    python tests/conformance/corpus.py [--all | --ci | NAME...] [--mutated | --both] [--keep DIR]

For each project of manifest.toml: fetch its sdist with pip (cached under
~/.cache/devpool-conformance, or $DEVPOOL_CONFORMANCE_CACHE), check its sha256, unpack it, give
it a venv of its own for its pinned test dependencies (--system-site-packages: pytest, devpool
and every other plugin come from this environment), then run its suite twice, each time in a
fresh copy of the unpacked tree:

    A  python -m pytest -p no:cacheprovider -p no:devpool ... --junitxml=A.xml
    B  python -m pytest -p no:cacheprovider --devices sim:0-1 --devpool-lock-dir=TMP
       ... --junitxml=B.xml

and compare per test (JUnit testcase keyed by (classname, name): passed / failed / error /
skipped / xfailed, the set of them where a testcase has several) and the counts of the closing
line (passed, failed, errors, skipped, xfailed, xpassed, warnings, ...; the time ignored).
Prints a readable diff; exits 1 on any difference, 2 when something could not be run.

What is held equal between A and B, so that only devpool differs: the same interpreter and
venv, the same environment (PYTEST_ADDOPTS, PYTEST_PLUGINS, DEVPOOL_*, coverage's and xdist's
variables removed; PYTHONHASHSEED=0, no colour), the same pytest arguments, plugins that
reorder or reseed (pytest-randomly, pytest-random-order) blocked in both, and a fresh tree for
each run (no .pytest_cache, .hypothesis, .devpool, __pycache__ left by the other).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.toml"
DEVICES = "sim:0-1"

# Plugins that change test order or global random state from run to run: blocked in both runs
# when installed (a `-p no:NAME` for each entry-point name found).
ORDER_PLUGINS = ("randomly", "random_order", "pytest_random_order")
# Variables that would make the two runs differ, or let an outer pytest/devpool leak in.
SCRUBBED_ENV = (
    "PYTEST_ADDOPTS",
    "PYTEST_PLUGINS",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
    "PYTEST_CURRENT_TEST",
    "PYTEST_VERSION",
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
    "PYTEST_XDIST_AUTO_NUM_WORKERS",
    "COVERAGE_PROCESS_START",
    "COVERAGE_PROCESS_CONFIG",
    "COVERAGE_FILE",
    "COVERAGE_RCFILE",
    "PYTHONSTARTUP",
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "PYTHONDEVMODE",
    "PYTHONTRACEMALLOC",
    "PYTHONASYNCIODEBUG",
    "HYPOTHESIS_PROFILE",
    "VIRTUAL_ENV",
    "FORCE_COLOR",
)
SCRUBBED_PREFIXES = ("DEVPOOL_", "COV_CORE_", "PYTEST_RANDOMLY")
# pip failures that mean "the package index cannot be reached" (not "the pin is wrong").
UNREACHABLE_MARKERS = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "Could not fetch URL",
    "No route to host",
)


class CorpusError(Exception):
    """Something needed for a comparison could not be had (bad pin, failed install, ...)."""


class IndexUnreachable(CorpusError):
    """The package index could not be reached (and nothing needed was cached)."""


@dataclass(frozen=True)
class Mutation:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Project:
    name: str
    version: str
    sha256: str
    deps: tuple[str, ...]
    pythonpath: str
    pytest_args: tuple[str, ...]
    mutation: Mutation
    ci: bool = False
    timeout: float = 600.0
    covers: tuple[str, ...] = ()

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


def load_manifest(path: Path = MANIFEST) -> list[Project]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    projects = []
    for entry in data.get("project", []):
        m = entry["mutation"]
        projects.append(
            Project(
                name=entry["name"],
                version=entry["version"],
                sha256=entry["sha256"].lower(),
                deps=tuple(entry.get("deps", ())),
                pythonpath=entry.get("pythonpath", "."),
                pytest_args=tuple(entry.get("pytest_args", ())),
                mutation=Mutation(m["path"], m["old"], m["new"]),
                ci=bool(entry.get("ci", False)),
                timeout=float(entry.get("timeout", 600)),
                covers=tuple(entry.get("covers", ())),
            )
        )
    names = [p.name for p in projects]
    if len(set(names)) != len(names):
        raise CorpusError(f"{path}: a project is named twice: {names}")
    return projects


def cache_dir() -> Path:
    root = os.environ.get("DEVPOOL_CONFORMANCE_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "devpool-conformance"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------------------------------------
# sdist, venv, tree


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip(args: Sequence[str], python: str = sys.executable, timeout: float = 900) -> None:
    """Run pip; raise IndexUnreachable or CorpusError with pip's words when it fails."""
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    if python != sys.executable:
        cmd += ["--python", python]
    cmd += [*args, "--retries", "1", "--timeout", "20"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise IndexUnreachable(f"pip did not finish in {timeout:.0f}s: {' '.join(cmd)}") from exc
    if proc.returncode != 0:
        words = (proc.stdout + proc.stderr).strip()
        tail = "\n".join(words.splitlines()[-15:])
        kind = IndexUnreachable if any(m in words for m in UNREACHABLE_MARKERS) else CorpusError
        raise kind(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")


def fetch_sdist(project: Project) -> Path:
    """The project's sdist from the cache, downloaded with pip when missing; sha256 checked."""
    folder = cache_dir() / "sdists"
    folder.mkdir(exist_ok=True)
    for cached in sorted(folder.glob(f"*-{project.version}.tar.gz")):
        if _norm(cached.name[: -len(f"-{project.version}.tar.gz")]) == _norm(project.name):
            if _sha256(cached) == project.sha256:
                return cached
            cached.unlink()  # a bad download or another upload: fetch it again, then judge
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        _pip(["download", "--no-deps", "--no-binary", ":all:", "--dest", tmp, project.pin])
        found = [p for p in Path(tmp).iterdir() if p.name.endswith((".tar.gz", ".zip"))]
        if len(found) != 1:
            raise CorpusError(f"pip download {project.pin} left {[p.name for p in found]}")
        got = _sha256(found[0])
        if got != project.sha256:
            raise CorpusError(
                f"{found[0].name}: sha256 {got}, manifest pins {project.sha256}; not used"
            )
        target = folder / found[0].name
        os.replace(found[0], target)
        return target


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_python(project: Project) -> str:
    """The interpreter of the project's venv, made (and its pinned deps installed) on first use.

    The venv sees this environment's site-packages, so pytest, devpool and the plugins are the
    ones installed here; the deps go into the venv only, shadowing nothing outside it."""
    key = hashlib.sha256(
        "\n".join([sys.executable, sys.version, *project.deps]).encode()
    ).hexdigest()[:12]
    venv = cache_dir() / "venvs" / f"{project.name}-{project.version}-{key}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists() and python.exists():
        return str(python)
    venv.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=venv.parent, prefix=f".{venv.name}-"))
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(tmp)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        if project.deps:
            _pip(["install", "--no-input", *project.deps], python=str(tmp / "bin" / "python"))
        (tmp / ".complete").write_text("\n".join(project.deps) + "\n")
        shutil.rmtree(venv, ignore_errors=True)
        try:
            os.replace(tmp, venv)  # bin/python and pyvenv.cfg do not name the folder
        except OSError:
            if not (venv / ".complete").exists():  # another process made it meanwhile, or not
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(python)


def unpack(project: Project, sdist: Path, dest: Path, mutated: bool) -> Path:
    """Unpack the sdist under dest; apply the mutation if asked. Returns the sdist's root."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Python before 3.10.12 / 3.11.4
            tar.extractall(dest)  # noqa: S202 - a sha256-pinned archive
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise CorpusError(f"{sdist.name}: expected one top folder, found {tops}")
    root = tops[0]
    if mutated:
        apply_mutation(root, project.mutation)
    return root


def apply_mutation(root: Path, mutation: Mutation) -> None:
    target = root / mutation.path
    if not target.is_file():
        raise CorpusError(f"mutation: {mutation.path} is not in the sdist")
    text = target.read_text(encoding="utf-8")
    count = text.count(mutation.old)
    if count != 1:
        raise CorpusError(f"mutation: {mutation.old!r} occurs {count} times in {mutation.path}")
    target.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# running pytest


def entry_point_plugins(python: str) -> list[str]:
    """Names of the pytest11 entry points the given interpreter would load."""
    code = (
        "import importlib.metadata as m\n"
        "print('\\n'.join(sorted({e.name for e in m.entry_points(group='pytest11')})))"
    )
    out = subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=run_env({}),
        timeout=120,
    )
    return out.stdout.split()


def run_env(extra: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if k not in SCRUBBED_ENV and not k.startswith(SCRUBBED_PREFIXES)
    }
    env.update(
        PYTHONHASHSEED="0",
        PY_COLORS="0",
        NO_COLOR="1",
        COLUMNS="120",
        PYTHONIOENCODING="utf-8",
        PYTHONNOUSERSITE="1",
    )
    env.update(extra)
    return env


def _devpool_path() -> list[str]:
    """The folder devpool imports from here, so the runs find it whatever PYTHONPATH says."""
    try:
        import devpool
    except ImportError:  # pragma: no cover - devpool must be installed to compare anything
        return []
    return [str(Path(devpool.__file__).resolve().parent.parent)]


@dataclass
class Case:
    outcome: str  # "passed", "failed", "error", "skipped", "xfailed" or a "+"-joined set
    message: str = ""


@dataclass
class Run:
    label: str
    command: list[str]
    returncode: int
    seconds: float
    output: str
    counts: dict[str, int] | None  # the closing line's counts, None when there was none
    closing_line: str
    cases: dict[tuple[str, str], list[Case]]
    junit_error: str = ""


def run_pytest(
    label: str,
    python: str,
    root: Path,
    project: Project,
    extra_args: Sequence[str],
    workdir: Path,
    blocked: Iterable[str],
) -> Run:
    junit = workdir / f"{label}.xml"
    log = workdir / f"{label}.log"
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider"]
    for name in blocked:
        cmd += ["-p", f"no:{name}"]
    cmd += [*extra_args, f"--junitxml={junit}", *project.pytest_args]
    pythonpath = [str((root / project.pythonpath).resolve()), *_devpool_path()]
    env = run_env({"PYTHONPATH": os.pathsep.join(pythonpath)})
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout=project.timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            returncode = -9
    seconds = time.monotonic() - start
    output = log.read_text(encoding="utf-8", errors="replace")
    if returncode == -9:
        output += f"\n[corpus] stopped after {project.timeout:.0f}s\n"
    counts, closing = parse_closing_line(output)
    cases: dict[tuple[str, str], list[Case]] = {}
    junit_error = ""
    try:
        cases = parse_junit(junit)
    except (OSError, ET.ParseError) as exc:
        junit_error = f"{junit.name}: {exc}"
    return Run(label, cmd, returncode, seconds, output, counts, closing, cases, junit_error)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """End the pytest we started, and its workers (its own process group), by its pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


_CLOSING = re.compile(
    r"^=*\s*(?P<body>(?:\d+ [a-z]+(?:, )?)+|no tests ran) in [\d.]+s(?: \([\d:.]+\))?\s*=*\s*$"
)
_CANON = {"error": "errors", "warning": "warnings", "reruns": "rerun"}


def parse_closing_line(output: str) -> tuple[dict[str, int] | None, str]:
    """pytest's last 'N passed, N failed ... in Xs' line, as {kind: count}."""
    for line in reversed(output.splitlines()):
        match = _CLOSING.match(line.strip())
        if not match:
            continue
        counts: dict[str, int] = {}
        if match["body"] != "no tests ran":
            for part in match["body"].split(", "):
                number, kind = part.split(" ", 1)
                counts[_CANON.get(kind, kind)] = int(number)
        return counts, line.strip().strip("=").strip()
    return None, ""


def parse_junit(path: Path) -> dict[tuple[str, str], list[Case]]:
    cases: dict[tuple[str, str], list[Case]] = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        kinds: set[str] = set()
        messages = []
        for child in tc:
            if child.tag in ("failure", "error"):
                kinds.add("failed" if child.tag == "failure" else "error")
            elif child.tag == "skipped":
                kinds.add("xfailed" if child.get("type") == "pytest.xfail" else "skipped")
            else:
                continue
            messages.append((child.get("message") or "").strip().splitlines()[:1])
        outcome = "+".join(sorted(kinds)) if kinds else "passed"
        message = " | ".join(m[0] for m in messages if m)
        key = (tc.get("classname", ""), tc.get("name", ""))
        cases.setdefault(key, []).append(Case(outcome, message))
    return cases


# ---------------------------------------------------------------------------------------------
# comparing


@dataclass
class Comparison:
    project: Project
    mutated: bool
    plain: Run
    devpool: Run
    differences: list[str] = field(default_factory=list)
    per_test: list[tuple[str, str, str]] = field(default_factory=list)  # test, plain, devpool

    @property
    def ok(self) -> bool:
        return not self.differences and not self.per_test

    @property
    def title(self) -> str:
        mode = "mutated" if self.mutated else "unchanged"
        return f"{self.project.pin} ({mode})"

    def report(self, examples: int = 12) -> str:
        lines = [
            f"{self.title}: {'SAME' if self.ok else 'DIFFERENT'}"
            f"  [plain {self.plain.seconds:.1f}s, devpool {self.devpool.seconds:.1f}s]",
            f"  plain  : {self.plain.closing_line or '(no closing line)'}"
            f"  (exit {self.plain.returncode})",
            f"  devpool: {self.devpool.closing_line or '(no closing line)'}"
            f"  (exit {self.devpool.returncode})",
        ]
        lines += [f"  - {d}" for d in self.differences]
        if self.per_test:
            change = Counter((a, b) for _, a, b in self.per_test)
            lines.append(f"  - {len(self.per_test)} tests differ:")
            for (a, b), n in change.most_common():
                lines.append(f"      {n:5d} x  plain {a:<14} devpool {b}")
            lines.append("    for example:")
            each = max(2, examples // len(change))
            for kind in change:
                tests = [t for t, a, b in self.per_test if (a, b) == kind]
                step = max(1, len(tests) // each)  # spread over the suite, not its first file
                for test in tests[::step][:each]:
                    a, b = kind
                    lines.append(f"      {test}")
                    lines.append(f"          plain  : {a}{_msg(self.plain, test)}")
                    lines.append(f"          devpool: {b}{_msg(self.devpool, test)}")
        if not self.ok:
            lines += _tail("devpool", self.devpool) if self.devpool.counts is None else []
        return "\n".join(lines)


def _key_text(key: tuple[str, str]) -> str:
    return f"{key[0]}::{key[1]}" if key[0] else key[1]


def _msg(run: Run, test: str) -> str:
    for key, cases in run.cases.items():
        if _key_text(key) == test:
            words = "; ".join(c.message for c in cases if c.message)
            return f"  -- {words[:240]}" if words else ""
    return ""


def _tail(label: str, run: Run, n: int = 15) -> list[str]:
    return [f"  last lines of {label}'s output:"] + [
        f"    | {line}" for line in run.output.splitlines()[-n:]
    ]


COUNT_ORDER = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed", "warnings")


def compare(project: Project, mutated: bool, plain: Run, dev: Run) -> Comparison:
    result = Comparison(project, mutated, plain, dev)
    diffs = result.differences
    if plain.returncode != dev.returncode:
        diffs.append(f"exit status: plain {plain.returncode}, devpool {dev.returncode}")
    if plain.counts is None:
        diffs.append("plain pytest printed no closing line (the reference is broken)")
    elif dev.counts is None:
        diffs.append("devpool printed no closing line")
    else:
        kinds = [k for k in COUNT_ORDER if k in plain.counts or k in dev.counts]
        kinds += sorted((set(plain.counts) | set(dev.counts)) - set(kinds))
        for kind in kinds:
            a, b = plain.counts.get(kind, 0), dev.counts.get(kind, 0)
            if a != b:
                diffs.append(f"closing line '{kind}': plain {a}, devpool {b}")
    for run in (plain, dev):
        if run.junit_error:
            diffs.append(f"{run.label}: no JUnit report ({run.junit_error})")
    if plain.junit_error or dev.junit_error:
        return result
    for key in sorted(set(plain.cases) | set(dev.cases)):
        a = _outcomes(plain.cases.get(key))
        b = _outcomes(dev.cases.get(key))
        if a != b:
            result.per_test.append((_key_text(key), a, b))
    return result


def _outcomes(cases: list[Case] | None) -> str:
    if not cases:
        return "(absent)"
    names = sorted(c.outcome for c in cases)
    return names[0] if len(names) == 1 else " / ".join(names) + f" (x{len(names)} in JUnit)"


# ---------------------------------------------------------------------------------------------
# one project


def check_project(
    project: Project, mutated: bool = False, keep: Path | None = None, log=print
) -> Comparison:
    """Run the project's suite in plain pytest and under devpool; compare the two."""
    sdist = fetch_sdist(project)
    python = project_python(project)
    blocked = [name for name in entry_point_plugins(python) if name in ORDER_PLUGINS]
    mode = "mutated" if mutated else "unchanged"
    with tempfile.TemporaryDirectory(prefix=f"devpool-conformance-{project.name}-") as tmp:
        work = Path(tmp)
        root_a = unpack(project, sdist, work / "plain", mutated)
        log(f"[corpus] {project.pin} ({mode}): plain pytest ...", flush=True)
        plain = run_pytest("plain", python, root_a, project, ["-p", "no:devpool"], work, blocked)
        root_b = unpack(project, sdist, work / "devpool", mutated)
        locks = work / "locks"
        locks.mkdir()
        log(f"[corpus] {project.pin} ({mode}): devpool --devices {DEVICES} ...", flush=True)
        dev = run_pytest(
            "devpool",
            python,
            root_b,
            project,
            ["--devices", DEVICES, f"--devpool-lock-dir={locks}"],
            work,
            blocked,
        )
        result = compare(project, mutated, plain, dev)
        if keep is not None:
            dest = keep / f"{project.name}-{mode}"
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            every = [f"{t}\t{a}\t{b}" for t, a, b in result.per_test]
            (dest / "diff.txt").write_text(
                result.report(examples=0) + "\n\ntest\tplain\tdevpool\n" + "\n".join(every) + "\n"
            )
            for label in ("plain", "devpool"):
                for suffix in (".xml", ".log"):
                    src = work / f"{label}{suffix}"
                    if src.exists():
                        shutil.copy2(src, dest / src.name)
    return result


def select(projects: list[Project], names: Sequence[str], ci: bool) -> list[Project]:
    """The named projects, the ci = true ones with --ci, else all of them."""
    by_name = {p.name: p for p in projects}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise CorpusError(f"not in the manifest: {unknown}; known: {sorted(by_name)}")
    chosen = [p for p in projects if p.ci] if ci else []
    chosen += [by_name[n] for n in names if by_name[n] not in chosen]
    return chosen or ([] if ci else list(projects))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="projects of the manifest (default: --all)")
    parser.add_argument("--all", action="store_true", help="every project")
    parser.add_argument("--ci", action="store_true", help="the projects marked ci = true")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--mutated", action="store_true", help="apply each project's mutation")
    modes.add_argument("--both", action="store_true", help="unchanged, then mutated")
    parser.add_argument("--keep", type=Path, help="copy each run's JUnit XML and output here")
    parser.add_argument("--list", action="store_true", help="list the manifest and stop")
    args = parser.parse_args(argv)
    projects = load_manifest()
    if args.list:
        for p in projects:
            print(f"{p.pin:<22} ci={str(p.ci).lower():<5} {'; '.join(p.covers)}")
        return 0
    try:
        chosen = projects if args.all else select(projects, args.names, args.ci)
    except CorpusError as exc:
        parser.error(str(exc))
    mutations = [False, True] if args.both else [args.mutated]
    failed = broken = 0
    start = time.monotonic()
    summary = []
    for project in chosen:
        for mutated in mutations:
            try:
                result = check_project(project, mutated, args.keep)
            except CorpusError as exc:
                broken += 1
                print(f"{project.pin}: NOT RUN: {exc}", flush=True)
                summary.append(f"{project.pin}: not run")
                continue
            print(result.report(), flush=True)
            print(flush=True)
            failed += not result.ok
            summary.append(
                f"{result.title:<28} {'same' if result.ok else 'DIFFERENT':<9} "
                f"plain {result.plain.seconds:6.1f}s  devpool {result.devpool.seconds:6.1f}s"
            )
    print("\n".join(summary))
    print(
        f"[corpus] {len(summary)} comparisons, {failed} different, {broken} not run, "
        f"{time.monotonic() - start:.1f}s"
    )
    return 2 if broken else (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
