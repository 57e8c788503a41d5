"""``primespeech-mlx cluster-keys DIR --machine edge=192.168.1.10 --machine tts=192.168.1.20``: WireGuard keys and
configurations that put all of a dora cluster's traffic (coordinator WebSocket, daemons, the nodes' Zenoh) on an
encrypted tunnel between the listed machines, each authenticated by its key, and the dora commands per machine that
bind every dora listener to the tunnel address.

Why a tunnel and not Zenoh's own TLS: dora 1.1's bundled Zenoh has the TCP and UDP links only, does not enforce
``transport.auth.usrpwd``, and dora's ``--auth`` token covers the coordinator alone, in clear text
(docs/security.md, "The cluster's data plane"; tests/node/test_cluster_data_plane.py checks both facts).
:func:`write_cluster` lists the files it writes. Only the machine's own folder goes to that machine."""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

INTERFACE = "wg-dora"
WG_PORT = 51820
ZENOH_PORT = 5456
COORDINATOR_PORT = 6013
SUBNET = "10.77.0.0/24"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


@dataclass(frozen=True)
class Machine:
    name: str
    host: str  # where the other machines reach its WireGuard port (address or DNS name)
    tunnel: ipaddress.IPv4Address
    private_key: str
    public_key: str


def parse_machine(text: str) -> tuple[str, str]:
    """``NAME=HOST`` -> (name, host); names are dora machine ids and folder names, hosts addresses or DNS names."""
    name, sep, host = str(text).partition("=")
    name, host = name.strip(), host.strip()
    if not sep or not _NAME.fullmatch(name):
        raise ConfigError(f"--machine {text!r}: expected NAME=HOST with NAME of letters, digits, '-' and '_' "
                          "(at most 32, starting with a letter or digit)")
    try:
        host = str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        if not _HOST.fullmatch(host) or ".." in host:
            raise ConfigError(f"--machine {text!r}: HOST must be an IP address or a DNS name") from None
    return name, host


