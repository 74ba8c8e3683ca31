"""``lookup('ansible.builtin.env', 'RIGKIT_CACHE_DIR') | controller_cache_dir``: the controller's cache directory
(inventory/group_vars/all's rig_controller_cache_dir), named by rigkit.paths.cache_dir like every other reader."""

from __future__ import annotations

from typing import Any

from rigkit.paths import cache_dir


def controller_cache_dir(configured: Any) -> str:
    """``configured`` ($RIGKIT_CACHE_DIR's value, '' when unset) or the kit's default cache directory."""
    return str(cache_dir(str(configured or "") or None))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"controller_cache_dir": controller_cache_dir}
