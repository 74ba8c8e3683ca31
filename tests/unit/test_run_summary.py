"""callback_plugins/rigkit.py, the kit's screen output, on a real ansible-playbook run: a play no host runs prints
nothing, and the run ends with the summary of where each server answers, a curl that works and what is next."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from tests.support import REPO

REPORT = {"draft_n": 24, "draft_n_accepted": 24, "acceptance": 1.0, "predicted_per_second": 20.9, "build_info": "b1"}


def play(tmp_path: Path, url: str, keyed: bool) -> str:
    answer = f"{{{{ {REPORT!r} | llama_server_answer('rig1', 'main', '{url}', 'draft-mtp', 32, {keyed}) }}}}"
    plays = [
        {"name": "A play no host runs", "hosts": "no_such_group", "tasks": [{"ansible.builtin.debug": {"msg": "x"}}]},
        {
            "name": "The rig",
            "hosts": "rig1",
            "gather_facts": False,
            "tasks": [
                {"name": "Skipped", "ansible.builtin.debug": {"msg": "x"}, "when": False},
                {"name": "Note", "ansible.builtin.set_fact": {"rigkit_answer": answer}},
            ],
        },
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "false"}
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "rig1,", "-c", "local", str(playbook),
            "-e", f"ansible_python_interpreter={REPO / '.venv/bin/python'}"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_run_ends_with_where_the_server_answers_and_a_curl(tmp_path: Path):
    out = play(tmp_path, "http://127.0.0.1:18080", keyed=False)
    assert "A play no host runs" not in out and "no hosts matched" not in out and "Skipped" not in out
    tail = out.rstrip().splitlines()[-6:]
    assert tail[0].startswith("rigkit: 1 server answering, run took ")
    assert tail[1].strip().startswith('llama-server "main" on rig1 answers at http://127.0.0.1:18080')
    assert tail[2].strip() == (
        "curl -s http://127.0.0.1:18080/v1/chat/completions -H 'Content-Type: application/json' \\"
    )
    assert (
        "web UI: none built in" in tail[4]
        and tail[5] == "Next: make status · make verify host=rig1 · make logs host=rig1"
    )
    assert out.index("PLAY RECAP") < out.index("rigkit: 1 server answering")


def test_a_rig_behind_a_key_and_tls_gets_a_curl_naming_both(tmp_path: Path):
    out = play(tmp_path, "https://192.168.1.20:8080", keyed=True)
    assert 'curl -s --cacert rig1.pem -H "Authorization: Bearer $KEY" https://192.168.1.20:8080/v1/chat' in out
    assert "(KEY: llama_server_api_key of inventory/host_vars/rig1.yml, from Vault)" in out
    assert "(rig1.pem: the rig's certificate, /etc/rigkit/tls/main/server.crt on rig1)" in out
