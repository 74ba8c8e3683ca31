"""The deadline and the minimum-rate rule of a download (see FetchOptions; standard library only)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ansible.module_utils.fetch.errors import DownloadError
from ansible.module_utils.fetch.spec import CatalogEntry, FetchOptions, human


class Pace:
    """``check()`` after each chunk and each retry: DownloadError (saying how far it got) when the download
    passed its deadline, or brought less than ``min_rate`` bytes/s over the last ``rate_window`` seconds."""

    def __init__(self, entry: CatalogEntry, opts: FetchOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.entry = entry
        self.opts = opts
        self.clock = clock
        self.started = clock()
        self._window = (self.started, 0)  # (start, bytes downloaded then) of the current rate window

    def note(self, offset: int, downloaded: int, attempts: int) -> str:
        elapsed = self.clock() - self.started
        size = self.entry.size
        share = 100.0 * offset / size if size else 100.0
        return (
            f"got {offset} of {size} bytes ({share:.1f} %, {human(offset)}), "
            f"{human(downloaded)} in {elapsed:.0f} s over {attempts} attempts"
        )

    def check(self, offset: int, downloaded: int, attempts: int) -> None:
        now = self.clock()
        opts = self.opts
        kept = "the partial file is kept and resumed on the next run" if offset else "nothing was kept"
        if opts.deadline and now - self.started > opts.deadline:
            raise DownloadError(
                f"download of {self.entry.where} passed its deadline of {opts.deadline:g} s: "
                f"{self.note(offset, downloaded, attempts)}. Check the network or the mirror (or raise the "
                f"deadline); {kept}."
            )
        start, bytes_then = self._window
        if opts.min_rate and now - start >= opts.rate_window:
            got = downloaded - bytes_then
            if got < opts.min_rate * opts.rate_window:
                raise DownloadError(
                    f"download of {self.entry.where} is too slow: {human(got)} in the last {now - start:.0f} s, "
                    f"below the minimum of {human(opts.min_rate)}/s; {self.note(offset, downloaded, attempts)}. "
                    f"Check the network or the mirror (or lower the minimum rate); {kept}."
                )
            self._window = (now, downloaded)