def keypair() -> tuple[str, str]:
    """A WireGuard key pair (Curve25519), base64 as ``wg genkey`` / ``wg pubkey`` write them."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    except ImportError:
        raise ConfigError("cluster-keys needs the `cryptography` package: pip install cryptography") from None
    key = X25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    private = key.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    public = key.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
    return base64.b64encode(private).decode(), base64.b64encode(public).decode()


def plan(machines: list[tuple[str, str]], subnet: str = SUBNET) -> list[Machine]:
    """Tunnel addresses and fresh keys for the machines, in order; ConfigError for duplicates or a small subnet."""
    if len(machines) < 2:
        raise ConfigError("cluster-keys needs at least two --machine NAME=HOST")
    names = [n for n, _ in machines]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"machine names given twice: {', '.join(dupes)}")
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise ConfigError(f"--subnet {subnet!r}: expected an IPv4 network such as {SUBNET} ({exc})") from None
    hosts = net.hosts()
    out = []
    for name, host in machines:
        try:
            tunnel = next(hosts)
        except StopIteration:
            raise ConfigError(f"--subnet {subnet} has fewer addresses than machines ({len(machines)})") from None
        out.append(Machine(name, host, tunnel, *keypair()))
    return out


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def wg_config(me: Machine, others: list[Machine], prefix: int, wg_port: int) -> str:
    lines = [f"# WireGuard interface {INTERFACE} of dora machine {me.name} (primespeech-mlx cluster-keys)",
             "[Interface]", f"PrivateKey = {me.private_key}", f"Address = {me.tunnel}/{prefix}",
             f"ListenPort = {wg_port}"]
    for peer in others:
        lines += ["", f"# {peer.name}", "[Peer]", f"PublicKey = {peer.public_key}",
                  f"Endpoint = {_endpoint(peer.host, wg_port)}", f"AllowedIPs = {peer.tunnel}/32",
                  "PersistentKeepalive = 25"]
    return "\n".join(lines) + "\n"


def commands(me: Machine, others: list[Machine], coordinator: Machine, zenoh_port: int,
             coordinator_port: int) -> str:
    q = shlex.quote
    lines = ["#!/bin/sh", f"# dora on machine {me.name}, every listener on the tunnel address {me.tunnel}.",
             f"# 1. the tunnel (once; `sudo wg-quick down` removes it): sudo wg-quick up \"$PWD/{INTERFACE}.conf\"",
             f"# 2. dora's ports only on {INTERFACE} (Zenoh {zenoh_port}, coordinator {coordinator_port}; nodes pick "
             "ports of their own on the same address), e.g. with iptables:",
             f"#    sudo iptables -A INPUT -d {me.tunnel} ! -i {INTERFACE} -j DROP", ""]
    if me is coordinator:
        lines += [f"dora coordinator --interface {me.tunnel} --port {coordinator_port} --auth &",
                  "# its token: ~/.config/dora/.dora-token here; give it to the other machines as DORA_AUTH_TOKEN", ""]
    connect = ",".join(f"tcp/{p.tunnel}:{zenoh_port}" for p in others)
    lines += [f"dora daemon --machine-id {q(me.name)} --coordinator-addr {coordinator.tunnel} "
              f"--coordinator-port {coordinator_port} --zenoh-listen {_endpoint(str(me.tunnel), zenoh_port)} "
              f"--zenoh-connect {connect} --zenoh-no-multicast "
              "--zenoh-config-overlay \"$(primespeech-mlx zenoh-overlay)\""]
    return "\n".join(lines) + "\n"


def write_cluster(out: str | os.PathLike, machines: list[tuple[str, str]], coordinator: str | None = None,
                  subnet: str = SUBNET, wg_port: int = WG_PORT, zenoh_port: int = ZENOH_PORT,
                  coordinator_port: int = COORDINATOR_PORT, force: bool = False) -> list[Machine]:
    """Write the files, returns the machines (keys included). For every machine NAME (its tunnel address is the N-th
    host of ``--subnet``, in the order given):

    - ``DIR/NAME/wg-dora.conf`` (mode 0600): the machine's private key, its tunnel address, and every other machine as
      a peer (public key, endpoint, that peer's tunnel address only). ``sudo wg-quick up DIR/NAME/wg-dora.conf`` brings
      up the interface ``wg-dora``.
    - ``DIR/NAME/commands.sh``: the dora commands for that machine (coordinator with ``--auth`` on the coordinator
      machine; the daemon with ``--zenoh-listen`` on its tunnel address, ``--zenoh-connect`` to every other daemon's,
      no multicast scouting, the package's Zenoh overlay) and the firewall rule that keeps dora's ports off the other
      interfaces.
    - ``DIR/cluster.json``: names, endpoints, tunnel addresses and public keys (no private key).

    Existing files are not overwritten without ``--force``."""
    for port in (wg_port, zenoh_port, coordinator_port):
        if not 1 <= int(port) <= 65535:
            raise ConfigError(f"port {port} is out of range 1-65535")
    planned = plan(machines, subnet)
    by_name = {m.name: m for m in planned}
    lead = by_name.get(coordinator or planned[0].name)
    if lead is None:
        raise ConfigError(f"--coordinator {coordinator!r} is not one of the machines ({', '.join(by_name)})")
    out = Path(out)
    files = {out / "cluster.json": None}
    for m in planned:
        files[out / m.name / f"{INTERFACE}.conf"] = m
        files[out / m.name / "commands.sh"] = m
    existing = [str(p) for p in files if p.exists()]
    if existing and not force:
        raise ConfigError(f"not overwriting {', '.join(existing)} (--force replaces them)")
    prefix = ipaddress.IPv4Network(subnet).prefixlen
    for m in planned:
        folder = out / m.name
        folder.mkdir(parents=True, exist_ok=True)
        others = [p for p in planned if p is not m]
        conf = folder / f"{INTERFACE}.conf"
        conf.unlink(missing_ok=True)
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the private key: never world-readable
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(wg_config(m, others, prefix, wg_port))
        script = folder / "commands.sh"
        script.write_text(commands(m, others, lead, zenoh_port, coordinator_port), encoding="utf-8")
        script.chmod(0o755)
    summary = {"interface": INTERFACE, "subnet": subnet, "wireguard_port": wg_port, "zenoh_port": zenoh_port,
               "coordinator": {"machine": lead.name, "address": str(lead.tunnel), "port": coordinator_port},
               "machines": [{"name": m.name, "host": m.host, "tunnel": str(m.tunnel), "public_key": m.public_key}
                            for m in planned]}
    (out / "cluster.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return planned


def cmd_cluster_keys(args) -> int:
    machines = [parse_machine(m) for m in args.machine or []]
    planned = write_cluster(args.dir, machines, coordinator=args.coordinator, subnet=args.subnet,
                            wg_port=args.wireguard_port, zenoh_port=args.zenoh_port,
                            coordinator_port=args.coordinator_port, force=args.force)
    for m in planned:
        print(f"{m.name}: tunnel {m.tunnel}, {Path(args.dir) / m.name}/ ({INTERFACE}.conf, commands.sh)")
    print(f"copy each machine's folder to that machine only ({INTERFACE}.conf holds its private key)")
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("cluster-keys", help="WireGuard keys, configs and dora commands that put a dora cluster's "
                       "traffic (coordinator, daemons, Zenoh) on an authenticated, encrypted tunnel")
    s.add_argument("dir", help="output folder (one sub-folder per machine)")
    s.add_argument("--machine", action="append", metavar="NAME=HOST",
                   help="a machine: its dora machine id and where the others reach it (repeat for each)")
    s.add_argument("--coordinator", help="the machine that runs the coordinator (default: the first)")
    s.add_argument("--subnet", default=SUBNET, help=f"tunnel addresses (default {SUBNET})")
    s.add_argument("--wireguard-port", type=int, default=WG_PORT, help=f"WireGuard UDP port (default {WG_PORT})")
    s.add_argument("--zenoh-port", type=int, default=ZENOH_PORT,
                   help=f"daemons' Zenoh port on the tunnel (default {ZENOH_PORT})")
    s.add_argument("--coordinator-port", type=int, default=COORDINATOR_PORT,
                   help=f"coordinator port on the tunnel (default {COORDINATOR_PORT})")
    s.add_argument("--force", action="store_true", help="replace existing files")
    s.set_defaults(func=cmd_cluster_keys)
