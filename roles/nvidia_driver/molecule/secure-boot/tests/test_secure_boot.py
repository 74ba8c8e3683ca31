"""Secure Boot on the four rigs of the scenario (molecule.yml), each checked against what its firmware holds: what
the run did before anything was installed, the key DKMS will sign with, and what mokutil was asked."""

CERT = "/var/lib/dkms/mok.pub"
KEY = "/var/lib/dkms/mok.key"
ASK_STATE = "mokutil --sb-state"
ASK_KEY = f"mokutil --ignore-keyring --test-key {CERT}"


def firmware(host) -> list[str]:
    return host.file("/etc/rigkit-test/firmware").content_string.split()


def outcome(host) -> str:
    return host.file("/var/lib/rigkit-test-outcome").content_string.strip()


def asked(host) -> set[str]:
    return set(host.file("/var/log/rigkit-test-mokutil.log").content_string.splitlines())


def test_the_run_goes_on_only_where_the_firmware_trusts_the_key_or_does_not_check(host):
    state = firmware(host)
    if state == ["disabled"] or state == ["enabled", "enrolled"]:
        assert outcome(host) == "passed"
    else:
        assert outcome(host).startswith("stopped at Stop before installing or rebooting when the key"), outcome(host)


def test_dkmss_key_is_made_up_front_where_secure_boot_enforces(host):
    cert, key = host.file(CERT), host.file(KEY)
    if firmware(host) == ["disabled"]:
        assert not cert.exists and not key.exists
        assert asked(host) == {ASK_STATE}  # the state, never a key
        return
    assert cert.exists and cert.user == "root"
    assert key.exists and key.user == "root" and key.mode == 0o600
    # DKMS's own recipe: a self-signed DER certificate with its subject, its private key beside it
    subject = host.run(f"openssl x509 -inform DER -in {CERT} -noout -subject -nameopt RFC2253")
    assert subject.rc == 0 and subject.stdout.strip() == "subject=CN=DKMS module signing key"
    pubkeys = host.run(f"openssl x509 -inform DER -in {CERT} -noout -pubkey; openssl pkey -in {KEY} -pubout")
    halves = pubkeys.stdout.split("-----END PUBLIC KEY-----")
    assert pubkeys.rc == 0 and halves[0].strip() == halves[1].strip()  # the two halves belong together
    assert asked(host) == {ASK_STATE, ASK_KEY}


def test_a_key_the_firmware_does_not_trust_stops_the_run_with_the_console_steps(host):
    state = firmware(host)
    if state[0] == "disabled" or state[1] == "enrolled":
        return  # the run went on (above)
    text, rig = outcome(host), host.backend.get_hostname()
    assert f"{rig} enforces Secure Boot and does not trust DKMS's signing key ({CERT}) yet" in text
    assert "nothing was installed and the rig was not rebooted" in text
    assert "in the blue MOK manager choose Enroll MOK, Continue, Yes, type that password, Reboot" in text
    assert text.endswith(f"then run make provision host={rig} again.")
    importing = f"sudo mokutil --import {CERT} (choose a one-time password)"
    assert (importing in text) == (state[1] == "not-enrolled")  # a pending key is imported already


def test_nothing_of_the_driver_reached_a_rig_that_stopped(host):
    for package in ("nvidia-kernel-dkms", "nvidia-smi", "dkms"):
        assert not host.package(package).is_installed, package
    assert not host.file("/etc/apt/sources.list.d/debian-nonfree.sources").exists
