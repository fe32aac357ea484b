"""The console and the API behind Debian's nginx terminating TLS, as docs/production.md configures it.

The nginx server block is read from docs/production.md (its ```nginx block: the page and this test
run the same text; only the port, host name and certificate paths are changed). nginx runs as a
process of the test (config, pid and logs in a temp dir, a self-signed certificate made with the
openssl CLI) in front of a real `manage.py serve` with FAIRGATE_TRUSTED_PROXIES=127.0.0.1 and
FAIRGATE_PUBLIC_URL=https://127.0.0.1:<port>. Through it Chromium (Playwright) logs in, watches the
queue live over wss:// and logs out; the official openai SDK chats, plain and streamed. A peer that
is not a trusted proxy (127.0.0.2 straight to serve) has its X-Forwarded-Proto/-For ignored.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.live.console.conftest import LIMIT_S, SERVICE_MS, WAIT_MS, held_at_backend
from tests.support.livestack import REPO_ROOT, Gateway, free_port, start_gateway, stop_process, wait_until
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

DOC = REPO_ROOT / "docs" / "production.md"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
FAR_NET = "203.0.113.0/24"  # a downgrade rule's network: whose address it is decides the class
USERS = """
from console.services import user_create
user_create(username="ann", role="member", tenant_slug="alpha", password="ann-password-1", actor="test")
"""


def nginx_snippet() -> str:
    found = re.findall(r"```nginx\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(found) == 1, "docs/production.md should hold exactly one nginx block"
    return found[0]


def replaced(text: str, changes: dict[str, str]) -> str:
    for old, new in changes.items():
        assert text.count(old) == 1, f"the doc's nginx block no longer has {old!r} once"
        text = text.replace(old, new)
    return text


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "fullchain.pem", directory / "privkey.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


def nginx_conf(directory: Path, *, port: int, upstream_port: int, cert: Path, key: Path) -> Path:
    server = replaced(
        nginx_snippet(),
        {
            "listen 443 ssl;": f"listen 127.0.0.1:{port} ssl;",
            "server_name llm.example.com;": "server_name 127.0.0.1;",
            "/etc/ssl/fairgate/fullchain.pem": str(cert),
            "/etc/ssl/fairgate/privkey.pem": str(key),
            "server 127.0.0.1:8000;": f"server 127.0.0.1:{upstream_port};",
        },
    )
    temp = {name: directory / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir()
    conf = directory / "nginx.conf"
    conf.write_text(
        ("user root;\n" if os.geteuid() == 0 else "")  # its workers read and write this temp dir
        + f"daemon off;\nworker_processes 1;\npid {directory / 'nginx.pid'};\nerror_log {directory / 'error.log'};\n"
        + "events { worker_connections 256; }\n"
        + f"http {{\naccess_log {directory / 'access.log'};\n"
        + "".join(f"{name}_temp_path {path};\n" for name, path in temp.items())
        + server
        + "}\n"
    )
    return conf


@dataclasses.dataclass
class Ingress:
    url: str
    cert: Path
    process: subprocess.Popen
    directory: Path

    def log(self) -> str:
        return (self.directory / "error.log").read_text(errors="replace")

    def verify(self) -> ssl.SSLContext:
        """TLS that trusts the test's self-signed certificate."""
        return ssl.create_default_context(cafile=str(self.cert))


