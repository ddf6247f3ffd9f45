"""A late word of a kubelet the registrar found first registers nothing again (issue 32, a stream-race
follow-up).

After a kubelet restart the registrar may find the lost plugin socket and the new kubelet.sock itself and
register before the directory watch reports "kubelet.sock created". Taking that report for yet another
kubelet restart registered every resource a second time with the same kubelet: kubelet replaced its client,
the plugin's first stream of it became a stranger's and was ended for the next stranger's stream, and
kubelet, answering that end, disconnected its current client (seen once in 8 runs of
test_stream_race.py's restart test on a loaded machine).
"""

from __future__ import annotations

from pathlib import Path

from test_registration_state import KUBELET, OTHER_KUBELET, register_all, state_with

from nvidia_device_plugin.plugin.registrar import socket_identity


def test_the_socket_of_the_kubelet_being_registered_with_is_not_a_restart() -> None:
    state, _ = state_with("a")
    (registration,) = state.due(KUBELET).now  # the Register is in flight when the watch's word comes
    assert not state.kubelet_socket_created(KUBELET)
    assert state.accepted(registration, KUBELET)
    assert state.registered() == {"a"}
    assert state.due(KUBELET).all_done  # nothing to register again


def test_the_socket_of_the_kubelet_registered_with_is_not_a_restart() -> None:
    state, _ = state_with("a")
    register_all(state)
    assert not state.kubelet_socket_created(KUBELET)
    assert state.registered() == {"a"} and state.due(KUBELET).all_done


def test_another_kubelets_socket_is_a_restart() -> None:
    state, _ = state_with("a")
    register_all(state)
    assert state.kubelet_socket_created(OTHER_KUBELET)
    assert state.registered() == set()
    assert state.to_rebind() == ["a"]  # every socket served anew, then registered again
    state.rebound("a")
    (registration,) = state.due(OTHER_KUBELET).now
    assert state.accepted(registration, OTHER_KUBELET)


def test_a_socket_gone_again_before_it_was_looked_at_is_a_restart() -> None:
    state, _ = state_with("a")
    register_all(state)
    assert state.kubelet_socket_created(None)
    assert state.registered() == set()


def test_a_new_socket_on_the_old_inode_is_a_restart() -> None:
    # tmpfs hands a restarted kubelet's socket the inode its last one had (seen: 100 restarts in
    # tests/daemon/test_robustness.py lost re-registration when sockets were told apart by inode alone).
    state, _ = state_with("a")
    register_all(state)
    reused = (KUBELET[0], KUBELET[1] + 1)  # same inode, made later
    assert state.kubelet_socket_created(reused)
    assert state.registered() == set()


def test_a_socket_is_told_by_its_inode_and_the_time_it_was_made(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    assert socket_identity(path) is None
    path.touch()
    status = path.stat()
    assert socket_identity(path) == (status.st_ino, status.st_ctime_ns)
