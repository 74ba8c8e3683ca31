"""rigkit/mirror/plan.py: one run's download plan from what the play's rigs noted (roles/models_fleet)."""

from __future__ import annotations

from rigkit.mirror.plan import fleet_download_plan


def entry(name: str, repo: str = "org/repo", revision: str = "a" * 40) -> dict:
    return {"name": name, "repo": repo, "revision": revision, "filename": f"{name}.gguf", "upstream": "https://hf"}


TARGET, DRAFTER, OTHER = entry("target"), entry("drafter"), entry("other", repo="org/other")


def test_each_model_once_and_only_what_some_rig_lacks_is_served():
    rigs = [
        {"needs": [TARGET, DRAFTER], "wants": [DRAFTER], "address": "192.0.2.1", "addresses": ["192.0.2.10"]},
        {"needs": [TARGET, DRAFTER], "wants": [DRAFTER, TARGET], "address": "192.0.2.1", "addresses": ["192.0.2.11"]},
    ]
    plan = fleet_download_plan(rigs, cached=lambda item: True)
    assert [item["name"] for item in plan["downloads"]] == ["drafter", "target"]
    assert [item["name"] for item in plan["fetches"]] == ["target", "drafter"]
    assert plan["allow"] == [f"org/repo/resolve/{'a' * 40}/drafter.gguf", f"org/repo/resolve/{'a' * 40}/target.gguf"]
    assert plan["binds"] == ["192.0.2.1"]
    assert plan["clients"] == ["192.0.2.10", "192.0.2.11"]
    assert plan["mirror_args"] == [
        "--allow", plan["allow"][0], "--allow", plan["allow"][1],
        "--bind", "192.0.2.1", "--client", "192.0.2.10", "--client", "192.0.2.11",
    ]  # fmt: skip


def test_the_controller_fetches_what_its_cache_lacks_even_when_every_rig_holds_it():
    rigs = [{"needs": [TARGET, OTHER], "wants": [], "address": "127.0.0.1", "addresses": ["10.0.0.2"]}]
    plan = fleet_download_plan(rigs, cached=lambda item: item["name"] == "target")
    assert [item["name"] for item in plan["fetches"]] == ["other"]
    # nothing to serve: no file allowed, and a rig that downloads nothing is no client
    assert plan["downloads"] == [] and plan["allow"] == [] and plan["clients"] == []


def test_a_no_op_run_plans_nothing():
    rigs = [{"needs": [TARGET], "wants": [], "address": "127.0.0.1", "addresses": []}]
    plan = fleet_download_plan(rigs, cached=lambda item: True)
    assert plan["downloads"] == [] and plan["fetches"] == []


def test_rigs_reaching_the_controller_differently_get_one_listener_each_and_odd_addresses_are_left_out():
    rigs = [
        {"needs": [TARGET], "wants": [TARGET], "address": "127.0.0.1", "addresses": ["127.0.0.1", "fe80::1%eth0"]},
        {"needs": [TARGET], "wants": [TARGET], "address": "192.0.2.1", "addresses": ["192.0.2.7", "evil host"]},
    ]
    plan = fleet_download_plan(rigs, cached=lambda item: True)
    assert plan["binds"] == ["127.0.0.1", "192.0.2.1"]
    assert plan["clients"] == ["127.0.0.1", "fe80::1%eth0", "192.0.2.7"]
    assert [item["name"] for item in plan["downloads"]] == ["target"]
