"""Run one of fleetctl's playbooks through ansible-runner and collect each host's outcome."""

from __future__ import annotations

import io
import os
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner
import psutil

from .. import interrupts, resources, settings
from . import preflight
from ..errors import InputError, OperationError
from .execution_nodes import ExecutionNode, RunnerConfig
from .inventory import Fleet
from ..sanitize import one_line

# One module call per host: no fact gathering, pipelining, and OpenSSH multiplexing; host keys are checked.
# A multiplexing master whose host went away without closing the connection (a power cycle, a kernel panic, a host
# torn down mid-reboot) would hold every later session on that host for the kernel's TCP timeout (~15 min):
# ServerAlive* ends it after 60 s of silence, and the next connection attempt opens a fresh one.
ANSIBLE_ENV = {
    "ANSIBLE_GATHERING": "explicit",
    "ANSIBLE_PIPELINING": "True",
    "ANSIBLE_SSH_ARGS": "-C -o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=15 "
                        "-o ServerAliveCountMax=4",
    "ANSIBLE_HOST_KEY_CHECKING": "True",
    "ANSIBLE_SSH_HOST_KEY_CHECKING": "True",
    "ANSIBLE_RETRY_FILES_ENABLED": "False",
    "ANSIBLE_PYTHON_INTERPRETER": "auto_silent",
    "ANSIBLE_NOCOLOR": "True",
    "ANSIBLE_TIMEOUT": "15",
    "ANSIBLE_DEPRECATION_WARNINGS": "False",
}


class Seconds:
    """A running total of seconds (the campaign's time split: fleetctl versus Ansible), and each thread's own (the
    campaign engine runs batches of steps in threads of their own)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._mine = threading.local()
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.total += seconds
        self._mine.total = self.here + seconds

    @property
    def here(self) -> float:
        """This thread's total."""
        return getattr(self._mine, "total", 0.0)


# Seconds spent inside ansible-playbook runs by this process: the campaign engine is given this counter.
PLAYBOOK_TIME = Seconds()
CANCEL_POLL_S = 0.5  # how soon a signal stops the parts of a playbook run


@dataclass
class HostOutcome:
    host: str
    status: str = "ok"  # ok | failed | unreachable
    message: str = ""
    results: dict[str, Any] = field(default_factory=dict)  # task action -> module result


