"""make test's workers: a module that converges or reads the kit's sandbox rigs runs in their one group, so that no
two workers provision the same rig at once."""

from __future__ import annotations

import re
from types import SimpleNamespace

from tests.conftest import SHARED_SANDBOX_RIGS, STANDALONE_INTEGRATION_TESTS, pytest_xdist_make_scheduler, worker_group
from tests.support import REPO

INTEGRATION = REPO / "tests/integration"
# The session fixtures that converge the kit's sandbox rigs (tests/integration/conftest.py).
SANDBOX_FIXTURES_RE = re.compile(r"\b(sandbox_provisioned|mtp_provisioned)\b")


def test_every_module_that_uses_the_sandbox_rigs_shares_their_group():
    using = {path.name for path in INTEGRATION.glob("test_*.py") if SANDBOX_FIXTURES_RE.search(path.read_text())}
    assert using == set(SHARED_SANDBOX_RIGS)


def test_the_named_modules_exist():
    for name in (*SHARED_SANDBOX_RIGS, *STANDALONE_INTEGRATION_TESTS):
        assert (INTEGRATION / name).is_file(), name


def test_groups_by_node_id():
    assert (
        worker_group("tests/integration/test_fleet_services.py::test_second_converge_changes_nothing") == "sandbox-rigs"
    )
    assert worker_group("tests/integration/test_fleet.py::test_status_shows_all_three") == "test_fleet.py"
    assert worker_group("tests/integration/test_bench.py::test_report[sandbox-mtp]") == "sandbox-rigs"
    assert worker_group("tests/integration/test_server_tls.py::test_x") == "test_server_tls.py"
    assert worker_group("tests/integration/test_molecule.py::test_molecule_scenario[docker-default]") is None
    assert worker_group("tests/unit/test_fleet_gateway.py::test_x") is None


class Worker:
    """Stands in for an xdist worker: the scheduler only sends it test indexes and may shut it down."""

    def __init__(self) -> None:
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_the_scheduler_hands_out_groups_in_collection_order_not_largest_first():
    """xdist's loadscope reorders groups by size unless told not to, which queued every unit test last."""
    options = {"dist": "loadgroup", "tx": ["popen"]}
    config = SimpleNamespace(
        option=SimpleNamespace(loadscopereorder=True), getoption=options.__getitem__, getvalue=options.__getitem__
    )
    scheduler = pytest_xdist_make_scheduler(config, None)
    collection = [
        *(f"tests/integration/test_bench.py::test_{n}" for n in range(3)),
        *(f"tests/unit/test_a.py::test_{n}" for n in range(2)),
        *(f"tests/integration/test_fleet.py::test_{n}" for n in range(4)),
    ]
    worker = Worker()
    scheduler.add_node(worker)
    scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    assert worker.sent == [0, 1, 2]
    assert list(scheduler.workqueue) == [*collection[3:5], "test_fleet.py"]
