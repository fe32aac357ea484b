"""nginx in front of a benchmark's gateway, configured by docs/production.md's server block (the
same text the live TLS test runs), served as plain HTTP on a local port: only the listen line,
the host name, the upstream's port and the certificate lines are changed (a benchmark's clients
would otherwise spend their CPU on TLS handshakes). Config, pid and logs live in a temp dir.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.launch import REPO_ROOT, free_port, wait_ready

DOC = REPO_ROOT / "docs" / "production.md"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
UPSTREAM = "server 127.0.0.1:8000;"


def doc_block() -> str:
    """The one ```nginx block of docs/production.md."""
    found = re.findall(r"```nginx\n(.*?)```", DOC.read_text(), flags=re.S)
    if len(found) != 1:
        raise RuntimeError("docs/production.md should hold exactly one nginx block")
    return found[0]


def plain_http(block: str, *, port: int, upstream_port: int) -> str:
    """``block`` listening on 127.0.0.1:``port`` without TLS, its upstream at ``upstream_port``."""
    changes = {
        "listen 443 ssl;": f"listen 127.0.0.1:{port};",
        "server_name llm.example.com;": "server_name 127.0.0.1;",
        UPSTREAM: f"server 127.0.0.1:{upstream_port};",
    }
    for old, new in changes.items():
        if block.count(old) != 1:
            raise RuntimeError(f"the doc's nginx block no longer has {old!r} once")
        block = block.replace(old, new)
    return "\n".join(line for line in block.splitlines() if not line.strip().startswith("ssl_certificate"))


@dataclass
class Front:
    name: str
    url: str
    process: subprocess.Popen
    directory: Path

    def log(self) -> str:
        path = self.directory / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)


def start_nginx(directory: Path, upstream_url: str) -> Front:
    """nginx (one worker) in front of ``upstream_url``; returns once /readyz answers 200 through it."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = plain_http(doc_block(), port=port, upstream_port=int(upstream_url.rsplit(":", 1)[1]))
    temp = {name: directory / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(exist_ok=True)
    conf = directory / "nginx.conf"
    conf.write_text(
        ("user root;\n" if os.geteuid() == 0 else "")
        + f"daemon off;\nworker_processes 1;\nworker_rlimit_nofile 16384;\npid {directory / 'nginx.pid'};\n"
        + f"error_log {directory / 'error.log'};\nevents {{ worker_connections 8192; }}\n"
        + "http {\naccess_log off;\n"
        + "".join(f"{name}_temp_path {path};\n" for name, path in temp.items())
        + server
        + "}\n"
    )
    argv = [NGINX, "-p", str(directory), "-c", str(conf), "-e", str(directory / "error.log")]
    checked = subprocess.run([*argv, "-t"], capture_output=True, text=True)
    if checked.returncode != 0:
        raise RuntimeError(f"nginx -t failed:\n{checked.stderr}")
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    front = Front("nginx", f"http://127.0.0.1:{port}", process, directory)
    wait_ready(front, "/readyz")
    return front
