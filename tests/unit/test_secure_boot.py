"""Secure Boot as mokutil reports it (module_utils/secure_boot.py), the console steps a rig owner gets, and the
nvidia_driver role's order: the signing key is made and its enrolment checked before anything is installed or
rebooted. The role's tasks run against a mokutil stand-in in roles/nvidia_driver/molecule/secure-boot."""

from __future__ import annotations

import pytest
import yaml
from ansible.module_utils.secure_boot import (
    BLOCKED,
    ENFORCING,
    ENROLLED,
    NOT_ENROLLED,
    OFF,
    PENDING,
    enrolment_steps,
    mok_enrolment,
    secure_boot_state,
)

from tests.support import REPO

CERT = "/var/lib/dkms/mok.pub"
KEY = "/var/lib/dkms/mok.key"


@pytest.mark.parametrize(
    ("stdout", "stderr", "rc", "state"),
    [
        ("SecureBoot enabled\n", "", 0, ENFORCING),
        ("SecureBoot disabled\n", "", 0, OFF),
        ("", "EFI variables are not supported on this system\n", 1, OFF),
        ("", "This system doesn't support Secure Boot\n", 255, OFF),
        ("", 'Failed to read "SecureBoot" variable: No such file or directory\n', 255, OFF),
        ("SecureBoot enabled\nSecureBoot validation is disabled in shim\n", "", 0, OFF),
        ("SecureBoot disabled\nPlatform is in Setup Mode\n", "", 0, OFF),
    ],
)
def test_mokutils_secure_boot_answers(stdout: str, stderr: str, rc: int, state: str) -> None:
    assert secure_boot_state(stdout, stderr, rc) == state


@pytest.mark.parametrize(
    ("answer", "rc", "state"),
    [
        (f"{CERT} is not enrolled", 0, NOT_ENROLLED),
        (f"{CERT} is already enrolled", 1, ENROLLED),
        (f"{CERT} is already in db", 1, ENROLLED),
        (f"{CERT} is already in the enrollment request", 1, PENDING),
        (f"{CERT} is blocked in dbx", 1, BLOCKED),
        (f"{CERT} is blocked in MokListX", 1, BLOCKED),
    ],
)
def test_mokutils_key_answers(answer: str, rc: int, state: str) -> None:
    assert mok_enrolment(answer + "\n", rc, CERT) == state


@pytest.mark.parametrize(
    ("stdout", "rc"),
    [(f"{CERT} is not enrolled", 1), (f"{CERT} is already enrolled", 0), ("/other.der is already enrolled", 1)],
)
def test_an_answer_mokutil_never_gives_is_not_taken_for_a_state(stdout: str, rc: int) -> None:
    with pytest.raises(ValueError, match="not a state the kit knows"):
        mok_enrolment(stdout, rc, CERT)
    with pytest.raises(ValueError, match="not a state the kit knows"):
        secure_boot_state("Cannot determine secure boot state.", "", 0)


def test_the_steps_say_what_to_do_at_the_console_and_end_with_the_next_command() -> None:
    assert enrolment_steps(ENROLLED, CERT, KEY, "laptop1650ti") == ""
    unenrolled = enrolment_steps(NOT_ENROLLED, CERT, KEY, "laptop1650ti")
    assert f"sudo mokutil --import {CERT} (choose a one-time password)" in unenrolled
    assert "nothing was installed and the rig was not rebooted" in unenrolled
    pending = enrolment_steps(PENDING, CERT, KEY, "laptop1650ti")
    assert "--import" not in pending and "waits for the firmware's confirmation" in pending
    for text in (unenrolled, pending):
        assert "MOK manager choose Enroll MOK, Continue, Yes" in text
        assert text.endswith("then run make provision host=laptop1650ti again.")
    blocked = enrolment_steps(BLOCKED, CERT, KEY, "laptop1650ti")
    assert f"sudo mv {CERT} {CERT}.blocked; sudo mv {KEY} {KEY}.blocked" in blocked


def test_the_key_is_made_and_checked_before_anything_is_installed_or_rebooted() -> None:
    tasks = yaml.safe_load((REPO / "roles/nvidia_driver/tasks/main.yml").read_text())
    included = [task.get("ansible.builtin.include_tasks") for task in tasks]
    order = [name for name in included if name]
    assert order.index("secure-boot.yml") < order.index("signing-key.yml")
    for later in ("setup-{{ ansible_facts['os_family'] }}.yml", "kernels.yml", "reboot.yml"):
        assert order.index("signing-key.yml") < order.index(later), later
    signing = next(task for task in tasks if task.get("ansible.builtin.include_tasks") == "signing-key.yml")
    assert signing["when"] == "__nvidia_driver_sign_modules | bool"
