"""A dora cluster on one host: a token-protected coordinator and two daemons (``edge``, ``tts``).

Two daemons with different machine ids and a shared Zenoh peer on 127.0.0.1 behave like two machines as
far as the nodes are concerned (each node talks to its own daemon; messages between the daemons' nodes
go over Zenoh/TCP). Used by tests/node/test_cluster.py and bench_wire.py; also usable by hand::

    python examples/distributed/loopback.py      # starts the cluster, prints the commands, Ctrl-C stops it

Everything runs in a scratch folder with its own HOME/XDG_CONFIG_HOME, so the coordinator's token file
(``~/.config/dora/.dora-token``) never touches the real home directory. Every process is started in its own
process group; ``stop()`` ends those groups, and every node process a daemon was seen to have spawned (dora 1.1
starts each node in a process group of its own, so ending a daemon's group does not reach its nodes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
OVERLAY = Path(__file__).resolve().parents[2] / "dora_primespeech_mlx" / "zenoh-overlay.json5"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dora_exe() -> str:
    exe = BIN / "dora"
    if exe.exists():
        return str(exe)
    from shutil import which

    found = which("dora")
    if not found:
        raise FileNotFoundError("dora CLI (dora-rs-cli) not installed")
    return found


class Cluster:
    """Coordinator (``--auth``) + daemons ``edge`` (label role=edge) and ``tts`` (label tts=true), each with
    zenoh-overlay.json5 (without it dora 1.1 drops small messages that follow large ones between daemons)."""

    DAEMONS = {"edge": {"role": "edge"}, "tts": {"tts": "true"}}

    ADDRESS = "127.0.0.1"  # where the coordinator listens (and the daemons and the CLI reach it)

    def __init__(self, root: Path | None = None, overlay: Path | None = OVERLAY):
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="dora-loopback-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = self.root / "home"
        self.home.mkdir(exist_ok=True)
        self.port = free_port()
        self.zenoh = f"tcp/127.0.0.1:{free_port()}"
        self.listen = {name: free_port() for name in self.DAEMONS}
        self.procs: dict[str, subprocess.Popen] = {}
        self.nodes: dict[int, str] = {}  # pid -> /proc start time of every node process seen (see stop())
        self.token: str | None = None
        self.overlay = overlay  # zenoh settings of every daemon (None: dora's defaults)
        self.dora = dora_exe()

    # -- environment -------------------------------------------------------------------------------
    def env(self, token: bool | str = True) -> dict:
        """Environment for dora processes: the scratch HOME, the venv's bin first on PATH, and the token
        (``token=True``), a given string, or none at all (``False``: an outsider without the token)."""
        env = {k: v for k, v in os.environ.items() if k != "DORA_AUTH_TOKEN"}
        home = self.home if token is not False else self.root / "outsider"
        home.mkdir(exist_ok=True)
        env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), RUST_BACKTRACE="0",
                   PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
        if token is True:
            env["DORA_AUTH_TOKEN"] = self.token or ""
        elif isinstance(token, str):
            env["DORA_AUTH_TOKEN"] = token
        return env

    def _spawn(self, name: str, args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([self.dora, *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> Cluster:
        coord_dir = self.root / "coordinator"
        coord_dir.mkdir(exist_ok=True)
        self._spawn("coordinator", ["coordinator", "--interface", self.ADDRESS, "--port", str(self.port), "--auth",
                                    "--store", "memory"], coord_dir, self.env(token=False) | {
                                        "HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config")})
        token_file = coord_dir / ".dora-token"
        deadline = time.monotonic() + timeout
        while not token_file.exists() or not token_file.read_text().strip():
            self._check_alive("coordinator")
            if time.monotonic() > deadline:
                raise TimeoutError(f"coordinator wrote no token:\n{self.log('coordinator')}")
            time.sleep(0.1)
        self.token = token_file.read_text().strip()
        for name in self.DAEMONS:
            self.start_daemon(name)
        self.wait_daemons(list(self.DAEMONS), timeout)
        return self

    def daemon_args(self, name: str) -> list[str]:
        labels = ",".join(f"{k}={v}" for k, v in self.DAEMONS.get(name, {}).items())
        port = self.listen.setdefault(name, free_port())
        return ["daemon", "--machine-id", name, *(["--labels", labels] if labels else []),
                "--coordinator-addr", self.ADDRESS, "--coordinator-port", str(self.port),
                "--local-listen-port", str(port), "--zenoh-peer", self.zenoh, "--zenoh-no-multicast",
                *(["--zenoh-config-overlay", str(self.overlay)] if self.overlay else [])]

    def start_daemon(self, name: str, token: bool | str = True) -> subprocess.Popen:
        """A daemon with that machine id (``token=False``: one that does not have the cluster's token)."""
        work = self.root / f"daemon-{name}"
        work.mkdir(exist_ok=True)
        return self._spawn(name, self.daemon_args(name), work, self.env(token))

    def kill_daemon(self, name: str) -> None:
        """The daemon dies: SIGKILL to its process group. Its nodes run in groups of their own: they are left to
        notice (``stop()`` ends those still there)."""
        self.node_pids(name)  # remember them for stop()
        proc = self.procs.pop(name)
        _killpg(proc, signal.SIGKILL)
        proc.wait(timeout=10)

    def connected_daemons(self) -> list[str]:
        out = self.cli("cluster", "status", check=False).stdout
        return [line.split()[0].rsplit("-", 5)[0] for line in out.splitlines()[1:]
                if line.strip() and not line.startswith("Active")]

    def wait_daemons(self, names: list[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not set(names) <= set(self.connected_daemons()):
            for name in names:
                if name in self.procs:
                    self._check_alive(name)
            if time.monotonic() > deadline:
                raise TimeoutError(f"daemons {names} did not register: {self.connected_daemons()}")
            time.sleep(0.3)

    def _check_alive(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def log(self, name: str, tail: int = 60) -> str:
        path = self.root / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(ln for ln in lines[-tail:] if not ln.startswith("   "))

    def stop(self) -> None:
        """Stop every dataflow (with the token), then end every process group this object started."""
        if self.token and "coordinator" in self.procs and self.procs["coordinator"].poll() is None:
            try:
                self.cli("stop", "--all", "--grace-duration", "5s", check=False, timeout=20)
            except subprocess.TimeoutExpired:
                pass
        for name in [n for n in self.procs if n != "coordinator"]:
            try:
                self.node_pids(name)  # the nodes still there, to end them below should their daemon not
            except OSError:
                pass
        for name in [n for n in self.procs if n != "coordinator"] + ["coordinator"]:
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            _killpg(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _killpg(proc, signal.SIGKILL)
                proc.wait(timeout=10)
            _killpg(proc, signal.SIGKILL)  # nodes left in the group after their daemon ended
        for pid, started in self.nodes.items():  # nodes in their own groups that outlived their daemon
            if started is not None and _start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- CLI ---------------------------------------------------------------------------------------
    def cli(self, *args: str, token: bool | str = True, check: bool = True, timeout: float = 60,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        """``dora ARGS --coordinator-port PORT`` as a client with (or without) the token."""
        cwd = cwd or self.root / ("client" if token is not False else "outsider")
        cwd.mkdir(exist_ok=True)
        result = subprocess.run([self.dora, *args, "--coordinator-addr", self.ADDRESS, "--coordinator-port",
                                 str(self.port)], cwd=cwd,
                                env=self.env(token), capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"dora {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def dataflows(self) -> list[dict]:
        out = self.cli("list", "--format", "json").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]

    def status(self, name: str) -> str | None:
        """Status of the newest dataflow of that name (after `dora restart` the old instance is listed too; the
        UUIDs are v7, so the newest sorts last)."""
        found = sorted((d["uuid"], d["status"]) for d in self.dataflows() if d.get("name") == name)
        return found[-1][1] if found else None

    def node_pids(self, daemon: str) -> dict[int, str]:
        """Node processes the daemon spawned (its direct children): pid -> command line."""
        proc = self.procs[daemon]
        pids = [int(p) for task in Path(f"/proc/{proc.pid}/task").glob("*")
                for p in (task / "children").read_text().split() if (task / "children").exists()]
        found = {}
        for pid in pids:
            try:
                found[pid] = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
                self.nodes.setdefault(pid, _start_time(pid))
            except OSError:
                pass
        return found

    def start_flow(self, flow: Path, name: str) -> None:
        self.cli("start", str(flow), "--name", name, "--detach", cwd=flow.parent)

    def wait_flow(self, name: str, timeout: float) -> str:
        """Wait until the dataflow is no longer running; returns its final status."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(name)
            if status is not None and status.lower() != "running":
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"dataflow {name} still {status} after {timeout} s")
            time.sleep(0.5)


def _start_time(pid: int) -> str | None:
    """The process's start time (/proc/PID/stat field 22; tells a pid's process from a later one), None when it has
    ended (a zombie waiting for init to reap it counts as ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if len(fields) < 20 or fields[0] == "Z" else fields[19]


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main() -> int:
    with Cluster() as cluster:
        port = cluster.port
        print(f"coordinator 127.0.0.1:{port} (token in {cluster.root}/coordinator/.dora-token)")
        print(f"daemons: {', '.join(cluster.connected_daemons())}; logs in {cluster.root}")
        print(f"  export DORA_AUTH_TOKEN={cluster.token}")
        print(f"  dora start examples/distributed/dataflow.yaml --coordinator-port {port} --name demo --attach")
        print("Ctrl-C stops the cluster.")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
