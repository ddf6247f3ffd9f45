"""DraKubeletPlugin: the kubelet DRA plugin of one driver, as one Worker a daemon starts and stops.

Start order is the promise kubelet relies on: the endpoint (dra.sock, every advertised version) serves
before the registration socket appears, so kubelet never finds a driver it cannot call. While running, a
supervisor thread ("dra-kubelet-plugin") checks both sockets every `check_interval_s` and serves anew one
that was deleted or replaced (as the device-plugin manager does after a kubelet restart): the endpoint
first, and then the registration socket as well, so that kubelet registers the driver again and dials the
new endpoint. A socket that cannot be bound is logged once per reason, retried, and reported by health().
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.dra.kubelet.cdispec import remove_claim_spec
from nvidia_device_plugin.dra.kubelet.checkpoint import BOOT_ID_PATH, Checkpoint, read_boot_id
from nvidia_device_plugin.dra.kubelet.claim_sharing import ClaimSharing
from nvidia_device_plugin.dra.kubelet.claims import ClaimSource
from nvidia_device_plugin.dra.kubelet.dynamic_mig import DynamicMig
from nvidia_device_plugin.dra.kubelet.health_stream import MAX_STREAMS as MAX_HEALTH_STREAMS
from nvidia_device_plugin.dra.kubelet.health_stream import RESEND_INTERVAL_S, HealthFeed, health_handlers
from nvidia_device_plugin.dra.kubelet.health_stream import SERVICES as HEALTH_SERVICES
from nvidia_device_plugin.dra.kubelet.model import ClaimError, DraError, NodeDevices
from nvidia_device_plugin.dra.kubelet.prepare import ClaimPreparer
from nvidia_device_plugin.dra.kubelet.registration import (
    MAX_REQUEST_BYTES as REGISTRATION_MAX_REQUEST_BYTES,
)
from nvidia_device_plugin.dra.kubelet.registration import (
    RegistrationState,
    registration_handlers,
    registration_socket_name,
)
from nvidia_device_plugin.dra.kubelet.stale_claims import RETRY_FIRST_S, RETRY_MAX_S, StaleMigClaims
from nvidia_device_plugin.dra.kubelet.wire import (
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    VERSIONS,
    ApiVersion,
    dra_handlers,
)
from nvidia_device_plugin.dra.names import DRIVER_NAME
from nvidia_device_plugin.plugin.unix_server import BindError, UnixServer

log = logging.getLogger(__name__)

# Kubelet calls one claim batch at a time per pod; a few workers serve several pods starting at once.
WORKERS = 4
MAX_CONCURRENT_CALLS = 32  # more are answered RESOURCE_EXHAUSTED at once instead of queueing without bound

ENDPOINT_SOCKET = "dra.sock"
CHECK_INTERVAL_S = 1.0
_ENDPOINT = "endpoint"  # FailureLog keys
_REGISTRATION = "registration"
_SUPERVISOR = "supervisor"


class DraKubeletPlugin(Worker):
    """The kubelet DRA plugin of driver `driver_name`: registration, DRAPlugin service, prepare/unprepare.

    Constructor (keywords only; every path comes from the caller, nothing is written elsewhere):

    * `plugins_dir`: kubelet's plugins directory (/var/lib/kubelet/plugins); the endpoint is
      `<plugins_dir>/<driver_name>/dra.sock` (the directory is made if missing).
    * `registry_dir`: kubelet's plugin registry directory (/var/lib/kubelet/plugins_registry); the
      registration socket is `<registry_dir>/<driver_name>-reg.sock`.
    * `claims`: where ResourceClaims are read (claims.ApiClaimSource over a `kubernetes` ApiClient, which
      needs `get` on resourceclaims.resource.k8s.io).
    * `node`: called at every prepare that is not answered from the checkpoint; returns the node's DRA
      devices and host facts now (model.NodeDevices), or None before the first snapshot (the claim is
      then refused and kubelet retries). It must be cheap and must not block: return the last value the
      daemon's snapshot follower built.
    * `cdi_spec_dir`: where the per-claim CDI specs go (the runtime's CDI directory, /var/run/cdi).
    * `checkpoint_path`: the JSON checkpoint of prepared claims (e.g. <plugins_dir>/<driver>/checkpoint.json).
    * `boot_id_path`: the boot ID that invalidates the checkpoint after a reboot
      (/proc/sys/kernel/random/boot_id).
    * `health_feed`: the devices' health for kubelet's health stream (health_stream.py; default a new one,
      `.health_feed`): the caller keeps it up to date; until its first update the stream sends nothing.
      `health_resend_interval_s`: how often an open stream repeats an unchanged state.
    * `sharing`: what sets up the sharing claims' opaque configs ask for (claim_sharing.ClaimSharing: time-
      slices, per-claim MPS control daemons); None refuses such claims.
    * `dynamic_mig`: makes and destroys the MIG devices of claims allocated dynamic-MIG placements, and
      adopts those made before a restart (dynamic_mig.DynamicMig); None refuses such claims. With it, a
      thread ("dra-stale-mig-claims") started after the checkpoint is read unprepares each claim holding
      made MIG devices that the API says kubelet can no longer have (stale_claims.py); `stale_retry_s`:
      its first and longest wait before asking an API that did not answer again.
    * `driver_name`, `versions` (most preferred first), `check_interval_s`: defaults as kubelet expects.

    start() (from Worker) reads the boot ID and the checkpoint and binds both sockets before it returns;
    an unreadable boot ID raises DraError (nothing is started). A socket that cannot be bound is retried
    by the thread. stop() removes both sockets (registration first); the checkpoint and specs stay.
    """

    def __init__(
        self,
        *,
        plugins_dir: Path,
        registry_dir: Path,
        claims: ClaimSource,
        node: Callable[[], NodeDevices | None],
        cdi_spec_dir: Path,
        checkpoint_path: Path,
        boot_id_path: Path = BOOT_ID_PATH,
        driver_name: str = DRIVER_NAME,
        versions: Sequence[ApiVersion] = VERSIONS,
        check_interval_s: float = CHECK_INTERVAL_S,
        health_feed: HealthFeed | None = None,
        health_resend_interval_s: float = RESEND_INTERVAL_S,
        sharing: ClaimSharing | None = None,
        dynamic_mig: DynamicMig | None = None,
        stale_retry_s: tuple[float, float] = (RETRY_FIRST_S, RETRY_MAX_S),
    ) -> None:
        super().__init__("dra-kubelet-plugin")
        self.driver_name = driver_name
        self.endpoint = plugins_dir / driver_name / ENDPOINT_SOCKET
        self.registration_socket = registry_dir / registration_socket_name(driver_name)
        self.versions = tuple(versions)
        self._claims = claims
        self._node = node
        self._spec_dir = cdi_spec_dir
        self._checkpoint_path = checkpoint_path
        self._boot_id_path = boot_id_path
        self._check_interval_s = check_interval_s
        self.health_feed = health_feed if health_feed is not None else HealthFeed()
        self._health_resend_interval_s = health_resend_interval_s
        self._sharing = sharing
        self._dynamic_mig = dynamic_mig
        self._stale_retry_s = stale_retry_s
        self._stale_sweep: threading.Thread | None = None
        self._failures = FailureLog(log)
        self._state = RegistrationState(driver_name)
        self._preparer: ClaimPreparer | None = None
        self._endpoint_server: UnixServer | None = None
        self._registration_server: UnixServer | None = None
        self._serving = threading.Lock()  # one round of socket keeping at a time (thread, stop)

    # ---- Worker ----------------------------------------------------------------------------------

    def setup(self) -> bool:
        boot_id = read_boot_id(self._boot_id_path)
        checkpoint, dropped = Checkpoint.load(self._checkpoint_path, boot_id)
        for entry in dropped:
            try:
                remove_claim_spec(self._spec_dir, entry.ref.uid)
            except ClaimError as exc:
                log.warning("after the reboot, %s: %s", entry.ref.label, exc)
        if dropped:
            try:
                checkpoint.save()
            except DraError as exc:  # said now; every prepare that cannot record its claim says it again
                log.error("%s", exc)
        preparer = ClaimPreparer(
            self.driver_name,
            self._claims,
            self._node,
            self._spec_dir,
            checkpoint,
            self._sharing,
            self._dynamic_mig,
        )
        self._preparer = preparer
        if self._dynamic_mig is not None:  # in the background: start-up does not wait for the API
            sweep = StaleMigClaims(self._claims, self.driver_name, preparer, self._stale_retry_s)
            self._stale_sweep = threading.Thread(
                target=sweep.run, args=(self.stopping,), name="dra-stale-mig-claims", daemon=True
            )
            self._stale_sweep.start()
        self._endpoint_server = UnixServer(
            "dra",
            self.endpoint,
            [
                *(dra_handlers(version, preparer) for version in self.versions),
                *health_handlers(self.health_feed, self._health_resend_interval_s),
            ],
            MAX_REQUEST_BYTES,
            MAX_RESPONSE_BYTES,
            workers=WORKERS + MAX_HEALTH_STREAMS,  # an open health stream holds a thread
            max_calls=MAX_CONCURRENT_CALLS,
            make_parent=True,
        )
        # Kubelet opens the health stream only where the registration lists a health service (1.36+).
        services = [*(v.name for v in self.versions), *HEALTH_SERVICES]
        handlers = registration_handlers(self.driver_name, self.endpoint, services, self._state)
        self._registration_server = UnixServer(
            "dra-reg",
            self.registration_socket,
            [handlers],
            REGISTRATION_MAX_REQUEST_BYTES,
            64 * 1024,
            workers=WORKERS,
            max_calls=MAX_CONCURRENT_CALLS,
            make_parent=True,
        )
        self._keep_serving()
        return True

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self._check_interval_s):
            try:
                self._keep_serving()
            except Exception as exc:  # this thread must outlive any bug below it
                self._failures.report(
                    _SUPERVISOR,
                    f"keeping the DRA sockets failed unexpectedly, will retry: {exc!r}",
                    exc_info=True,
                )
            else:
                self._failures.clear(_SUPERVISOR)

    def cleanup(self) -> None:
        self.health_feed.close()  # open health streams end now, not at the servers' grace
        with self._serving:
            for server in (self._registration_server, self._endpoint_server):
                if server is not None:
                    server.stop()
        if self._stale_sweep is not None:  # a claim read in flight ends within its timeouts
            self._stale_sweep.join(self.join_timeout_s)
        if self._preparer is not None:
            self._preparer.close()
        if self._registration_server is not None:
            log.info("DRA driver %s: stopped serving", self.driver_name)

    # ---- what the daemon reads -------------------------------------------------------------------

    def health(self) -> str | None:
        """None while both sockets serve and kubelet has not refused the driver; else why not.

        A driver kubelet has not registered yet is healthy: kubelet's plugin watcher registers it when it
        runs, and the plugin can do nothing to hurry it.
        """
        if not self.alive:
            return f"the DRA kubelet plugin of {self.driver_name} is not running"
        for key in (_ENDPOINT, _REGISTRATION, _SUPERVISOR):
            if (reason := self._failures.reason(key)) is not None:
                return reason
        return self._state.problem()

    @property
    def registered(self) -> bool | None:
        """What kubelet last said: True registered, False refused, None nothing yet (or served anew)."""
        return self._state.registered

    def prepared(self) -> dict[str, tuple[str, ...]]:
        """The device names of each claim prepared on this node, by claim UID (empty before start)."""
        return {} if self._preparer is None else self._preparer.prepared()

    def made_mig(self) -> dict[str, tuple[str, ...]]:
        """The MIG devices made for claims on this node (dynamic MIG), by claim label (empty before start)."""
        return {} if self._preparer is None else self._preparer.made_mig()

    # ---- the sockets ----------------------------------------------------------------------------

    def _keep_serving(self) -> None:
        """Serve every socket that is not served (the endpoint first); failures are kept for health()."""
        with self._serving:
            endpoint, registration = self._endpoint_server, self._registration_server
            if endpoint is None or registration is None or self.stopping.is_set():
                return
            renewed = not endpoint.intact()
            if renewed:
                if not self._serve(endpoint, _ENDPOINT):
                    registration.stop(grace=0)  # kubelet deregisters a driver it could not call
                    return
                names = ", ".join(v.name for v in self.versions)
                log.info("DRA driver %s serving %s on %s", self.driver_name, names, endpoint.path)
            if renewed or not registration.intact():
                if not self._serve(registration, _REGISTRATION):
                    return
                self._state.forget()
                log.info(
                    "DRA driver %s: registration socket %s is up; kubelet's plugin watcher registers it",
                    self.driver_name,
                    registration.path,
                )

    def _serve(self, server: UnixServer, key: str) -> bool:
        try:
            server.restart()
        except BindError as exc:
            self._failures.report(key, f"DRA driver {self.driver_name}: {exc}; will retry")
            return False
        if self._failures.clear(key):
            log.info("DRA driver %s: %s can be served again", self.driver_name, server.path)
        return True
