"""Numbers in untrusted text are ASCII digits only: ``'²'.isdigit()`` is True but ``int('²')``
raises, and ``\\d`` (like ``int()``) takes ``'٣'`` as 3. A server header, a tool's output or an inventory value
with such a digit neither crashes the kit nor is read as a number."""

from __future__ import annotations

import importlib.util
import io
import itertools
import re
import tokenize
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ansible.module_utils.fetch.errors import Restart, Transient, VerificationError
from ansible.module_utils.fetch.http import raise_for_status
from ansible.module_utils.fetch.transfer import Transfer
from ansible.module_utils.gpu_offload import model_loads, parse_compute_apps
from ansible.module_utils.nvidia_kernels import version_key
from ansible.module_utils.preflight.memory import _tensor_layer
from ansible.module_utils.rig_deployed import server_settings

from rigkit.mirror.http_range import wanted_range
from rigkit.validation.rules import Report, _check_container_limits, _check_gpu_layers
from tests.support import REPO

SUP2, AR0, AR3, AR4, AR9, FW12 = "\u00b2", "\u0660", "\u0663", "\u0664", "\u0669", "\uff11\uff12"
NOT_ASCII = [SUP2, AR3, "1" + SUP2, FW12]  # superscript two, Arabic-Indic three, fullwidth twelve


class _Headers:
    def __init__(self, status: int, **headers: str) -> None:
        self.status = status
        self._headers = {key.replace("_", "-").lower(): value for key, value in headers.items()}

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self._headers.get(name.lower(), default)


def _entry(size: int = 1000) -> SimpleNamespace:
    return SimpleNamespace(size=size, where="owner/repo : x.gguf @ rev")


# ------------------------------------------------------------------------------------------- the fetcher
@pytest.mark.parametrize("value", NOT_ASCII)
def test_retry_after_with_unicode_digits_is_ignored_not_a_crash(value: str) -> None:
    opts = SimpleNamespace(token=None)
    with pytest.raises(Transient) as caught:
        raise_for_status(_Headers(503, Retry_After=value), "", "https://hub.example", _entry(), opts)
    assert caught.value.retry_after is None


def test_retry_after_in_ascii_seconds_is_honoured() -> None:
    opts = SimpleNamespace(token=None)
    with pytest.raises(Transient) as caught:
        raise_for_status(_Headers(429, Retry_After="30"), "", "https://hub.example", _entry(), opts)
    assert caught.value.retry_after == 30.0


def _transfer(size: int = 1000, offset: int = 0) -> Transfer:
    transfer = Transfer.__new__(Transfer)  # only what _accept_response reads
    transfer.entry = _entry(size)
    transfer.writer = SimpleNamespace(offset=offset)
    transfer.log = lambda _message: None
    return transfer


@pytest.mark.parametrize("value", NOT_ASCII)
def test_content_length_with_unicode_digits_is_not_read_as_a_size(value: str) -> None:
    _transfer()._accept_response(_Headers(200, Content_Length=value))  # neither ValueError nor a size mismatch


def test_an_ascii_content_length_that_differs_is_still_a_size_mismatch() -> None:
    with pytest.raises(VerificationError, match="Content-Length says 999"):
        _transfer()._accept_response(_Headers(200, Content_Length="999"))


@pytest.mark.parametrize(
    "value", [f"bytes {AR0}-{AR9}/{AR4}", f"bytes 0-9/{SUP2}", "bytes 0-9/1000\n", "bytes 0-9/" + "9" * 5000]
)
def test_a_content_range_that_is_not_ascii_digits_restarts(value: str) -> None:
    with pytest.raises(Restart):
        _transfer()._accept_response(_Headers(206, Content_Range=value))


def test_an_ascii_content_range_is_accepted() -> None:
    _transfer()._accept_response(_Headers(206, Content_Range="bytes 0-999/1000"))


@pytest.mark.parametrize("header", [f"bytes={AR0}-{AR3}", f"bytes=-{AR3}", f"bytes=0-{SUP2}"])
def test_the_mirror_ignores_a_range_of_unicode_digits(header: str) -> None:
    assert wanted_range(header, 100) is None  # ignored (the whole file), not bytes 0-3


