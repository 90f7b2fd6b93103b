"""What the offline GPU host lacks, fetched and checked for CPython 3.12 on manylinux x86_64.

  closure.py fetch REQFILE WHEELS [SKIP...]  download (pip download, cp312 wheels only) every package that
      REQFILE's requirements need, transitively, and that neither host-packages.txt nor SKIP names;
      a wheel already in WHEELS that fits is reused. Prints the wheels to install, one a line.
  closure.py check SITE [SKIP...]            check an unpacked bundle (what the host's PYTHONPATH gets):
      every wheel's tags fit cp312 manylinux x86_64; every requirement of every package in SITE,
      and of kvqual (pyproject.toml, extras included), is met by SITE (version checked) or the host
      (by name: host-packages.txt has no versions); every third-party module that src/kvqual imports
      anywhere (lazy imports included) is in SITE or on the host. Exit 1 on a problem.

Runs on any Python >= 3.11 with `packaging` (this machine's 3.11 can download but not import cp312
wheels: the checks go by names, metadata and tags, never by importing). HOST_PACKAGES overrides the
host's package list (default: host-packages.txt beside this file).
"""

from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name as cn, parse_wheel_filename
from packaging.version import Version

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HOST = {cn(x.strip()) for x in open(os.environ.get("HOST_PACKAGES", HERE / "host-packages.txt")) if x.strip()}
# the host: Python 3.12.3, glibc >= 2.35 (the recipe's wheels up to manylinux_2_35 ran there)
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix", "extra": ""}
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(35, 4, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
TAGS = set(cpython_tags((3, 12), ["cp312", "abi3", "none"], PLATFORMS + ["linux_x86_64"]))
TAGS |= set(compatible_tags((3, 12), "cp312", PLATFORMS + ["linux_x86_64"]))
PIP_PLATFORM = [a for p in PLATFORMS for a in ("--platform", p)]
# modules whose distribution has another name (for the host's list, which names distributions)
MODULE_DIST = {"yaml": "pyyaml", "PIL": "pillow", "cv2": "opencv-python-headless", "sklearn": "scikit-learn",
               "google": "protobuf", "dateutil": "python-dateutil", "jwt": "pyjwt", "attr": "attrs"}
# kvqual imports that `kvqual compare` on the host does not need (said in docs/gpu.md)
OPTIONAL = {"lm_eval": "lm-eval:TASK suites only (they also need a data hub)",
            "datasets": "lm-eval:TASK suites only"}


# requirements that contradict each other in the published metadata, and the version bundled instead (said by
# `check`, never silently): vLLM 0.26.0 pins apache-tvm-ffi==0.1.10, while xgrammar 0.2.9, which vLLM imports at
# start and which imports tvm_ffi, requires >=0.1.11; no version meets both, so xgrammar's side is taken
OVERRIDES = {"apache-tvm-ffi": ">=0.1.11"}


def wanted(req: Requirement, extras: frozenset[str] = frozenset()) -> bool:
    """Does `req` apply on the host, for a package installed with `extras`?"""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**ENV, "extra": e}) for e in ({""} | set(extras)))


def metadata_of(text: str) -> list[Requirement]:
    return [Requirement(r) for r in Parser().parsestr(text).get_all("Requires-Dist") or []]


def best_wheel(wheels: str, req: Requirement) -> str | None:
    """The newest wheel in `wheels` of `req`'s package that meets its specifier and fits the host."""
    fits = []
    for w in glob.glob(os.path.join(wheels, "*.whl")):
        name, version, _, tags = parse_wheel_filename(os.path.basename(w))
        if cn(name) == cn(req.name) and req.specifier.contains(version, prereleases=True) and tags & TAGS:
            fits.append((version, w))
    return max(fits)[1] if fits else None


def fetch(reqfile: str, wheels: str, skip: set[str]) -> int:
    """The wheels that meet every requirement, walked greedily (newest first). When a later
    requirement rules out a version picked earlier (e.g. one package asks for opentelemetry-api and
    another pins it ==1.45.2), that requirement becomes a constraint and the walk starts again, until
    nothing conflicts (or a constraint repeats: then the conflict is real and reported)."""
    constraints: dict[str, SpecifierSet] = {}
    for _ in range(20):
        conflict = _walk(reqfile, wheels, skip, constraints)
        if conflict is None:
            return 0 if not _failed else 1
        n, spec = conflict
        merged = constraints.get(n, SpecifierSet()) & spec
        if merged == constraints.get(n):
            break
        constraints[n] = merged
    print(f"CONFLICT unresolved: {conflict}", file=sys.stderr)
    return 1


_failed: list[str] = []


