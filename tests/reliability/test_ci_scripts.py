"""Round 2, items 10 and 11: CI that cannot go green by accident.

11: the graph-tab tests passed only because QtWebEngine's libraries happened to be installed; scripts/test.sh
must install them on a fresh machine. The script runs for real here, with apt-get, dpkg-query and the venv's
python replaced by stubs that record what they were asked.
10: the C kernel's build is asserted where a compiler exists (a broken build left CI green on the slow path).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real processes: see the README's note on the test suite's length

ROOT = Path(__file__).resolve().parents[2]
# QtWebEngine's libraries, as /work/shared/STACK-NOTES.md lists them for Debian 12
WEBENGINE_DEBS = {"libnspr4", "libnss3", "libxcomposite1", "libxdamage1", "libxrandr2", "libxtst6", "libasound2",
                  "libxkbfile1"}
# what any machine that runs Python and torch has already
BASE = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)


def installed_by_test_sh(tmp_path: Path) -> set[str]:
    """Run scripts/test.sh on a 'fresh machine': no Debian package installed, a venv whose pytest passes."""
    bin_dir, venv, log = tmp_path / "stubs", tmp_path / "venv", tmp_path / "apt.log"
    bin_dir.mkdir()
    (venv / "bin").mkdir(parents=True)
    stub(bin_dir, "dpkg-query", "exit 1\n")  # nothing is installed
    stub(bin_dir, "apt-get", f'echo "$@" >> "{log}"\n')
    stub(bin_dir, "id", "echo 0\n")  # root: no sudo
    stub(venv / "bin", "python", f"""\
        if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then exit 0; fi
        if [ "$1" = "-m" ] && [ "$2" = "pytest" ]; then exit 0; fi
        exec "{sys.executable}" "$@"
    """)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv / "bin"}:$PATH"\n')
    fake = tmp_path / "modules" / "torch"  # the script asks torch its version: a stand-in answers at once
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.13.0"\n')
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "WORKBENCH_VENV": str(venv),
           "PYTHON": sys.executable, "PYTHONPATH": str(fake.parent), "PYTHONNOUSERSITE": "1"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "test.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    installs = [line.split() for line in log.read_text().splitlines() if " install " in f" {line} "]
    return {word for words in installs for word in words if not word.startswith("-") and word != "install"}


def test_test_sh_installs_quick_webengines_libraries(tmp_path):
    installed = installed_by_test_sh(tmp_path)
    assert WEBENGINE_DEBS <= installed, sorted(WEBENGINE_DEBS - installed)
    assert {"libglib2.0-0", "libgl1", "libxkbcommon0", "libegl1"} <= installed


def _webengine_libraries() -> list[Path]:
    try:
        import PySide6
    except ImportError:
        return []
    folder = Path(PySide6.__file__).parent / "Qt" / "lib"
    return sorted(folder.glob("libQt6WebEngine*.so.6"))


def _owners(libraries: set[str]) -> dict[str, str | None]:
    """The Debian package holding each soname on this machine (None where it is not found)."""
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    paths: dict[str, list[str]] = {}
    for library in libraries:
        match = re.search(rf"^\s*{re.escape(library)} \(.*\) => (\S+)$", cache, re.M)
        if match is not None:
            path = Path(match.group(1))
            paths[library] = list({str(path), str(path.resolve()), "/usr" + str(path), str(path).removeprefix("/usr")})
    every = [p for candidates in paths.values() for p in candidates]
    found = subprocess.run(["dpkg", "-S", *every], capture_output=True, text=True).stdout if every else ""
    by_path = {line.split(": ", 1)[1].strip(): line.split(":")[0] for line in found.splitlines() if ": " in line}
    return {library: next((by_path[p] for p in paths.get(library, []) if p in by_path), None)
            for library in libraries}


def _with_dependencies(packages: set[str]) -> set[str]:
    listing = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Depends},${Pre-Depends}\n"],
                             capture_output=True, text=True).stdout
    depends = {}
    for line in listing.splitlines():
        name, _, fields = line.partition("\t")
        depends[name] = [re.split(r"[ (:]", choice.strip())[0] for item in fields.split(",")
                         for choice in item.split("|") if choice.strip()]
    seen: set[str] = set()
    todo = list(packages)
    while todo:
        package = todo.pop()
        if package not in seen:
            seen.add(package)
            todo += depends.get(package, [])
    return seen


@pytest.mark.skipif(not (shutil.which("dpkg") and shutil.which("readelf") and shutil.which("ldconfig")),
                    reason="needs a Debian system with binutils")
def test_every_library_quick_webengine_links_against_comes_with_test_sh(tmp_path):
    """What QtWebEngine really needs on this machine (its NEEDED entries, each library's package) is installed
    by test.sh, or comes with what it installs: the list cannot fall behind a PySide6 upgrade unnoticed."""
    libraries = _webengine_libraries()
    if not libraries:
        pytest.skip("PySide6 without QtWebEngine")
    needed = set()
    for library in libraries:
        dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
        needed |= {name for name in re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
                   if not name.startswith(("libQt6", "ld-linux"))}
    owners = _owners(needed)
    if any(owner is None for owner in owners.values()):
        pytest.skip(f"not every library is installed here to know its package: {owners}")
    covered = _with_dependencies(installed_by_test_sh(tmp_path)) | BASE
    missing = {name: owner for name, owner in owners.items() if owner not in covered}
    assert not missing, missing


# ----- 10. the C kernel ---------------------------------------------------------------------------


def _compiler() -> str | None:
    return shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc") \
        or shutil.which("cc")


@pytest.mark.skipif(_compiler() is None, reason="no C compiler: the pure-torch path is the one that runs")
def test_the_c_kernel_is_built_where_a_compiler_exists():
    """Where a compiler exists the extension must have built: every other kernel test skips without it, so a
    broken build would leave CI green on the slow path. Build it with `python setup.py build_ext --inplace`."""
    from workbench.quant.kernels import fake_quant as kernels

    assert kernels.kernel_available(), ("a C compiler is on PATH but workbench.quant.kernels._cpu_kernels did not "
                                        "build "
                                        "or import; run `python setup.py build_ext --inplace` and read its errors")
    assert kernels.backend_name() in ("c-avx2", "c-portable")
