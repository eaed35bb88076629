"""A small stand-in for the Hugging Face Hub on a loopback port, for the real huggingface_hub
client.

It answers the HTTP calls huggingface_hub 0.36 makes to create a repository and commit files to it:

    POST /api/repos/create                                  create a repository (409 if it exists)
    GET  /api/models/<repo>[/revision/<rev>]                repo info (create_repo's 403 fallback)
    GET  /api/whoami-v2                                     who the token belongs to
    POST /api/validate-yaml                                 README.md metadata check before a commit
    POST /api/models/<repo>/preupload/<rev>                 regular or LFS, file by file
    POST /<repo>.git/info/lfs/objects/batch                 where to upload each LFS file
    PUT  /lfs-objects/<sha256>                              the LFS upload itself (basic transfer)
    POST /lfs-objects/<sha256>/verify                       the client's check that it arrived
    POST /api/models/<repo>/commit/<rev>                    the commit, as NDJSON

Every repository keeps its commits in memory, oldest first, each as a `Commit(message, files)` with
`files` mapping the path of each file sent in that commit to its bytes. Preupload returns no "oid"
for the files already in the repository, so the client sends every file in every commit: a commit's
`files` is the full set of files the client meant to publish at that moment.

Xet: with hf_xet installed the client offers the "xet" transfer in the LFS batch request, but uses
it only if the server picks it; this server always answers "basic", so large files go through the
plain LFS upload above, which is what these tests exercise.

Knobs for failure tests: `fail_with` (an HTTP status that every request gets, or only those for
which `fail_when("METHOD /path")` is true), `before_commit` (a function called with the repository
id and the commit's position in it before the commit is stored; it may block, which holds the
client's upload as a slow Hub would). `unrouted` lists the requests it had no answer for: a client
calling anything else.
"""

import base64
import collections
import hashlib
import http.server
import json
import re
import threading
import urllib.parse

import yaml

Commit = collections.namedtuple("Commit", "message files")

LFS_SUFFIXES = (
    ".h5",
    ".bin",
    ".safetensors",
    ".msgpack",
    ".ckpt",
    ".pb",
    ".tflite",
    ".onnx",
    ".npz",
)
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024  # the Hub stores larger files in LFS whatever their kind
REPO_PATTERN = r"(?P<repo>[\w.-]+/[\w.-]+)"
REVISION_PATTERN = r"(?P<revision>[^/]+)"


