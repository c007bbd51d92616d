"""deploy/install.sh against a temporary root: files, modes and owners as the units expect."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from daemon import config

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "deploy" / "install.sh"


def service_account() -> tuple[str, str]:
    """An unprivileged user and its group when we can chown (root), else ourselves."""
    if os.geteuid() == 0:
        try:
            nobody = pwd.getpwnam("nobody")
            return nobody.pw_name, grp.getgrgid(nobody.pw_gid).gr_name
        except KeyError:
            pass
    return pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name


def install(root: Path, user: str, group: str) -> subprocess.CompletedProcess[str]:
    owner = pwd.getpwuid(os.getuid()).pw_name
    args = ["--root", str(root), "--prefix", str(ROOT), "--user", user, "--group", group,
            "--owner", owner, "--no-useradd", "--no-venv", "--no-systemctl"]  # fmt: skip
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False
    )


def mode(path: Path) -> tuple[int, str, str]:
    st = path.stat()
    return (
        stat.S_IMODE(st.st_mode),
        pwd.getpwuid(st.st_uid).pw_name,
        grp.getgrgid(st.st_gid).gr_name,
    )


def test_the_layout_is_what_the_units_expect(tmp_path: Path) -> None:
    user, group = service_account()
    me = pwd.getpwuid(os.getuid()).pw_name
    res = install(tmp_path, user, group)
    assert res.returncode == 0, res.stderr
    etc, state = tmp_path / "etc" / "marketwake", tmp_path / "var" / "lib" / "marketwake"
    assert mode(etc) == (0o750, me, group)
    assert mode(etc / "config.toml") == (0o640, me, group)  # the service's group reads it
    assert mode(etc / "env")[0] == 0o600  # read by systemd itself, not by the service
    assert mode(state) == (0o750, user, group)
    assert (state / "agents" / "example" / "agent.toml").is_file()
    assert mode(state / "agents")[1:] == (user, group)
    cfg = config.load(etc / "config.toml")
    assert cfg.daemon.state_dir == "/var/lib/marketwake"
    assert cfg.hooks.agents_dir == "/var/lib/marketwake/agents"
    assert cfg.rag.store.path == "/var/lib/marketwake/rag"
    units = tmp_path / "etc" / "systemd" / "system"
    for unit in ("marketwake.service", "marketwake-rag.service"):
        text = (units / unit).read_text()
        assert mode(units / unit)[0] == 0o644
        assert f"ExecStart={ROOT}/.venv/bin/marketwake " in text
        assert f"User={user}\nGroup={group}\n" in text
        assert "--config /etc/marketwake/config.toml" in text


def test_a_second_run_keeps_what_the_operator_changed(tmp_path: Path) -> None:
    user, group = service_account()
    assert install(tmp_path, user, group).returncode == 0
    cfg = tmp_path / "etc" / "marketwake" / "config.toml"
    cfg.write_text(cfg.read_text() + "\n# edited by the operator\n")
    (tmp_path / "var" / "lib" / "marketwake" / "agents" / "mine").mkdir()
    assert install(tmp_path, user, group).returncode == 0
    assert cfg.read_text().endswith("# edited by the operator\n")
    assert (tmp_path / "var" / "lib" / "marketwake" / "agents" / "mine").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root")
def test_the_service_user_reads_the_config_but_not_the_secrets() -> None:
    """The failure this replaces: root:root 0640 config, `Permission denied` as the
    service user, a restart loop."""
    user, group = service_account()
    if user == "root":
        pytest.skip("no unprivileged user on this machine")
    root = Path(tempfile.mkdtemp(prefix="mw-deploy-"))  # pytest's tmp dirs are 0700
    try:
        root.chmod(0o755)
        assert install(root, user, group).returncode == 0
        check_reads(root / "etc" / "marketwake", user, group)
    finally:
        shutil.rmtree(root)


def check_reads(etc: Path, user: str, group: str) -> None:
    def read_as_service(path: Path) -> int:
        return subprocess.run(
            ["cat", str(path)], user=user, group=group, capture_output=True, check=False
        ).returncode

    assert read_as_service(etc / "config.toml") == 0
    assert read_as_service(etc / "env") != 0


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_units_verify(tmp_path: Path) -> None:
    user, group = service_account()
    assert install(tmp_path, user, group).returncode == 0
    units = tmp_path / "etc" / "systemd" / "system"
    res = subprocess.run(
        ["systemd-analyze", "verify", str(units / "marketwake.service"),
         str(units / "marketwake-rag.service")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr


def test_unknown_options_are_refused(tmp_path: Path) -> None:
    res = subprocess.run(
        ["bash", str(SCRIPT), "--rooot", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 2 and "unknown option --rooot" in res.stderr