def search_path() -> str:
    """PATH with this Python's bin directory first, so ansible-playbook is found in an unactivated venv."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    if shutil.which("ansible-playbook", path=path) is None:
        raise RuntimeError("ansible-playbook not found: install ansible-core next to fleetctl")
    return path


def collections_path() -> str:
    """fleetctl's collection first, then the user's (or Ansible's default) paths: an inventory may name a
    connection or become plugin from another collection."""
    theirs = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.environ.get("ANSIBLE_COLLECTIONS_PATHS") \
        or "~/.ansible/collections:/usr/share/ansible/collections"
    return os.pathsep.join([str(resources.collections_dir()), theirs])


def default_forks(host_count: int) -> int:
    """Every host at once for small fleets; capped where process count would hurt the control node."""
    return max(1, min(host_count, settings.FORKS_CAP))


class Runner:
    """A command's playbook runs, as its CONFIG says (the config file's execution nodes, how long a worker may be
    silent), and the work to do while the next one runs (meanwhile). Each command (a campaign: its engine) has its own:
    nothing of one is left for another."""

    def __init__(self, config: RunnerConfig = RunnerConfig()) -> None:
        self.config = config
        self.pending: list[Callable[[], object]] = []

    def meanwhile(self, work: Callable[[], object]) -> None:
        """WORK done once by this thread while the next playbook runs (a campaign's import of scipy.stats: 0.7 s it
        would otherwise spend between two playbooks). It starts only when every part's playbook has sent an event, so
        after ansible-runner's fork: a fork while this thread holds an import lock could leave the child stuck before
        its exec. Its failure is ignored: whatever needs it later fails there, as it would have."""
        self.pending.append(work)

    def _do_meanwhile(self) -> None:
        while self.pending:
            try:
                work = self.pending.pop(0)
            except IndexError:  # another batch's playbook run took the last one
                return
            try:
                work()
            except Exception:  # noqa: BLE001 - a warm-up: the code that needs it raises for itself
                pass

    def run_playbook(self, name: str, fleet: Fleet, hosts: list[str], extravars: dict[str, Any] | None = None,
                     forks: int | None = None) -> dict[str, HostOutcome]:
        """Every host's outcome of playbook NAME on HOSTS: the hosts of each execution node through its worker, the
        others in-process (or through $FLEETCTL_WORKER), every part at once, each with its own forks. An execution
        node that fails leaves its hosts unreachable, naming it (run_part); a signal stops every part."""
        outcomes = {h: HostOutcome(h) for h in hosts}
        if not hosts:
            return outcomes
        by_name = {h.name: h for h in fleet.hosts}
        parts = self.config.split(by_name[h] for h in hosts)
        started = time.monotonic()
        # A signal stops ansible-playbook through ansible-runner (its cancel callback), and every worker from here
        # (their event streams have no cancel of their own); it is raised when the parts return: no half-run's
        # results are used.
        playbook = PlaybookTree()
        heard = {node: threading.Event() for node in parts}  # set by the part's first event: its fork is behind it
        with interrupts.deferred(), playbook, ThreadPoolExecutor(len(parts), "fleetctl-part") as pool:
            futures = {pool.submit(run_part, name, fleet, node, {h: outcomes[h] for h in part}, extravars, forks,
                                   playbook.cancel, heard[node].set, self.config.silence): node
                       for node, part in parts.items()}
            running = set(futures)
            try:
                while running:
                    if self.pending and all(f.done() or heard[node].is_set() for f, node in futures.items()):
                        self._do_meanwhile()
                    running = wait(running, timeout=0.05 if self.pending else CANCEL_POLL_S).not_done
                    playbook.cancel()
            except BaseException:  # a second signal, raised at once: every part stopped before its thread is waited
                playbook.stop()
                raise
            for future in futures:
                future.result()  # the part that runs without an execution node raises as a run without them does
        PLAYBOOK_TIME.add(time.monotonic() - started)
        for outcome in outcomes.values():
            if outcome.status == "ok" and not outcome.results:
                outcome.status, outcome.message = "failed", "the playbook returned no result for this host"
        return outcomes

    def run_on_fleet(self, name: str, fleet: Fleet, extravars: dict[str, Any] | None = None, forks: int | None = None,
                     check_ssh: bool = True) -> dict[str, HostOutcome]:
        """Every host's outcome of playbook NAME; hosts failing the SSH pre-flight are unreachable without a run."""
        verdicts = preflight.check_all(list(fleet.hosts)) if check_ssh else {}
        reachable = [h.name for h in fleet.hosts if h.name not in verdicts or verdicts[h.name].ok]
        outcomes = self.run_playbook(name, fleet, reachable, extravars, forks)
        for host, verdict in verdicts.items():
            if not verdict.ok:
                outcomes[host] = HostOutcome(host, "unreachable", f"pre-flight: {verdict.reason}")
        return outcomes


def run_part(name: str, fleet: Fleet, node: ExecutionNode | None, outcomes: dict[str, HostOutcome],
             extravars: dict[str, Any] | None, forks: int | None, cancel: Callable[[], bool],
             heard: Callable[[], None] = lambda: None, silence: float = RunnerConfig.silence) -> None:
    """Playbook NAME on the hosts of OUTCOMES (filled in here) through NODE; None: in-process, or $FLEETCTL_WORKER.
    NODE failing to start, exiting early or dying makes its hosts unreachable with one line naming it; a host whose
    failure had arrived keeps it, and one with only some results too is unreachable: only the end of the playbook
    makes a host's results whole. Without a node, a failure is raised as it always was. HEARD is called at each
    event; a worker may send nothing for SILENCE seconds."""
    hosts = list(outcomes)
    worker = list(node.worker) if node else worker_command()
    who = str(node) if node else f"FLEETCTL_WORKER {shlex.join(worker)}" if worker else None
    job = dict(inventory=fleet.runner_inventory, limit=",".join(hosts), extravars=extravars or {},
               forks=forks or default_forks(len(hosts)), quiet=True, settings={"suppress_ansible_output": True})
    try:
        with tempfile.TemporaryDirectory(prefix="fleetctl-runner-") as private:
            if worker:
                rc, why = run_on_worker(worker, private, name, job, collector(outcomes, heard), cancel, silence)
            else:
                env = dict(ANSIBLE_ENV, ANSIBLE_COLLECTIONS_PATH=collections_path(), PATH=search_path())
                result = ansible_runner.run(private_data_dir=private, playbook=str(resources.playbook(name)),
                                            envvars=env, event_handler=collector(outcomes, heard),
                                            cancel_callback=cancel, **job)
                rc, why = result.rc, None  # its output is read only when the run failed
            if rc not in (0, 2, 4) and all(o.status == "ok" and not o.results for o in outcomes.values()):
                if rc is None or rc < 0:  # SIGKILL (OOM killer, an operator), not a fleetctl bug
                    signal = f" by signal {-rc}" if rc else ""
                    raise OperationError(f"ansible-playbook {name} was killed{signal} before any host answered")
                if why is None:
                    tail = (result.stdout.read() if result.stdout else "")[-500:].strip().splitlines()
                    why = tail[-1] if tail else "no output"
                raise RuntimeError(f"ansible-playbook {name} exited {rc}: {why}")
    except (OperationError, RuntimeError) as e:
        if who is None:
            raise
        if node is None:
            raise type(e)(f"{who}: {e}") from None
        for outcome in outcomes.values():
            if outcome.status == "ok":
                outcome.status, outcome.message = "unreachable", one_line(f"{who}: {e}")