class FakeHub:
    """Start with `with FakeHub(token) as hub:`; point HF_ENDPOINT at `hub.url`.

    `token` is the only token it accepts, and it belongs to the user `user`, who may create
    repositories in their own namespace only.
    """

    def __init__(self, token, user="tester", fail_with=None, fail_when=None, before_commit=None):
        self.token = token
        self.user = user
        self.fail_with = fail_with
        self.fail_when = fail_when or (lambda request: True)
        self.before_commit = before_commit
        self.repos = {}  # repo id -> {"private": bool, "commits": [Commit]}
        self.lfs_objects = {}  # sha256 hex -> bytes
        self.lfs_uploads = []  # sha256 hex of every LFS PUT received, in order
        self.offered_transfers = []  # the "transfers" list of every LFS batch request
        self.requests = []  # "METHOD path" of every request, in order
        self.unrouted = []  # "METHOD path" of the requests no route answered
        self.authorizations = []  # the Authorization header of every request (None when absent)
        self.lock = threading.Lock()
        self.server = None

    # -- life cycle
    # ---------------------------------------------------------------------------------

    def __enter__(self):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info):
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def commits(self, repo_id):
        with self.lock:
            return list(self.repos.get(repo_id, {}).get("commits", []))

    # -- request handling -------------------------------------------------------------------------

    def _handler_class(self):
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hub._dispatch(self, "GET")

            def do_POST(self):
                hub._dispatch(self, "POST")

            def do_PUT(self):
                hub._dispatch(self, "PUT")

            def do_HEAD(self):
                hub._dispatch(self, "HEAD")

            def log_message(self, *args):
                pass

        return Handler

    def _routes(self):
        return [
            ("POST", r"/api/repos/create", self._create_repo),
            ("GET", rf"/api/models/{REPO_PATTERN}(/revision/{REVISION_PATTERN})?", self._repo_info),
            ("GET", r"/api/whoami-v2", self._whoami),
            ("POST", r"/api/validate-yaml", self._validate_yaml),
            ("POST", rf"/api/models/{REPO_PATTERN}/preupload/{REVISION_PATTERN}", self._preupload),
            ("POST", rf"/{REPO_PATTERN}\.git/info/lfs/objects/batch", self._lfs_batch),
            ("PUT", r"/lfs-objects/(?P<oid>[0-9a-f]{64})", self._lfs_put),
            ("POST", r"/lfs-objects/(?P<oid>[0-9a-f]{64})/verify", self._lfs_verify),
            ("POST", rf"/api/models/{REPO_PATTERN}/commit/{REVISION_PATTERN}", self._commit),
        ]

    def _dispatch(self, handler, method):
        path = urllib.parse.urlsplit(handler.path).path
        request = f"{method} {path}"
        body = read_body(handler)
        with self.lock:
            self.requests.append(request)
            self.authorizations.append(handler.headers.get("Authorization"))
        if self.fail_with is not None and self.fail_when(request):
            return reply(
                handler, self.fail_with, {"error": "the fake Hub fails this request on purpose"}
            )
        for route_method, pattern, answer in self._routes():
            match = re.fullmatch(pattern, path)
            if match and route_method == method:
                return answer(handler, body, **match.groupdict())
        with self.lock:
            self.unrouted.append(request)
        return reply(handler, 404, {"error": f"no route for {request}"})

    def _authorized(self, handler):
        return handler.headers.get("Authorization") == f"Bearer {self.token}"

    def _unauthorized(self, handler):
        return reply(handler, 401, {"error": "Invalid username or password."})

    def _missing_repo(self, handler, repo):
        return reply(
            handler,
            404,
            {"error": f"Repository {repo} not found"},
            {"X-Error-Code": "RepoNotFound"},
        )

    def _create_repo(self, handler, body):
        if not self._authorized(handler):
            return self._unauthorized(handler)
        request = json.loads(body)
        namespace = request.get("organization") or self.user
        repo_id = f"{namespace}/{request['name']}"
        if namespace != self.user:
            message = (
                f'You don\'t have the rights to create a model under the namespace "{namespace}"'
            )
            return reply(handler, 403, {"error": message}, {"X-Error-Message": message})
        with self.lock:
            if repo_id in self.repos:
                exists = {
                    "error": "You already created this model repo",
                    "url": self._repo_url(repo_id),
                }
                return reply(handler, 409, exists)
            self.repos[repo_id] = {"private": bool(request.get("private")), "commits": []}
        return reply(handler, 200, {"url": self._repo_url(repo_id), "name": repo_id})

    def _repo_url(self, repo_id):
        return f"{self.url}/{repo_id}"

    def _repo_info(self, handler, body, repo, revision=None):
        with self.lock:
            if repo not in self.repos:
                return self._missing_repo(handler, repo)
            commits = self.repos[repo]["commits"]
            files = sorted({path for commit in commits for path in commit.files})
            sha = commit_id(repo, len(commits)) if commits else None
            private = self.repos[repo]["private"]
        siblings = [{"rfilename": path} for path in files]
        return reply(
            handler, 200, {"id": repo, "sha": sha, "private": private, "siblings": siblings}
        )

    def _whoami(self, handler, body):
        if not self._authorized(handler):
            return self._unauthorized(handler)
        return reply(
            handler,
            200,
            {"type": "user", "name": self.user, "orgs": [], "auth": {"type": "access_token"}},
        )

    def _validate_yaml(self, handler, body):
        content = json.loads(body)["content"]
        match = re.match(r"---\n(.*?)\n---\n", content, re.DOTALL)
        try:
            metadata = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as error:
            return reply(handler, 400, {"errors": [{"message": f"invalid YAML: {error}"}]})
        if not isinstance(metadata, dict):
            return reply(handler, 400, {"errors": [{"message": "the metadata is not a mapping"}]})
        return reply(handler, 200, {"errors": [], "warnings": []})

    def _preupload(self, handler, body, repo, revision):
        if not self._authorized(handler):
            return self._unauthorized(handler)
        with self.lock:
            if repo not in self.repos:
                return self._missing_repo(handler, repo)
        files = []
        for file in json.loads(body)["files"]:
            sample = base64.b64decode(file["sample"])
            large_or_binary = file["size"] >= LFS_SIZE_THRESHOLD or not is_text(sample)
            lfs = file["path"].endswith(LFS_SUFFIXES) or large_or_binary
            files.append(
                {
                    "path": file["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": False,
                }
            )
        return reply(handler, 200, {"files": files, "commitOid": None})

    def _lfs_batch(self, handler, body, repo):
        if not self._authorized(handler):
            return self._unauthorized(handler)
        request = json.loads(body)
        with self.lock:
            self.offered_transfers.append(list(request.get("transfers", [])))
            known = set(self.lfs_objects)
        objects = []
        for item in request["objects"]:
            answer = {"oid": item["oid"], "size": item["size"], "authenticated": True}
            if item["oid"] not in known:  # already stored: no actions, the client skips the upload
                href = f"{self.url}/lfs-objects/{item['oid']}"
                answer["actions"] = {"upload": {"href": href}, "verify": {"href": f"{href}/verify"}}
            objects.append(answer)
        return reply(handler, 200, {"transfer": "basic", "objects": objects})

    def _lfs_put(self, handler, body, oid):
        if hashlib.sha256(body).hexdigest() != oid:
            return reply(handler, 400, {"error": "the uploaded bytes do not match their sha256"})
        with self.lock:
            self.lfs_objects[oid] = body
            self.lfs_uploads.append(oid)
        return reply(handler, 200, {})

    def _lfs_verify(self, handler, body, oid):
        with self.lock:
            stored = oid in self.lfs_objects
        return reply(
            handler, 200 if stored else 404, {} if stored else {"error": "object not uploaded"}
        )

    def _commit(self, handler, body, repo, revision):
        if not self._authorized(handler):
            return self._unauthorized(handler)
        with self.lock:
            if repo not in self.repos:
                return self._missing_repo(handler, repo)
            position = len(self.repos[repo]["commits"])
        message, files = None, {}
        for line in filter(None, body.split(b"\n")):
            item = json.loads(line)
            value = item["value"]
            if item["key"] == "header":
                message = value["summary"]
            elif item["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "lfsFile":
                with self.lock:
                    if value["oid"] not in self.lfs_objects:
                        return reply(
                            handler,
                            400,
                            {"error": f"LFS object of {value['path']} was never uploaded"},
                        )
                    files[value["path"]] = self.lfs_objects[value["oid"]]
            else:
                return reply(
                    handler, 400, {"error": f"this fake Hub does not handle {item['key']!r}"}
                )
        if self.before_commit is not None:
            self.before_commit(repo, position)  # may block, as a slow upload would
        with self.lock:
            commits = self.repos[repo]["commits"]
            commits.append(Commit(message, files))
            oid = commit_id(repo, len(commits))
        commit_url = f"{self._repo_url(repo)}/commit/{oid}"
        return reply(handler, 200, {"success": True, "commitOid": oid, "commitUrl": commit_url})


def read_body(handler):
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0], 16)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()  # the CRLF after each chunk
            if size == 0:
                return b"".join(chunks)
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def reply(handler, status, payload, headers=None):
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(data)


