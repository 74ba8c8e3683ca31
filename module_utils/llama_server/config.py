"""Which configuration the server's container runs, and whether that configuration passed its canary (stdlib only).

The llama_server role writes the digest of what the server must run (unit, bind, key, certificate) into the
environment file as RIGKIT_SERVER_CONFIG, so the container started from it carries the digest in its
environment; after a canary passed, the role writes the same digest to the instance's ``.proven`` file. The
lock (module_utils/rig_lock.py) and the fast-path record (module_utils/rig_state.py) are written from this: what
the container runs, not what the unit file on disk says.
"""

from __future__ import annotations

from typing import Any

CONFIG_ENV = "RIGKIT_SERVER_CONFIG"


def running_config(inspected: dict[str, Any] | None) -> str | None:
    """The configuration digest in a container's environment (`docker inspect` / GET /containers/NAME/json);
    only this variable is read: the environment also holds the API key."""
    for item in ((inspected or {}).get("Config") or {}).get("Env") or []:
        name, _, value = str(item).partition("=")
        if name == CONFIG_ENV:
            return value.strip() or None
    return None


def proven_config(path: str | None) -> str | None:
    """The digest the last passing canary recorded (None: no file, or none passed yet)."""
    if not path:
        return None
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def serving(inspected: dict[str, Any] | None, proven_path: str | None) -> dict[str, Any]:
    """What the server's container runs: whether it runs, its image ID, and whether the configuration it
    started from is the one whose canary passed (``proven``; never the digest itself)."""
    state = (inspected or {}).get("State") or {}
    config = running_config(inspected)
    return {
        "running": bool(state.get("Running")),
        "image_id": (inspected or {}).get("Image"),
        "proven": config is not None and config == proven_config(proven_path),
    }


def problem(serving_now: dict[str, Any] | None, image_id: str | None = None) -> str | None:
    """Why what runs is not a converged server (None when it is): not running, another image than ``image_id``
    (the tag's), or a configuration whose canary never passed (a run killed between the restart and the canary,
    or a container started by hand)."""
    if not serving_now or not serving_now.get("running"):
        return "the server's container is not running"
    if image_id and serving_now.get("image_id") != image_id:
        return f"the server's container runs image {serving_now.get('image_id')}, not the tag's {image_id}"
    if not serving_now.get("proven"):
        return "the server's container runs a configuration whose canary never passed"
    return None