def collector(outcomes: dict[str, HostOutcome], heard: Callable[[], None] = lambda: None
              ) -> Callable[[dict[str, Any]], bool]:
    """ansible-runner's event handler: each event of a host of OUTCOMES recorded in its outcome; HEARD called at each."""
    def on_event(event: dict[str, Any]) -> bool:
        heard()
        data = event.get("event_data") or {}
        host = data.get("host")
        if host not in outcomes:
            return False
        kind = event.get("event")
        res = data.get("res") or {}
        if kind == "runner_on_ok":
            outcomes[host].results[data.get("task_action", "")] = res
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            outcomes[host].results[data.get("task_action", "")] = res  # what the module saw (e.g. who holds a GPU)
            outcomes[host].status = "failed"
            outcomes[host].message = _message(res)
        elif kind == "runner_on_unreachable":
            outcomes[host].status = "unreachable"
            outcomes[host].message = _message(res)
        return False  # nothing kept on disk: the outcome is all fleetctl needs
    return on_event


class PlaybookTree:
    """Every process a playbook run started, stopped when a signal cancels it.

    ansible-runner's cancel kills ansible-playbook's process group, but each of Ansible's workers runs in a session
    of its own (and so does the ssh it starts): they would outlive the run, still driving hosts that fleetctl has
    stopped watching. The tree is walked while ansible-playbook still holds it together (its workers are its
    children until it dies): everything this run started gets SIGTERM, and SIGKILL after a grace. One tree holds
    every part of a run (each execution node's worker too), whichever part's ansible-runner asks first.

    A local worker that dies (kill -9) hands its ansible-playbook to init, out of the tree: what it started is found by
    the MARK in its environment instead (stop_marked). Making fleetctl a child subreaper would not tell them apart: it
    would adopt every part's ssh ControlPersist masters too (they daemonize), those of parts still running included,
    and have to reap each when it exits, minutes after the run."""

    GRACE_S = 5.0
    MARK = "FLEETCTL_WORKER_MARK"  # in a local worker's environment, and so in that of everything it starts

    def __init__(self) -> None:
        self.ours = psutil.Process()
        self.before: set[int] = set()
        self.stopping: list[psutil.Process] = []
        self.lock = threading.Lock()  # each part's ansible-runner, and run_playbook, call cancel()

    def __enter__(self) -> "PlaybookTree":
        self.before = {p.pid for p in self._tree()}
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stopping:  # whatever ignored SIGTERM, or was not yet reaped when ansible-runner returned
            self._kill(self.stopping)

    def _tree(self) -> list[psutil.Process]:
        return self._descendants(self.ours)

    @staticmethod
    def _descendants(proc: psutil.Process) -> list[psutil.Process]:
        try:
            return proc.children(recursive=True)
        except psutil.Error:
            return []

    def cancel(self) -> bool:
        """ansible-runner's cancel_callback: true once a signal was noted, after this run's processes were told to stop."""
        if not interrupts.requested():
            return False
        self.stop()
        return True

    def stop(self) -> None:
        """Everything this run started told to stop, killed after the grace (once, whoever asks)."""
        with self.lock:
            if not self.stopping:
                self.stopping = [p for p in self._tree() if p.pid not in self.before]
                self._end(self.stopping)

    @classmethod
    def stop_marked(cls, mark: str) -> None:
        """Every process of this machine whose environment holds MARK, and its children (whose environment may have
        been reset: become), stopped and waited for as stop() does: what a worker that died had started. A second
        look finds what forked while the first were told to stop."""
        for _ in range(2):
            marked = [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get(cls.MARK) == mark]
            found = {c.pid: c for p in marked for c in (p, *cls._descendants(p))}
            if not found:
                return
            cls._end(list(found.values()))

    @classmethod
    def _end(cls, procs: list[psutil.Process]) -> None:
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=cls.GRACE_S)
        cls._kill(alive)

    @staticmethod
    def _kill(procs: list[psutil.Process]) -> None:
        for p in procs:
            try:
                if p.is_running():  # psutil checks the start time: a reused pid is never hit
                    p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=PlaybookTree.GRACE_S)


