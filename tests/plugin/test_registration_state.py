"""The registration state's rules, verb by verb: no sockets, no threads, a clock the test moves.

The same rules are pinned end to end (a real registrar, the kubelet stand-in over unix sockets) by
test_kubelet_streams.py and tests/daemon/test_stream_recovery.py; here each is one call away.
"""

from __future__ import annotations

from nvidia_device_plugin.plugin.registration_state import (
    REGISTER_SETTLE_S,
    STABLE_STREAM_S,
    Backoff,
    Due,
    RegistrationState,
)

KUBELET = (7, 1)  # inode and ctime of the kubelet.sock registered with
OTHER_KUBELET = (8, 2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Server:
    """A stand-in for a resource server: the state only compares servers by identity."""


def state_with(*names: str, backoff: Backoff | None = None) -> tuple[RegistrationState[Server], Clock]:
    clock = Clock()
    state: RegistrationState[Server] = RegistrationState(backoff or Backoff(), clock)
    for name in names:
        state.want(name, Server(), bound=True)
    return state, clock


def register_all(state: RegistrationState[Server], kubelet: int = KUBELET) -> None:
    for registration in state.due(kubelet).now:
        assert state.accepted(registration, kubelet)


def replaced_server(name: str) -> tuple[RegistrationState[Server], Server]:
    """A state whose `name` was served by one server, then by a new one, which is registered; and the old
    one (whose late news the state must ignore)."""
    state, _ = state_with(name)
    old = state.server(name)
    assert old is not None
    state.want(name, Server(), bound=True)
    register_all(state)
    return state, old


def due_names(due: Due[Server]) -> list[str]:
    return [r.name for r in due.now]


def test_a_wanted_resource_is_due_at_once_and_registered_once_accepted() -> None:
    state, _ = state_with("b", "a")
    assert due_names(state.due(KUBELET)) == ["a", "b"]
    assert not state.all_registered()
    register_all(state)
    assert state.registered() == {"a", "b"} and state.all_registered()
    assert state.due(KUBELET).all_done
    assert state.unregistered()[0] == []


def test_a_resource_whose_socket_is_not_bound_is_not_due_until_rebound() -> None:
    state, _ = state_with()
    state.want("a", Server(), bound=False)
    due = state.due(KUBELET)
    assert due.now == [] and due.rebinding and not due.all_done
    assert state.to_rebind() == ["a"]
    state.rebound("a")
    assert due_names(state.due(KUBELET)) == ["a"]


def test_a_lost_socket_is_served_anew_then_registered_again() -> None:
    state, _ = state_with("a")
    register_all(state)
    state.socket_lost("a")
    assert state.registered() == set()
    assert state.to_rebind() == ["a"]
    assert "a" not in state.to_check()[0]  # no point checking a socket known lost
    assert state.due(KUBELET).now == []
    state.rebound("a")
    assert due_names(state.due(KUBELET)) == ["a"]


def test_a_lost_socket_of_a_server_since_replaced_changes_nothing() -> None:
    state, old = replaced_server("a")
    state.socket_lost("a", old)
    assert state.registered() == {"a"} and state.to_rebind() == []
    state.socket_lost("gone")  # never served: nothing to do
    assert state.served() == {"a"}


def test_a_registration_accepted_after_the_resource_was_asked_for_again_is_stale() -> None:
    state, _ = state_with("a")
    (first,) = state.due(KUBELET).now
    state.kubelet_restarted()  # lands while the Register call is in flight
    assert not state.accepted(first, KUBELET)
    assert state.registered() == set()
    state.rebound("a")
    (second,) = state.due(None).now
    assert second.request != first.request
    assert state.accepted(second, KUBELET)


def test_a_registration_of_a_server_since_replaced_or_forgotten_is_stale() -> None:
    state, _ = state_with("a", "b")
    registrations = state.due(KUBELET).now
    state.want("a", Server(), bound=True)
    assert state.forget("b") is not None
    assert [state.accepted(r, KUBELET) for r in registrations] == [False, False]
    assert state.registered() == set() and state.served() == {"a"}


def test_a_lost_kubelet_stream_is_registered_again_not_before_the_settle_time() -> None:
    state, clock = state_with("a")
    register_all(state)
    server = state.server("a")
    assert server is not None
    assert state.stream_ended("a", server, lived_s=60.0, lost=True) == 0.0
    assert state.registered() == set()
    assert state.due(KUBELET).now == []  # kubelet's client of the old stream has not looked yet
    clock.now += REGISTER_SETTLE_S - 0.001
    assert state.due(KUBELET).now == []
    clock.now += 0.001
    assert due_names(state.due(KUBELET)) == ["a"]


def test_the_settle_time_also_follows_our_own_stop_of_a_stream_but_not_a_new_kubelet() -> None:
    state, _ = state_with("a")
    register_all(state)
    server = state.server("a")
    assert server is not None
    # Our stop ended it: not lost, nothing to register, but the settle time still holds.
    assert state.stream_ended("a", server, lived_s=1.0, lost=False) is None
    state.want("a", Server(), bound=True)
    assert state.due(KUBELET).now == []
    assert due_names(state.due(OTHER_KUBELET)) == ["a"]  # another kubelet: its old clients are gone


def test_a_kubelet_restart_serves_and_registers_everything_anew_and_forgets_the_settle_time() -> None:
    state, _ = state_with("a", "b")
    register_all(state)
    server = state.server("a")
    assert server is not None
    state.stream_ended("a", server, lived_s=1.0, lost=False)
    state.kubelet_restarted()
    assert state.registered() == set()
    assert state.to_rebind() == ["a", "b"]
    assert state.to_check() == ({}, None)
    for name in ("a", "b"):
        state.rebound(name)
    assert due_names(state.due(KUBELET)) == ["a", "b"]  # same inode, but no kubelet registered with


def test_the_gone_kubelets_streams_ending_after_the_restart_was_taken_in_hold_nothing_back() -> None:
    # The streams end on their own threads: their ends can be told after the new kubelet.sock was, even
    # after a first resource is registered with the new kubelet (which makes it no longer "fresh").
    state, clock = state_with("a", "b")
    register_all(state)
    servers = {name: state.server(name) for name in ("a", "b")}
    clock.now += 5.0
    state.kubelet_socket_created(OTHER_KUBELET)
    for name in ("a", "b"):
        state.rebound(name)
    first = state.due(OTHER_KUBELET).now[0]
    assert first.name == "a" and state.accepted(first, OTHER_KUBELET)
    clock.now += 0.01
    for name, server in servers.items():
        assert server is not None
        assert state.stream_ended(name, server, lived_s=5.005, lost=True) is None  # opened before the restart
    assert due_names(state.due(OTHER_KUBELET)) == ["b"]  # at once: no settle time, no backoff
    assert state.registered() == {"a"}  # the new registration of "a" stands


def test_a_stream_of_the_new_kubelet_still_settles_when_it_ends() -> None:
    state, clock = state_with("a")
    register_all(state)
    clock.now += 5.0
    state.kubelet_restarted()
    state.rebound("a")
    register_all(state, OTHER_KUBELET)
    clock.now += 1.0
    server = state.server("a")
    assert server is not None
    assert state.stream_ended("a", server, lived_s=0.5, lost=True) == 0.0  # opened after the restart
    assert state.due(OTHER_KUBELET).now == []
    clock.now += REGISTER_SETTLE_S
    assert due_names(state.due(OTHER_KUBELET)) == ["a"]


def test_a_kubelet_restart_forgets_the_streak_of_short_lived_streams() -> None:
    backoff = Backoff(min_retry_s=0.05, max_retry_s=2.0, settle_s=0.0)
    state, clock = state_with("a", backoff=backoff)
    server = state.server("a")
    assert server is not None
    for _ in range(4):
        register_all(state)
        delay = state.stream_ended("a", server, lived_s=0.01, lost=True)
        assert delay is not None
        clock.now += delay
    assert delay > 0
    state.kubelet_restarted()
    state.rebound("a")
    register_all(state, OTHER_KUBELET)
    clock.now += 1.0
    assert state.stream_ended("a", server, lived_s=0.01, lost=True) == 0.0  # the first loss with this kubelet


def test_short_lived_streams_lost_in_a_row_back_off_doubling_to_the_maximum() -> None:
    backoff = Backoff(min_retry_s=0.05, max_retry_s=0.3, settle_s=0.0)
    state, clock = state_with("a", backoff=backoff)
    server = state.server("a")
    assert server is not None
    delays = []
    for _ in range(6):
        register_all(state)
        delay = state.stream_ended("a", server, lived_s=0.01, lost=True)
        assert delay is not None
        delays.append(delay)
        if delay > 0:
            assert state.due(KUBELET).now == []
        clock.now += delay
        assert due_names(state.due(KUBELET)) == ["a"]
    assert delays == [0.0, 0.05, 0.1, 0.2, 0.3, 0.3]
    register_all(state)
    # A stream that lived long enough was a working registration: the next loss is answered at once.
    assert state.stream_ended("a", server, lived_s=STABLE_STREAM_S, lost=True) == 0.0


def test_the_loss_of_a_stream_of_a_replaced_server_registers_nothing() -> None:
    state, old = replaced_server("a")
    assert state.stream_ended("a", old, lived_s=1.0, lost=True) is None
    assert state.registered() == {"a"}


def test_keep_only_and_clear_hand_back_the_servers_to_stop() -> None:
    state, _ = state_with("a", "b", "c")
    a, b = state.server("a"), state.server("b")
    register_all(state)
    assert state.keep_only({"b", "c"}) == [a]
    assert state.served() == {"b", "c"} and state.registered() == {"b", "c"}
    gone = state.clear()
    assert b in gone and len(gone) == 2
    assert state.served() == set() and not state.all_registered()
    assert state.due(KUBELET).all_done


def test_unregistered_says_which_are_missing_and_who_serves_the_rest() -> None:
    state, _ = state_with("a", "b")
    (first, _second) = state.due(KUBELET).now
    assert state.accepted(first, KUBELET)
    missing, registered = state.unregistered()
    assert missing == ["b"]
    assert registered == {"a": state.server("a")}


def test_wait_returns_at_once_when_woken_and_by_the_earliest_deferred_registration() -> None:
    state, clock = state_with("a")
    register_all(state)
    server = state.server("a")
    assert server is not None
    state.wake()
    state.wait(3600.0)  # woken: returns at once
    state.stream_ended("a", server, lived_s=1.0, lost=True)  # wakes too
    state.wait(3600.0)
    assert state.due(KUBELET).now == []  # deferred by the settle time
    clock.now += REGISTER_SETTLE_S  # by the state's clock, it is due now: no waiting
    state.wait(3600.0)