def is_text(sample):
    """Whether a file's first bytes look like text; the sample may end inside a multi-byte
    character."""
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(sample) - 3:
            return False
    return b"\x00" not in sample


def commit_id(repo_id, number):
    """A commit's 40-hex id, derived from its repository and position so that tests can predict
    it."""
    return hashlib.sha1(f"{repo_id}@{number}".encode()).hexdigest()


def use_fake_hub(monkeypatch, hub):
    """Send this process's and its subprocesses' Hub traffic to `hub`, online, with `hub.token` as
    the token.

    tests/conftest.py turns the libraries offline for the whole session; a subprocess started after
    this sees the loopback Hub instead (huggingface_hub reads these variables once, when it is
    imported).
    """
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", hub.token)
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(offline, raising=False)


def connect_this_process(monkeypatch, hub):
    """Like use_fake_hub(), for this very process, whose huggingface_hub was imported offline.

    huggingface_hub read HF_ENDPOINT and HF_HUB_OFFLINE into its constants when it was imported, and
    keeps HTTP sessions (offline ones refuse every request), so the constants are patched for the
    test and the sessions dropped; call disconnect_this_process() after the test so no online
    session outlives it.
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import reset_sessions

    use_fake_hub(monkeypatch, hub)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    reset_sessions()


def disconnect_this_process():
    from huggingface_hub.utils import reset_sessions

    reset_sessions()