@pytest.fixture(scope="module")
def ingress_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def stack(sim, ingress_port, tmp_path_factory) -> Iterator[Gateway]:
    """serve, told it stands behind https://127.0.0.1:<ingress_port> and trusts 127.0.0.1 as its proxy."""
    yaml_text = scheduler_yaml(
        tenants=[tenant("alpha", share=0.5)],
        backends=[backend("b-one", f"{sim.url}/v1", models=["m-one"], slots=1)],
        sla_ms={"INTERACTIVE": 30000},
        queue={"depth_cap": 100, "service_ms_prior": SERVICE_MS},
        networks={"FAR_NET": [FAR_NET]},
        downgrade_check=[
            {"name": "far", "if": "class==INTERACTIVE and src_cidr in FAR_NET", "action": "DOWNGRADE_TO_BATCH"}
        ],
    )
    gateway = start_gateway(
        tmp_path_factory.mktemp("tls-ingress"),
        yaml_text,
        {"alpha": ("alpha", "INTERACTIVE")},
        FAIRGATE_TRUSTED_PROXIES="127.0.0.1",
        FAIRGATE_PUBLIC_URL=f"https://127.0.0.1:{ingress_port}",
    )
    gateway.shell(USERS)
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def ingress(stack, ingress_port, tmp_path_factory) -> Iterator[Ingress]:
    if not Path(NGINX).exists():
        pytest.fail("nginx is missing: apt-get install -y nginx")
    directory = tmp_path_factory.mktemp("nginx")
    cert, key = self_signed(directory)
    upstream_port = int(stack.url.rsplit(":", 1)[1])
    conf = nginx_conf(directory, port=ingress_port, upstream_port=upstream_port, cert=cert, key=key)
    argv = [NGINX, "-p", str(directory), "-c", str(conf), "-e", str(directory / "error.log")]
    checked = subprocess.run([*argv, "-t"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    front = Ingress(f"https://127.0.0.1:{ingress_port}", cert, process, directory)

    def ready() -> bool:
        assert process.poll() is None, f"nginx exited:\n{front.log()[-3000:]}"
        try:
            return httpx.get(f"{front.url}/readyz", verify=front.verify(), timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, limit_s=LIMIT_S, what="nginx in front of serve")
    yield front
    stop_process(process)


def sdk(ingress: Ingress, stack: Gateway) -> openai.OpenAI:
    client = httpx.Client(verify=ingress.verify(), timeout=LIMIT_S * 2)
    return openai.OpenAI(base_url=f"{ingress.url}/v1", api_key=stack.keys["alpha"], http_client=client, max_retries=0)


def test_openai_sdk_chats_through_the_tls_ingress(ingress, stack):
    client = sdk(ingress, stack)
    raw = client.chat.completions.with_raw_response.create(
        model="m-one", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-priority-class"] == "INTERACTIVE"  # 127.0.0.1, not in FAR_NET
    stream = client.chat.completions.create(
        model="m-one", messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def test_browser_logs_in_watches_the_queue_over_wss_and_logs_out(ingress, stack, gate, browser):
    context = browser.new_context(ignore_https_errors=True, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    page.goto(f"{ingress.url}/console/")
    page.fill("input[name=username]", "ann")
    page.fill("input[name=password]", "ann-password-1")
    page.click("#login")  # a POST whose Origin is https://127.0.0.1:<port>: CSRF must accept it
    page.wait_for_selector("#live-status.on")
    assert page.url == f"{ingress.url}/console/queue/"
    assert sockets and all(url.startswith(f"wss://127.0.0.1:{ingress.url.rsplit(':', 1)[1]}/") for url in sockets)
    cookies = {cookie["name"]: cookie for cookie in context.cookies()}
    assert cookies["sessionid"]["secure"] and cookies["csrftoken"]["secure"]

    results: list = []
    gate.close()
    thread = threading.Thread(
        target=lambda: results.append(
            sdk(ingress, stack).chat.completions.create(
                model="m-one",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=8,
                extra_headers={"X-Request-Id": "tls-live-1"},
            )
        ),
        daemon=True,
    )
    thread.start()
    held_at_backend(gate)
    page.wait_for_selector("#queue-table tr[data-id='tls-live-1']")  # pushed over wss://
    gate.open()
    thread.join(LIMIT_S * 2)
    assert results, "the chat through the ingress did not finish"
    page.wait_for_selector("#queue-table tr.empty")

    page.click(".logout button")
    page.wait_for_url(f"{ingress.url}/console/login/")
    assert "sessionid" not in {cookie["name"] for cookie in context.cookies()}
    page.goto(f"{ingress.url}/console/queue/")
    assert page.url.startswith(f"{ingress.url}/console/login/")  # signed out: the queue asks for a login
    context.close()


def test_the_console_through_the_ingress_sends_hsts(ingress):
    response = httpx.get(f"{ingress.url}/console/login/", verify=ingress.verify())
    assert response.status_code == 200
    assert response.headers["strict-transport-security"].startswith("max-age=")


def test_forwarded_headers_from_an_untrusted_peer_are_ignored(stack):
    claims = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    chat = {"model": "m-one", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    key = {"Authorization": f"Bearer {stack.keys['alpha']}"}
    stranger = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=LIMIT_S)
    proxy = httpx.Client(timeout=LIMIT_S)  # from 127.0.0.1, the trusted proxy's address
    with stranger, proxy:
        # X-Forwarded-Proto: the stranger's console page is plain HTTP, sent to the public https origin.
        page = stranger.get(f"{stack.url}/console/login/", headers=claims)
        assert page.status_code == 301 and page.headers["location"].startswith(stack.env["FAIRGATE_PUBLIC_URL"])
        assert proxy.get(f"{stack.url}/console/login/", headers=claims).status_code == 200
        # X-Forwarded-For: only the trusted proxy's word puts the request in FAR_NET (downgraded).
        told = stranger.post(f"{stack.url}/v1/chat/completions", json=chat, headers={**claims, **key})
        assert told.status_code == 200 and told.headers["x-priority-class"] == "INTERACTIVE"
        believed = proxy.post(f"{stack.url}/v1/chat/completions", json=chat, headers={**claims, **key})
        assert believed.status_code == 200 and believed.headers["x-priority-class"] == "BATCH"
