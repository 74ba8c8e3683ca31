"""The harness: an engine that answers, images named after their recipes, nothing rebuilt twice."""

from __future__ import annotations

import json
import re

from tests.support import run

NAMES_RE = re.compile(r"base image (\S+) / rig image (\S+)")


def test_second_harness_run_changes_nothing(harness):
    assert harness["changed"] == 0
    assert harness["failed"] == 0


def test_images_exist_and_rig_runs_systemd(harness):
    result = run(["docker", "image", "inspect", "rigkit/rig:bookworm"])
    assert result.returncode == 0, result.tail()
    config = json.loads(result.output)[0]["Config"]
    assert config["Cmd"] == ["/lib/systemd/systemd"]


def test_changed_recipe_means_new_tag_and_a_build(harness):
    """A different mirror is a different recipe: new tags, and the build steps are entered (check mode)."""
    current = run(["ansible-playbook", "playbooks/harness.yml", "--check"], results=True)
    changed = run(
        [
            "ansible-playbook",
            "playbooks/harness.yml",
            "--check",
            "-e",
            "container_harness_debian_mirror=http://deb.debian.org/debian/",
        ],
        log_name="harness-recipe-change",
        results=True,
    )
    base_now, rig_now = NAMES_RE.search(current.output).groups()
    base_new, rig_new = NAMES_RE.search(changed.output).groups()
    assert base_now != base_new and rig_now != rig_new
    for image in (base_now, rig_now):
        assert run(["docker", "image", "inspect", image]).returncode == 0
    # entered (ok, or changed where debootstrap is missing), not skipped
    assert changed.statuses("localhost", "container_harness : Install debootstrap") in (["ok"], ["changed"])
    # not entered: the base image's build is included only for a recipe the engine has no image for
    assert current.statuses("localhost", "container_harness : Install debootstrap") == []
    built = "container_harness : Build what is missing and point the stable tag at the rig image"
    assert current.statuses("localhost", built) == ["skipped"]