# -------------------------------------------------------------------------------- what a machine prints
def test_nvidia_smi_compute_apps_with_unicode_digits_are_skipped() -> None:
    assert parse_compute_apps(f"{SUP2},100\n{AR3},5\n42,{SUP2}\n7,300\n") == {42: None, 7: 300}


def test_a_load_log_with_unicode_digits_counts_nothing() -> None:
    assert model_loads([f"load_tensors: offloaded {AR3}/{AR3} layers to GPU"]) == []
    assert model_loads(["load_tensors: offloaded 3/3 layers to GPU"])[0].offloaded == (3, 3)


def test_kernel_releases_with_unicode_digits_sort_without_a_crash() -> None:
    assert version_key(f"6.1.0-{SUP2}-amd64") > version_key("6.1.0-1-amd64")
    assert version_key("6.1.0-9") < version_key("6.1.0-10")


def test_a_tensor_name_with_unicode_digits_is_not_a_block_index() -> None:
    assert _tensor_layer(f"blk.{SUP2}.attn_q.weight", 24) == 24
    assert _tensor_layer("blk.3.attn_q.weight", 24) == 3


def test_server_argv_with_unicode_digits_stays_text() -> None:
    assert server_settings(["llama-server", "-c", SUP2, f"--parallel={AR3}"]) == {"ctx_size": SUP2, "parallel": AR3}
    assert server_settings(["-c", "4096"]) == {"ctx_size": 4096}


def _library(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_rigkit_test_{name}", REPO / "library" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("said", [f"{SUP2}\n", f"{AR3}\n"])
def test_a_container_pid_of_unicode_digits_is_no_pid(monkeypatch: pytest.MonkeyPatch, said: str) -> None:
    offload = _library("llama_server_offload")
    monkeypatch.setattr(offload, "run", lambda *_args, **_kwargs: (0, said, ""))
    pid, why = offload.container_pid("rigkit-llama-server")
    assert pid is None and "no running process" in why


# ------------------------------------------------------------------------------------- inventory values
class _Sources:
    def file_of(self, variable: str, value: Any = None) -> str:
        return "inventory/host_vars/rig.yml"


@pytest.mark.parametrize("value", NOT_ASCII)
def test_gpu_layers_of_unicode_digits_are_refused(value: str) -> None:
    report = Report(_Sources())
    _check_gpu_layers(report, "llama_server_gpu_layers", value)
    assert report.problems and 'expected "all", "auto" or a number of layers' in report.problems[0]


@pytest.mark.parametrize("value", NOT_ASCII)
def test_container_memory_of_unicode_digits_is_refused_not_a_crash(value: str) -> None:
    report = Report(_Sources())
    _check_container_limits(report, {"llama_server_container_memory_mib": value})
    assert any("llama_server_container_memory_mib" in problem for problem in report.problems)


# ------------------------------------------------------------------------------------------ the whole product
PRODUCT = ("rigkit", "module_utils", "library", "filter_plugins")


def _code_tokens(path: Path) -> list[tokenize.TokenInfo]:
    return [
        token
        for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
        if token.type != tokenize.COMMENT
    ]


def test_no_unicode_digit_tests_are_left_in_the_product() -> None:
    """No ``.isdigit()``/``.isdecimal()``/``.isnumeric()`` call and no ``\\d`` in a string (a regex) anywhere in
    the product: each takes non-ASCII digits. Use ``re.fullmatch(r"[0-9]+", text)``."""
    found = []
    for top in PRODUCT:
        for path in sorted((REPO / top).rglob("*.py")):
            tokens = _code_tokens(path)
            for before, token in itertools.pairwise(tokens):
                name = f"{path.relative_to(REPO)}:{token.start[0]}"
                if before.string == "." and token.string in ("isdigit", "isdecimal", "isnumeric"):
                    found.append(f"{name}: .{token.string}()")
            for token in tokens:
                docstring = token.string.lstrip("rRbBuUfF").startswith(('"""', "'''"))  # prose, not a regex
                if token.type == tokenize.STRING and not docstring and re.search(r"(?<!\\)\\d", token.string):
                    found.append(f"{path.relative_to(REPO)}:{token.start[0]}: \\d in {token.string[:60]}")
    assert not found, "\n".join(found)