def worker_command() -> list[str] | None:
    """$FLEETCTL_WORKER: run playbooks through ansible-runner's streaming mode on this worker command (e.g.
    `ssh exec01 ansible-runner worker`, or `ansible-runner worker` on this machine), not in-process."""
    command = os.environ.get("FLEETCTL_WORKER", "").strip()
    try:
        return shlex.split(command) if command else None
    except ValueError as e:
        raise InputError(f"FLEETCTL_WORKER {command!r}: {e}") from None


class WorkerStalled(OSError):
    """A worker's stream broke WorkerStream's bounds: why, in words (an OSError: ansible-runner's processor ends the
    job on one, status `error`)."""


class WorkerStream(io.RawIOBase):
    """A worker's stdout as ansible-runner's processor reads it (its lines, and read() for the artifacts' zip that
    follows the job), bounded: each line whole within SILENCE seconds of the one before, each read() done within
    SILENCE, a line at most MAX_LINE bytes. A healthy worker is never silent that long: it sends a keepalive every
    quarter of it when it has nothing else to say (keepalive). Past a bound, WorkerStalled: a worker that answers
    nothing, trickles or floods is told from a slow one without holding more than MAX_LINE of it."""

    # No event is longer: ansible-runner hands on a result of at most 700000 characters (MAX_EVENT_RES), each at most
    # 6 bytes as JSON, and the event's stdout may show it again.
    MAX_LINE = 64 << 20
    CHUNK = 1 << 20

    def __init__(self, fd: int, silence: float) -> None:
        super().__init__()
        self.fd, self.silence = fd, silence
        self.buffer = bytearray()
        self.stalled: str | None = None  # the bound it broke, in words
        self.poll = select.poll()
        self.poll.register(fd, select.POLLIN)

    def readable(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> bytes:
        """The next line, or what is left at the end (b"" when nothing is); SIZE is not used."""
        deadline, start = time.monotonic() + self.silence, 0
        while (end := self.buffer.find(b"\n", start) + 1) == 0:
            if len(self.buffer) > self.MAX_LINE:
                self._stall(f"sent a line of more than {self.MAX_LINE >> 20} MiB")
            start = len(self.buffer)
            if not self._fill(deadline):
                end = len(self.buffer)
                break
        return self._take(end)

    def read(self, size: int | None = -1) -> bytes:
        """SIZE bytes (at most MAX_LINE), fewer at the end."""
        size = self.MAX_LINE if size is None or size < 0 else min(size, self.MAX_LINE)
        deadline = time.monotonic() + self.silence
        while len(self.buffer) < size and self._fill(deadline):
            pass
        return self._take(size)

    def _take(self, size: int) -> bytes:
        with memoryview(self.buffer) as view:
            out = bytes(view[:size])  # one copy of a line, not two
        del self.buffer[:size]
        return out

    def _fill(self, deadline: float) -> bool:
        """More of the stream by DEADLINE (WorkerStalled past it); False at its end."""
        left = deadline - time.monotonic()
        if left <= 0 or not self.poll.poll(left * 1000):
            shown = settings.duration_text(self.silence)
            self._stall(f"sent {len(self.buffer)} bytes in {shown} but no whole event" if self.buffer else
                        f"sent nothing for {shown} (no event, no keepalive)")
        chunk = os.read(self.fd, self.CHUNK)
        self.buffer += chunk
        return bool(chunk)

    def _stall(self, why: str) -> None:
        self.stalled = why
        self.buffer = bytearray()
        raise WorkerStalled(why)

    @staticmethod
    def keepalive(silence: float) -> int:
        """How often (whole seconds, as ansible-runner worker takes it) a worker allowed SILENCE seconds sends one."""
        return max(1, int(silence / 4))


def run_on_worker(worker: list[str], private: str, name: str, job: dict[str, Any],
                  on_event: Callable[[dict[str, Any]], bool],
                  cancel: Callable[[], bool] = interrupts.requested,
                  silence: float = RunnerConfig.silence) -> tuple[int, str]:
    """Transmit the job (the playbook and the collection travel in it), let WORKER run it, and process its event stream
    here: the three phases of ansible-runner's remote execution (what Receptor execution nodes run). The worker is
    asked for a keepalive (on its command line, for a worker over ssh; in its environment, as AWX asks its container
    workers, for a script that does not pass its arguments on). A worker that cannot start, ends before the job did,
    or breaks a bound of its stream (WorkerStream: silent for SILENCE seconds, a line never finished or too
    long): an OperationError, what it said last or which bound, once what it had started on this machine is stopped
    (PlaybookTree.stop_marked; over ssh, its playbook is on the node, not here)."""
    project = Path(private) / "project"
    project.mkdir()
    shutil.copy(resources.playbook(name), project)
    # The collection travels beside the playbook, where ansible-playbook looks first (collections/ansible_collections).
    shutil.copytree(resources.collection_dir(), project.joinpath("collections", "ansible_collections", *resources.COLLECTION),
                    ignore=shutil.ignore_patterns("molecule", "tests", "__pycache__"))
    with tempfile.TemporaryFile() as stream, tempfile.TemporaryFile() as errors:
        ansible_runner.run(streamer="transmit", _output=stream, private_data_dir=private,
                           playbook=resources.playbook(name).name, envvars=dict(ANSIBLE_ENV),
                           cancel_callback=cancel, **job)
        stream.seek(0)
        mark = os.urandom(8).hex()
        keepalive = str(WorkerStream.keepalive(silence))
        try:
            # A local worker finds ansible-playbook as fleetctl does; over ssh, the execution node's own PATH rules.
            proc = subprocess.Popen([*worker, "--keepalive-seconds", keepalive], stdin=stream, stdout=subprocess.PIPE,
                                    stderr=errors, env=dict(os.environ, PATH=search_path(), **{
                                        PlaybookTree.MARK: mark, "ANSIBLE_RUNNER_KEEPALIVE_SECONDS": keepalive}))
        except OSError as e:
            raise OperationError(e.strerror) from None
        with proc:
            output = WorkerStream(proc.stdout.fileno(), silence)  # type: ignore[union-attr]
            try:
                processed = ansible_runner.run(streamer="process", _input=output, private_data_dir=private,
                                               event_handler=on_event, quiet=True, cancel_callback=cancel)
            except WorkerStalled:  # in the artifacts, after the job's last event: a worker that hangs there is no
                pass  # more trusted than one that hangs before (ansible-runner's processor ends on one in a line)
            finally:
                if interrupts.requested() and proc.poll() is None:
                    proc.terminate()  # the worker stops its ansible-playbook
                if output.stalled:
                    PlaybookTree.stop_marked(mark)  # the worker too (stopped, or deaf), before it is waited for
                    proc.kill()  # one that lost the mark from its environment
        errors.seek(0)
        said = errors.read().decode(errors="replace").strip().splitlines()
    if output.stalled:
        raise OperationError(output.stalled)
    if processed.status in ("successful", "failed"):  # the job ran: the worker exits with ansible-playbook's rc
        return proc.returncode, processed.status
    PlaybookTree.stop_marked(mark)
    raise OperationError(f"exited {proc.returncode}: " + (said[-1] if said else f"no result ({processed.status})"))


def _message(res: dict[str, Any]) -> str:
    failed = [r for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if failed:  # a loop ("One or more items failed"): the first item that failed, and why
        item = failed[0].get("item")
        return (f"{one_line(str(item))}: " if isinstance(item, (str, int)) else "") + _message(failed[0])
    msg = one_line(res.get("msg") or res.get("stderr") or res.get("module_stderr") or "failed")
    # OpenSSH puts its verdict ("Host key verification failed.") after a long banner: keep both ends.
    return msg if len(msg) <= 500 else msg[:200] + " ... " + msg[-280:]