def _walk(reqfile: str, wheels: str, skip: set[str], constraints: dict[str, SpecifierSet]) -> tuple[str, SpecifierSet] | None:
    todo = [Requirement(r) for r in Path(reqfile).read_text().splitlines() if r.strip()]
    todo = [r for r in todo if wanted(r)]  # after this, a parent's markers (its extras) decide
    done: dict[str, tuple[str, set[str]]] = {}  # package -> (wheel, extras already followed)
    _failed.clear()
    while todo:
        req = todo.pop(0)
        n, extras = cn(req.name), frozenset(req.extras)
        if n in HOST or n in skip:
            continue
        if n in OVERRIDES:
            req = Requirement(f"{req.name}{OVERRIDES[n]}")
        first = n not in done
        if not first:  # met already: its version must fit; extras not followed yet are followed now
            wheel, followed = done[n]
            version = parse_wheel_filename(os.path.basename(wheel))[1]
            if req.specifier and not req.specifier.contains(version, prereleases=True):
                print(f"CONFLICT {n} {version} does not meet {req}: walking again with it as a constraint",
                      file=sys.stderr)
                return n, req.specifier
            extras = frozenset(extras - followed)
            if not extras:
                continue
        else:
            spec = req.specifier & constraints.get(n, SpecifierSet())
            pinned = Requirement(f"{req.name}{spec}")
            wheel = best_wheel(wheels, pinned)
            if wheel is None:
                cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                       "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
                       "--abi", "none", *PIP_PLATFORM, "-d", wheels, f"{req.name}{spec}"]
                p = subprocess.run(cmd, capture_output=True, text=True)
                wheel = best_wheel(wheels, pinned)
                if wheel is None:
                    print(f"FAIL {pinned}: {(p.stderr.strip().splitlines() or ['no wheel'])[-1]}", file=sys.stderr)
                    _failed.append(str(pinned))
                    continue
            done[n] = (wheel, set())
        done[n][1].update(extras)
        with zipfile.ZipFile(wheel) as z:
            meta = next(f for f in z.namelist() if f.endswith(".dist-info/METADATA") and f.count("/") == 1)
            reqs = metadata_of(z.read(meta).decode())
        todo += [r for r in reqs if wanted(r, extras) and (first or not wanted(r))]
    for wheel, _ in sorted(done.values()):
        print(wheel)
    return None


def site_dists(site: Path) -> dict[str, tuple[Version, Path]]:
    out = {}
    for d in site.glob("*.dist-info"):
        meta = Parser().parsestr((d / "METADATA").read_text(encoding="utf-8"))
        out[cn(meta["Name"])] = (Version(meta["Version"]), d)
    return out


def kvqual_imports() -> dict[str, set[str]]:
    """Top-level third-party modules src/kvqual imports anywhere -> the files that import them."""
    found: dict[str, set[str]] = {}
    for f in (ROOT / "src" / "kvqual").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("kvqual", "__future__"):
                    found.setdefault(top, set()).add(str(f.relative_to(ROOT)))
    return found


def in_site(site: Path, module: str) -> bool:
    return ((site / module).is_dir() or (site / f"{module}.py").is_file()
            or any(site.glob(f"{module}.*.so")) or any(site.glob(f"{module}.abi3.so")))


def check(site: Path, skip: set[str]) -> int:
    dists = site_dists(site)
    problems = []
    for n, (_, d) in sorted(dists.items()):  # tags: cp312 / abi3 / py3-none-any on manylinux x86_64
        wheel_tags = [line.split(":", 1)[1].strip() for line in (d / "WHEEL").read_text().splitlines()
                      if line.startswith("Tag:")]
        if not any(set(parse_wheel_filename(f"x-1-{t}.whl")[3]) & TAGS for t in wheel_tags):
            problems.append(f"TAG {n}: {wheel_tags} does not fit cp312 manylinux x86_64")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = [("kvqual", Requirement(r), frozenset(Requirement(r).extras)) for r in pyproject]
    for n, (_, d) in dists.items():
        reqs += [(n, r, frozenset()) for r in metadata_of((d / "METADATA").read_text(encoding="utf-8"))]
    for who, r, extras in reqs:
        n = cn(r.name)
        if not wanted(r, extras) or n in skip or n in HOST:
            continue
        if who == "kvqual" and n == "lm-eval":
            continue  # OPTIONAL: lm-eval suites only
        if n not in dists:
            problems.append(f"MISSING {n} (required by {who}: {r})")
        elif n in OVERRIDES and not r.specifier.contains(dists[n][0], prereleases=True):
            print(f"override {n} {dists[n][0]} (required by {who}: {r}; the metadata contradicts itself: closure.py OVERRIDES)")
            if not SpecifierSet(OVERRIDES[n]).contains(dists[n][0], prereleases=True):
                problems.append(f"VERSION {n} {dists[n][0]} does not meet its override {OVERRIDES[n]}")
        elif r.specifier and not r.specifier.contains(dists[n][0], prereleases=True):
            problems.append(f"VERSION {n} {dists[n][0]} does not meet {r} (required by {who})")
        for extra in r.extras:  # e.g. openai[aiohttp]: the extra's own requirements
            if n in dists:
                for er in metadata_of((dists[n][1] / "METADATA").read_text(encoding="utf-8")):
                    en = cn(er.name)
                    if er.marker and wanted(er, frozenset({extra})) and not wanted(er) and en not in HOST \
                            and en not in dists and en not in skip:
                        problems.append(f"MISSING {en} (required by {n}[{extra}], for {who})")
    for module, files in sorted(kvqual_imports().items()):
        where = "bundle" if in_site(site, module) else "host" if cn(MODULE_DIST.get(module, module)) in HOST else None
        if where is None and module in OPTIONAL:
            where = f"absent, optional: {OPTIONAL[module]}"
        if where is None:
            problems.append(f"IMPORT {module} (in {', '.join(sorted(files))}) is neither in the bundle nor on the host")
        else:
            print(f"import {module:16} {where}")
    print(f"{len(dists)} packages in {site}; {len(problems)} problems")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "fetch":
        sys.exit(fetch(sys.argv[2], sys.argv[3], {cn(x) for x in sys.argv[4:]}))
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        sys.exit(check(Path(sys.argv[2]), {cn(x) for x in sys.argv[3:]}))
    sys.exit(__doc__)
