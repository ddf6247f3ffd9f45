"""config.watch: one call back per real change, including kubelet's ConfigMap `..data` symlink swap.

The waits below are bounds on how long to wait for something that must happen, never speed assertions.
To show that something did NOT happen, a test waits until the watcher has compared the content again after
the event (`checks_done` moves on) and only then looks.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_config_reading import without_file_permission_override

from nvidia_device_plugin.base.atomicfile import replace_file
from nvidia_device_plugin.config.source import ConfigSource
from nvidia_device_plugin.config.watch import ConfigWatcher, fingerprint

from support.checks import assert_all
from support.waiting import eventually

WAIT = 20.0  # generous bound for a loaded CI machine; tests normally finish in well under a second
NEVER = 3600.0  # poll interval that keeps the periodic check out of event-driven tests
IN_PLACE_DEBOUNCE_S = 0.5


class Calls:
    """A thread-safe call counter to pass as `on_change`."""

    def __init__(self, action: Callable[[], None] | None = None) -> None:
        self.count = 0
        self._cond = threading.Condition()
        self._action = action

    def __call__(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()
        if self._action is not None:
            self._action()

    def wait_for(self, count: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= count, WAIT)


def settle(watcher: ConfigWatcher, marker: Path) -> None:
    """Make an unrelated event in the watched directory and wait until the watcher has looked again."""
    seen = watcher.checks_done
    marker.write_text(str(time.monotonic()))
    assert eventually(lambda: watcher.checks_done > seen, WAIT)


def our_threads() -> set[threading.Thread]:
    return set(threading.enumerate())


@pytest.fixture
def started() -> Iterator[list[ConfigWatcher]]:
    """Watchers a test starts; stopped afterwards even when the test fails."""
    watchers: list[ConfigWatcher] = []
    yield watchers
    for watcher in watchers:
        watcher.stop()


def start(
    started: list[ConfigWatcher], source: ConfigSource, calls: Calls, **kwargs: float | bool
) -> ConfigWatcher:
    kwargs.setdefault("poll_interval_seconds", NEVER)
    kwargs.setdefault("debounce_seconds", 0.05)
    watcher = ConfigWatcher(source, calls, **kwargs)
    started.append(watcher)
    watcher.start()
    return watcher


def one_call_back_for(
    edit: str,
    path: Path,
    watcher: ConfigWatcher,
    calls: Calls,
    write: Callable[[Path, str], None] = replace_file,
) -> None:
    """Write `edit` to `path`: exactly one more call back, and no other once the watcher has looked again.
    By default the file is replaced whole (a look between `write_text`'s truncation and its write sees an
    empty file: a change of its own, which a pause of the test's thread longer than the debounce shows)."""
    expected = calls.count + 1
    write(path, edit)
    assert calls.wait_for(expected)
    settle(watcher, path.parent / "unrelated")
    assert calls.count == expected


def config_file(directory: Path) -> Path:
    """A plain config file in `directory`, its first content written."""
    path = directory / "config.yaml"
    path.write_text("flags: {migStrategy: none}\n")
    return path


class ConfigMapVolume:
    """A ConfigMap volume laid out and updated exactly as kubelet's AtomicWriter does it."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.mount.mkdir()
        self._generation = 0

    def publish(self, files: dict[str, str]) -> None:
        self._generation += 1
        old = self.mount / "..data"
        previous = os.readlink(old) if old.is_symlink() else None
        stamp = f"..2026_12_02_10_{self._generation:02d}_00.{self._generation:09d}"
        (self.mount / stamp).mkdir()
        for name, text in files.items():
            (self.mount / stamp / name).write_text(text)
        tmp_link = self.mount / "..data_tmp"
        tmp_link.symlink_to(stamp)
        os.rename(tmp_link, old)  # the atomic switch
        for name in files:
            link = self.mount / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        if previous is not None:
            shutil.rmtree(self.mount / previous)


def test_plain_file_rewrite_calls_back_once(tmp_path: Path, started: list[ConfigWatcher]) -> None:
    path = config_file(tmp_path)
    calls = Calls()
    # Rewritten in place, truncated then written: the debounce is what keeps the empty file in between
    # from being seen, so it is longer than the test's thread pauses on a busy machine.
    watcher = start(started, ConfigSource.from_file(path), calls, debounce_seconds=IN_PLACE_DEBOUNCE_S)
    assert watcher.watching_events
    one_call_back_for("flags: {migStrategy: mixed}\n", path, watcher, calls, Path.write_text)


def test_deferred_event_watch_sees_a_change_made_before_it(
    tmp_path: Path, started: list[ConfigWatcher]
) -> None:
    """`run`'s watcher: start() takes only the fingerprint; a change between it and watch_events() is seen
    by the first look, and events are received after it."""
    path = config_file(tmp_path)
    calls = Calls()
    watcher = start(started, ConfigSource.from_file(path), calls, defer_events=True)
    assert not watcher.watching_events
    path.write_text("flags: {migStrategy: mixed}\n")  # no event watch yet: only the first look can see it
    assert watcher.checks_done == 0
    watcher.watch_events()
    assert calls.wait_for(1)
    assert eventually(lambda: watcher.watching_events, WAIT)
    one_call_back_for("flags: {migStrategy: single}\n", path, watcher, calls)  # by event: polls are hourly


def test_deferred_event_watch_is_made_after_a_poll_interval_unasked(
    tmp_path: Path, started: list[ConfigWatcher]
) -> None:
    """Nobody calls watch_events() (the registrar never finished a round): the event watch is made anyway,
    one poll interval after the start."""
    path = config_file(tmp_path)
    watcher = start(
        started, ConfigSource.from_file(path), Calls(), defer_events=True, poll_interval_seconds=0.2
    )
    assert not watcher.watching_events
    assert eventually(lambda: watcher.watching_events, WAIT)


class _AskedBeforeItsThreadRuns(ConfigWatcher):
    """watch_events() called between start()'s setup and the thread's first step (a fast registration)."""

    def setup(self) -> bool:
        made = super().setup()
        self.watch_events()
        return made


def test_deferred_event_watch_asked_for_before_the_thread_runs_is_made_at_once(
    tmp_path: Path, started: list[ConfigWatcher]
) -> None:
    watcher = _AskedBeforeItsThreadRuns(
        ConfigSource.from_file(config_file(tmp_path)), Calls(), poll_interval_seconds=NEVER, defer_events=True
    )
    started.append(watcher)
    watcher.start()
    assert eventually(lambda: watcher.watching_events, WAIT)


def test_stopping_a_deferred_watcher_does_not_wait_for_its_poll_interval(tmp_path: Path) -> None:
    path = config_file(tmp_path)
    watcher = ConfigWatcher(
        ConfigSource.from_file(path), Calls(), poll_interval_seconds=NEVER, defer_events=True
    )
    watcher.start()
    watcher.stop()
    assert not watcher.alive  # joined: the wait for watch_events() ended with the stop
    assert not watcher.watching_events


def test_configmap_data_symlink_swap_calls_back_once(tmp_path: Path, started: list[ConfigWatcher]) -> None:
    volume = ConfigMapVolume(tmp_path / "config")
    volume.publish({"config.yaml": "flags: {migStrategy: none}\n", "other.yaml": "{}\n"})
    source = ConfigSource.from_file(volume.mount / "config.yaml")
    assert (volume.mount / "config.yaml").read_text() == "flags: {migStrategy: none}\n"
    calls = Calls()
    watcher = start(started, source, calls)

    volume.publish({"config.yaml": "flags: {migStrategy: mixed}\n", "other.yaml": "{}\n"})
    assert calls.wait_for(1)
    assert source.load().flags.mig_strategy == "mixed"
    settle(watcher, volume.mount / "unrelated")
    assert calls.count == 1

    volume.publish({"config.yaml": "flags: {migStrategy: mixed}\n", "other.yaml": "{changed: 1}\n"})
    settle(watcher, volume.mount / "unrelated")
    assert calls.count == 1  # a swap that leaves our key's content as it was is no change to us


def test_directory_source_follows_the_named_config_appearing(
    tmp_path: Path, started: list[ConfigWatcher]
) -> None:
    volume = ConfigMapVolume(tmp_path / "configs")
    volume.publish({"default": "flags: {migStrategy: none}\n"})
    source = ConfigSource.from_directory(volume.mount, name="a100", default_name="default")
    calls = Calls()
    start(started, source, calls)
    volume.publish({"default": "flags: {migStrategy: none}\n", "a100": "flags: {migStrategy: mixed}\n"})
    assert calls.wait_for(1)
    assert source.load().flags.mig_strategy == "mixed"


def test_change_to_an_invalid_file_still_calls_back(tmp_path: Path, started: list[ConfigWatcher]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    calls = Calls()
    start(started, ConfigSource.from_file(path), calls)
    path.write_text("version: v1\nflags: [not, a, mapping\n")
    assert calls.wait_for(1)


def test_deleting_the_file_is_a_change(tmp_path: Path, started: list[ConfigWatcher]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    calls = Calls()
    start(started, ConfigSource.from_file(path), calls)
    path.unlink()
    assert calls.wait_for(1)


def test_no_call_back_without_a_content_change(tmp_path: Path, started: list[ConfigWatcher]) -> None:
    path = tmp_path / "config.yaml"
    text = "flags: {migStrategy: single}\n"
    path.write_text(text)
    calls = Calls()
    # The same bytes rewritten in place: see test_plain_file_rewrite_calls_back_once for the debounce.
    watcher = start(started, ConfigSource.from_file(path), calls, debounce_seconds=IN_PLACE_DEBOUNCE_S)

    seen = watcher.checks_done
    os.utime(path)  # touch
    path.write_text(text)  # same bytes again
    assert eventually(lambda: watcher.checks_done > seen, WAIT)
    settle(watcher, tmp_path / "unrelated")
    assert calls.count == 0

    path.write_text("flags: {migStrategy: mixed}\n")  # the control: a real change is seen
    assert calls.wait_for(1)


def test_a_failing_call_back_does_not_stop_the_watcher(tmp_path: Path, started: list[ConfigWatcher]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\n")

    def explode() -> None:
        raise RuntimeError("handler bug")

    calls = Calls(explode)
    start(started, ConfigSource.from_file(path), calls)
    path.write_text("a: 2\n")
    assert calls.wait_for(1)
    path.write_text("a: 3\n")
    assert calls.wait_for(2)


def test_a_fifo_in_place_of_the_file_neither_hangs_nor_stops_the_watcher(
    tmp_path: Path, started: list[ConfigWatcher]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\n")
    calls = Calls()
    watcher = start(started, ConfigSource.from_file(path), calls)
    path.unlink()
    os.mkfifo(path)  # no writer ever opens it: reading it blockingly would hang the watcher for good
    assert calls.wait_for(1)
    assert fingerprint(ConfigSource.from_file(path)) == (
        str(path),
        f"<unreadable: {path}: is a named pipe (FIFO), not a regular config file>",
    )
    replace_file(path, "a: 2\n")  # renamed over the FIFO: no look sees the path missing in between
    assert calls.wait_for(2)  # the watcher is still there and sees the regular file come back
    settle(watcher, tmp_path / "unrelated")
    assert calls.count == 2


def test_an_unreadable_configmap_directory_does_not_stop_the_watcher(
    tmp_path: Path, started: list[ConfigWatcher], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin.config.watch")
    volume = ConfigMapVolume(tmp_path / "configs")
    volume.publish({"default": "flags: {migStrategy: none}\n"})
    source = ConfigSource.from_directory(volume.mount, name="a100", default_name="default")
    calls = Calls()
    # The watcher's threads inherit the starting thread's (dropped) power to ignore file modes.
    watcher = without_file_permission_override(
        lambda: start(started, source, calls, poll_interval_seconds=0.05)
    )
    volume.mount.chmod(0)
    try:
        assert calls.wait_for(1)  # unreadable is a change: the daemon's reload rejects it and keeps serving
        seen = watcher.checks_done
        assert eventually(
            lambda: watcher.checks_done > seen + 5, WAIT
        )  # several looks at the same failure...
        denied = [r for r in caplog.records if "Permission denied" in r.getMessage()]
        assert len(denied) == 1, [r.getMessage() for r in denied]  # ...logged once
        assert calls.count == 1
    finally:
        volume.mount.chmod(0o755)
    assert calls.wait_for(2)  # readable again: back to the default config
    volume.publish({"default": "flags: {migStrategy: none}\n", "a100": "flags: {migStrategy: mixed}\n"})
    assert calls.wait_for(3)  # and later ConfigMap updates are still seen
    assert source.load().flags.mig_strategy == "mixed"


def test_periodic_check_covers_a_directory_that_appears_later(
    tmp_path: Path, started: list[ConfigWatcher]
) -> None:
    mount = tmp_path / "not-mounted-yet"
    source = ConfigSource.from_directory(mount, default_name="config.yaml")
    calls = Calls()
    watcher = start(started, source, calls, poll_interval_seconds=0.05)
    assert not watcher.watching_events  # nothing to put an inotify watch on yet
    mount.mkdir()
    (mount / "config.yaml").write_text("flags: {migStrategy: single}\n")
    assert calls.wait_for(1)
    assert eventually(lambda: watcher.watching_events, WAIT)  # and the event watch is made once it can be


def test_stop_is_prompt_and_leaves_no_thread_behind(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    before = our_threads()
    watcher = ConfigWatcher(ConfigSource.from_file(path), Calls(), poll_interval_seconds=NEVER)
    watcher.start()
    names = {t.name for t in our_threads() - before}
    assert "config-watcher" in names and "config-watcher-events" in names
    assert_all(names, lambda name: name.startswith("config-watcher"))
    watcher.stop(timeout=WAIT)
    assert our_threads() - before == set()


def test_stop_from_inside_the_call_back_and_double_start(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\n")
    before = our_threads()
    holder: list[ConfigWatcher] = []
    calls = Calls(lambda: holder[0].stop())
    watcher = ConfigWatcher(
        ConfigSource.from_file(path), calls, debounce_seconds=0.05, poll_interval_seconds=NEVER
    )
    holder.append(watcher)
    watcher.start()
    with pytest.raises(RuntimeError, match="already started"):
        watcher.start()
    path.write_text("a: 2\n")
    assert calls.wait_for(1)
    assert eventually(lambda: our_threads() - before == set(), WAIT)


def test_fingerprint_tracks_path_and_content(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\n")
    first = fingerprint(ConfigSource.from_file(path))
    assert first is not None and first[0] == str(path)
    path.write_text("a: 1\n")
    assert fingerprint(ConfigSource.from_file(path)) == first
    path.write_text("a: 2\n")
    assert fingerprint(ConfigSource.from_file(path)) != first
    assert fingerprint(ConfigSource()) is None
    missing = fingerprint(ConfigSource.from_directory(tmp_path, name="x", default_name="y"))
    assert missing is not None and missing[0] == "<unresolved>" and "neither" in missing[1]


def test_watchdogs_own_stop_race_is_not_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    import nvidia_device_plugin.base.fswatch  # noqa: F401  # installs the filter

    inotify_log = logging.getLogger("watchdog.observers.inotify")
    with caplog.at_level(logging.ERROR, logger="watchdog.observers.inotify"):
        inotify_log.error("InotifyEmitter.queue_events() called when the thread is inactive")
        inotify_log.error("a real inotify failure")
    assert [r.getMessage() for r in caplog.records] == ["a real inotify failure"]
