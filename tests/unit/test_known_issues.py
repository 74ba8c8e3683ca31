"""Known-bad llama.cpp builds and settings (rigkit/validation/known_issues.py and its data file): which rigs meet
an issue, which may accept it, and the data's own shape. The before-contact refusal of each runs in
tests/unit/test_validation_rules.py (BAD_VALUES)."""

from __future__ import annotations

import pytest

from rigkit.validation.compat import ROLES
from rigkit.validation.known_issues import KnownIssue, known_issue_problems, known_issues
from rigkit.validation.rules import role_defaults
from tests.support import LLAMACPP_BUILD_NUMBER, seed_values


def rig(**override: object) -> dict:
    return {**role_defaults(*ROLES), **seed_values("desktop3050"), **override}


def test_the_data_names_real_issues_with_ordered_ranges() -> None:
    for known in known_issues():
        assert known.issue > 0 and known.title
        if known.first_build is not None and known.fixed_build is not None:
            assert known.first_build < known.fixed_build
        assert set(known.when) <= {"spec_type", "slots_above", "gpu"}


def test_the_seed_rigs_meet_no_known_issue() -> None:
    for host in ("desktop3050", "laptop1650ti"):
        assert known_issue_problems({**role_defaults(*ROLES), **seed_values(host)}) == []


@pytest.mark.parametrize(
    ("override", "refused"),
    [
        ({"llama_server_parallel": 2}, True),
        ({"llama_server_parallel": 4, "rig_accepted_llamacpp_issues": [27572]}, False),  # the owner accepts it
        ({"llama_server_parallel": 2, "llama_server_gpu_access": "none"}, False),  # a CPU backend copies in step
        ({"llama_server_parallel": 2, "llama_server_spec_type": "none"}, False),  # no drafting, no MTP state
        ({"llama_server_parallel": 1}, False),
    ],
)
def test_several_slots_drafting_on_the_gpu_meet_27572(override: dict, refused: bool) -> None:
    found = known_issue_problems(rig(**override))
    assert bool(found) == refused, found
    if refused:
        ((variable, value, why),) = found
        assert (variable, value) == ("llama_server_parallel", override["llama_server_parallel"])
        assert f"b{LLAMACPP_BUILD_NUMBER} has #27572" in why and "rig_accepted_llamacpp_issues: [27572]" in why


@pytest.mark.parametrize(("build", "refused"), [(10740, False), (10741, True), (10748, True), (10749, False)])
def test_builds_that_cannot_load_gemma4_assistants_are_refused_whatever_is_accepted(build: int, refused: bool) -> None:
    found = known_issue_problems(rig(llamacpp_image_build_number=build, rig_accepted_llamacpp_issues=[28188]))
    assert [variable for variable, _, _ in found] == (["llamacpp_image_build_number"] if refused else [])


def test_an_issue_with_no_known_first_build_covers_every_build_up_to_its_fix() -> None:
    known = KnownIssue(1, "t", None, 200, {}, False)
    assert known.has(1) and known.has(199) and not known.has(200)
    assert known.builds == "every build up to b200, the first fixed one"
