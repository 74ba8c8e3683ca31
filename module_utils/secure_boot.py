"""Secure Boot and the Machine Owner Key list, as mokutil reports them: whether the firmware enforces signatures,
whether DKMS's signing certificate is enrolled, and what the owner does at the console when it is not.

mokutil's answers (0.6/0.7): ``--sb-state`` prints "SecureBoot enabled" or "SecureBoot disabled" first (rc 0), then
"SecureBoot validation is disabled in shim" or "Platform is in Setup Mode" where they hold, or says on stderr that
it cannot read the variable or the system has no EFI variables (rc not 0). ``--test-key FILE`` prints "FILE is not
enrolled" with rc 0, and with rc 1 "FILE is already enrolled", "FILE is already in db" (trusted by the firmware),
"FILE is already in the enrollment request" (imported, waiting for MokManager at the next boot) or "FILE is blocked
in dbx" / "... in MokListX". ``--ignore-keyring`` makes it read the MOK list itself, not the kernel's keyring.
"""

from __future__ import annotations

ENFORCING = "enforcing"
OFF = "off"
ENROLLED = "enrolled"
PENDING = "pending"
NOT_ENROLLED = "not-enrolled"
BLOCKED = "blocked"

_NO_SECURE_BOOT = ("EFI variables are not supported", "doesn't support Secure Boot", 'Failed to read "SecureBoot"')
# shim's own switch (mokutil --disable-validation): the firmware is in Secure Boot, but nothing checks the modules.
_SHIM_NOT_VALIDATING = "SecureBoot validation is disabled in shim"


def secure_boot_state(stdout: str, stderr: str, rc: int) -> str:
    """`mokutil --sb-state` -> ENFORCING or OFF (a machine without EFI or Secure Boot is off; so is one in Setup
    Mode, or whose shim does not validate)."""
    lines = [line.strip() for line in stdout.strip().splitlines()]
    first = lines[0] if lines else ""
    if rc == 0 and first == "SecureBoot enabled":
        return OFF if _SHIM_NOT_VALIDATING in lines else ENFORCING
    if rc == 0 and first == "SecureBoot disabled":
        return OFF
    if rc != 0 and any(words in stderr for words in _NO_SECURE_BOOT):
        return OFF
    raise ValueError(
        f"mokutil --sb-state answered rc {rc}, {(stdout.strip() or stderr.strip())!r}: not a state the kit knows"
    )


def mok_enrolment(stdout: str, rc: int, certificate: str) -> str:
    """`mokutil --ignore-keyring --test-key CERTIFICATE` -> ENROLLED, PENDING, NOT_ENROLLED or BLOCKED."""
    answer = stdout.strip()
    if rc == 0 and answer == f"{certificate} is not enrolled":
        return NOT_ENROLLED
    if rc == 1 and answer in (f"{certificate} is already enrolled", f"{certificate} is already in db"):
        return ENROLLED
    if rc == 1 and answer == f"{certificate} is already in the enrollment request":
        return PENDING
    if rc == 1 and answer.startswith(f"{certificate} is blocked in "):
        return BLOCKED
    raise ValueError(f"mokutil --test-key {certificate} answered rc {rc}, {answer!r}: not a state the kit knows")


def enrolment_steps(state: str, certificate: str, key: str, host: str) -> str:
    """Why the run stops on a Secure Boot rig whose signing key the firmware does not trust yet, and what the owner
    does at the console; '' when it is enrolled."""
    console = (
        "reboot the rig with a screen and keyboard attached; in the blue MOK manager choose Enroll MOK, Continue, "
        f"Yes, type that password, Reboot; then run make provision host={host} again"
    )
    head = (
        f"{host} enforces Secure Boot and does not trust DKMS's signing key ({certificate}) yet, so the NVIDIA "
        "module it signs would not load: nothing was installed and the rig was not rebooted."
    )
    if state == ENROLLED:
        return ""
    if state == NOT_ENROLLED:
        return f"{head} On the rig: sudo mokutil --import {certificate} (choose a one-time password), then {console}."
    if state == PENDING:
        return f"{head} The key is imported and waits for the firmware's confirmation: {console}."
    if state == BLOCKED:
        return (
            f"{host} enforces Secure Boot and its firmware blocks DKMS's signing key ({certificate}, in dbx or "
            f"MokListX): nothing was installed. Move both halves aside (sudo mv {certificate} {certificate}.blocked; "
            f"sudo mv {key} {key}.blocked) and run make provision host={host} again: the kit makes a new key, "
            "which you then enrol."
        )
    raise ValueError(f"unknown MOK enrolment state {state!r}")
