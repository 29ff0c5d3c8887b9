"""The one redactor every file of the run directory passes through.

A secret reaches the harness in a few ways: the API key's environment variable
(``target.api_key_env``), a launch command's ``--api-key K`` or ``--hf-token=T``,
the environment of the harness or of the launched server (``HF_TOKEN``), and the
server's own output echoing any of them (vLLM prints its non-default args). So
the redactor knows two things:

- **values**: every secret it was told or has learned, replaced wherever it
  appears (also in its JSON-escaped spelling);
- **shapes**: ``--<name> VALUE``, ``--<name>=VALUE``, ``name=VALUE``,
  ``"name": "VALUE"``, ``Bearer VALUE``, ``Authorization: <scheme> VALUE``,
  where the last word of ``name`` is a secret word (key, token, secret,
  password, auth, credential...). Any flag whose name ends that way, not a fixed
  list; ``--max-num-batched-tokens`` and ``TOKENIZERS_PARALLELISM`` are not
  secret-looking (the last word decides);
- **URLs**: the userinfo of any ``scheme://user:password@host`` and the values
  of query parameters named like credentials (``token``, ``api_key``, ``sig``,
  ``X-Amz-Signature``...), wherever a URL appears; and the whole value of any
  variable or flag that holds such a URL (``DB_URL``, ``--db-url``), learned
  from the environment and the launch command before the run starts.

Values found by shape are learned, so a key seen once in an argv is hidden
everywhere after. The writers (run store, evidence bundle, server-log pump,
report) call ``text()`` on what they are about to write; ``scrub_tree()`` is the
last pass over the directory at the end of a run; the CLI's stdout and stderr
pass ``RedactingStream`` (the live view, error lines, warnings).

Invariant: no secret reaches a file or a stream of the harness in any of these
shapes; ``Redactor.text`` is the one function that decides what is one.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from soak.fsio import write_atomic
from soak.secret_names import _CAMEL, _WORD_SPLIT, secret_name  # noqa: F401 (secret_name: part of this module's API)

REDACTED = "***"
# Where a writer shortened a text (``clip``); ``...`` too, as others write it.
CUT = "…"
CUT_MARKS = (CUT, "...")

# Values too common to be treated as a secret everywhere (they would blank the record).
_TRIVIAL = {"", "true", "false", "yes", "no", "none", "null", "0", "1", "on", "off"}
MIN_SECRET_LEN = 4
# What follows a secret-looking name but is not the secret (the scheme before it).
_NOT_VALUES = {REDACTED, "Bearer", "Basic"}
# An inline image the report made (``data:image/png;base64,...``): bytes, not text to read for shapes.
_DATA_URI = re.compile(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+")


# A secret word right before a separator and a value: ``--api-key K``,
# ``--hf-token=T``, ``"--api-key", "K"``, ``api_key='K'``, ``"password": "P"``,
# ``HF_TOKEN=T``. The regex looks for the word only (a literal alternation, cheap on
# long JSON lines); the whole name is then read backwards and ``secret_name`` decides.
_SHAPE = re.compile(
    r"""(?:key|keys|token|secrets?|password|passwd|passphrase|auth|authorization|credentials?|pat|cookie|pass|pwd|pw)"""
    # the rest of the name: a qualifier (``HF_TOKEN_2``, ``API_KEY_PROD``) or the rest after a first word (``SECRET_VALUE``)
    r"""[a-z0-9_.-]*"""
    # A quote may come JSON-escaped (``token=\\"V\\"``: a metric label inside a JSON line).
    r"""(?P<sep>\\?["']\s*,\s*\\?["']|\\?["']?\s*:\s*\[?\s*\\?["']?|\\?["']?\s*=\s*\[?\s*\\?["']?|=|[ \t]+)"""
    r"""(?P<value>[^\s"',\]\}\\]+)"""
)
# Matched against the lower-cased text (case-sensitive regexes are several times
# faster on long JSON lines); IGNORECASE only where lowering changes the length.
_SHAPE_ANY_CASE = re.compile(_SHAPE.pattern, re.IGNORECASE)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_BEARER = re.compile(r"(?P<scheme>\bBearer)(?P<sep>\s+)(?P<value>[A-Za-z0-9._~+/=-]{4,})")
# ``Authorization: Basic dXNlcjpwYXNz``, ``"authorization": "Token abc"``: any scheme.
_AUTH_HEADER = re.compile(
    r"""(?P<name>\b(?:proxy-)?authorization)(?P<sep>["']?\s*[:=]\s*["']?)(?P<scheme>[A-Za-z][A-Za-z0-9_-]*)"""
    r"""(?P<gap>\s+)(?P<value>[^\s"',\]\}]+)""",
    re.IGNORECASE,
)
# A URL with a scheme: its userinfo (up to the last ``@`` before the host) and
# the rest up to where a URL cannot go on.
_URL = re.compile(
    r"""(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]{0,30}://)(?P<userinfo>[^\s/?#"'<>\\]*@)?(?P<rest>[^\s"'<>\\]*)"""
)
# A second ``?`` starts a parameter too (``/a?b=c?sig=S``): it is where a server would split.
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&;#?\s]+)=(?P<value>[^&;#?\s]*)")
# Query parameters that are credentials in a URL though not by the last-word rule
# (a signed URL's signature; Azure's ``sig``, AWS's ``X-Amz-Signature``).
# Not ``session`` or ``code``: their values are learned and hidden everywhere after, and
# those words name ordinary things too often.
_QUERY_WORDS = {"sig", "signature", "sas", "jwt", "pwd", "pass", "sessionid", "credential", "credentials",
                "security-token", "securitytoken"}
# A user name alone is learned only when it is long enough to be a token (``https://ghp_x@``), not ``postgres``.
_MIN_USER_TOKEN = 12


def credential_param(name: str) -> bool:
    """A query parameter whose value is a credential: ``token``, ``api_key``, ``sig``, ``X-Amz-Signature``."""
    from urllib.parse import unquote

    name = unquote(name)
    if secret_name(name):
        return True
    words = [w for w in _WORD_SPLIT.split(name.strip().lower()) if w]
    return bool(words) and (words[-1] in _QUERY_WORDS or "-".join(words[-2:]) in _QUERY_WORDS)


def url_secrets(text: str) -> list[str]:
    """The credentials inside the URLs of ``text``: userinfo passwords (and
    token-like user names), credential-named query values; raw and decoded."""
    from urllib.parse import unquote

    found: list[str] = []
    if "://" not in text:
        return found
    for match in _URL.finditer(text):
        userinfo = match.group("userinfo")
        if userinfo:
            user, colon, password = userinfo[:-1].partition(":")
            if colon and password:
                found += [password, unquote(password)]
            elif len(user) >= _MIN_USER_TOKEN:
                found += [user, unquote(user)]
        for param in _QUERY_PARAM.finditer(match.group("rest")):
            if param.group("value") and credential_param(param.group("name")):
                found += [param.group("value"), unquote(param.group("value"))]
    return found


def holds_credential_url(value: str) -> bool:
    """``value`` holds a URL with credentials in it (userinfo or a credential query parameter)."""
    if "://" not in value:
        return False
    for match in _URL.finditer(value):
        if match.group("userinfo"):
            return True
        if any(p.group("value") and credential_param(p.group("name"))
               for p in _QUERY_PARAM.finditer(match.group("rest"))):
            return True
    return False


class Redactor:
    """Thread-safe: the server-log pump runs on its own thread."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: tuple[str, ...] = ()
        self._learn_many(secrets)

    # --- what is secret ------------------------------------------------------------
    @classmethod
    def for_run(
        cls,
        *,
        environ: Mapping[str, str],
        api_key_env: str | None = None,
        command: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> "Redactor":
        found: list[str] = []
        if api_key_env and environ.get(api_key_env):
            found.append(environ[api_key_env])
        for source in (environ, env or {}):
            for k, v in source.items():
                if not isinstance(v, str):
                    continue
                if secret_name(k):
                    found.append(v)
                elif holds_credential_url(v):
                    # DB_URL=postgres://u:p@h: the whole value, and its parts wherever they appear alone
                    found.append(v)
                    found += url_secrets(v)
        found += argv_secrets(command)
        return cls(found)

    def learn(self, value: str | None) -> None:
        if value:
            self._learn_many([value])

    def _learn_many(self, values: Iterable[str]) -> None:
        new = []
        for value in values:
            if not isinstance(value, str):
                continue
            value = value.strip().strip("'\"")
            if len(value) < MIN_SECRET_LEN or value.lower() in _TRIVIAL or value == REDACTED:
                continue
            new.append(value)
            escaped = json.dumps(value)[1:-1]
            if escaped != value:
                new.append(escaped)
        if not new:
            return
        with self._lock:
            merged = set(self._values) | set(new)
            # Longest first: a secret containing another is replaced whole.
            self._values = tuple(sorted(merged, key=len, reverse=True))

    @property
    def values(self) -> tuple[str, ...]:
        return self._values

    # --- hiding it -----------------------------------------------------------------
    def text(self, text: str) -> str:
        if not text:
            return text
        for value in self._values:
            if value in text:
                text = text.replace(value, REDACTED)
        text = self._heads(text)
        if "://" in text:
            text = _URL.sub(self._url, text)
        if "Bearer" in text:
            text = _BEARER.sub(self._bearer, text)
        if "uthorization" in text or "UTHORIZATION" in text:
            text = _AUTH_HEADER.sub(self._auth_header, text)
        return self._shapes(text)

    def _heads(self, text: str) -> str:
        """The head of a known secret (``MIN_SECRET_LEN`` characters or more) where
        the text is cut: right before a cut mark or at its end. A line shortened by
        a writer never shows part of a learned value."""
        values = self._values
        if not values:
            return text
        ends = [len(text)]
        for mark in CUT_MARKS:
            at = text.find(mark)
            while at >= 0:
                ends.append(at)
                at = text.find(mark, at + len(mark))
        out, done = [], len(text)
        for end in sorted(set(ends), reverse=True):
            if end > done:
                continue
            cut = _head_length(text, end, values)
            if cut:
                out += [text[end:done], REDACTED]
                done = end - cut
        if not out:
            return text
        out.append(text[:done])
        return "".join(reversed(out))

    def _url(self, match: re.Match) -> str:
        found = url_secrets(match.group(0))
        if not found:
            return match.group(0)
        self._learn_many(found)
        userinfo = match.group("userinfo")
        rest = _QUERY_PARAM.sub(self._query_param, match.group("rest"))
        return match.group("scheme") + (REDACTED + "@" if userinfo else "") + rest

    @staticmethod
    def _query_param(match: re.Match) -> str:
        if not match.group("value") or not credential_param(match.group("name")):
            return match.group(0)
        return f"{match.group('lead')}{match.group('name')}={REDACTED}"

    def _auth_header(self, match: re.Match) -> str:
        value = match.group("value")
        if value == REDACTED:
            return match.group(0)
        self.learn(value)
        return f"{match.group('name')}{match.group('sep')}{match.group('scheme')}{match.group('gap')}{REDACTED}"

    def _shapes(self, text: str) -> str:
        out: list[str] = []
        done = 0
        lowered = text.lower()
        matches = _SHAPE.finditer(lowered) if len(lowered) == len(text) else _SHAPE_ANY_CASE.finditer(text)
        for match in matches:
            start = match.start()
            while start > 0 and text[start - 1] in _NAME_CHARS:
                start -= 1
            name = text[start:match.start("sep")]
            value = text[match.start("value"):match.end("value")]
            sep = match.group("sep")
            flag_only = not any(c in sep for c in ":=") or "," in sep  # space or list: a flag's value
            if (value in _NOT_VALUES or value.startswith(("-", REDACTED)) or not secret_name(name)
                    or (flag_only and not name.startswith("-")) or start < done):
                continue
            self.learn(value)
            out.append(text[done:match.start("value")])
            out.append(REDACTED)
            done = match.end("value")
        if not out:
            return text
        out.append(text[done:])
        return "".join(out)

    def bytes(self, data: bytes) -> bytes:
        return self.text(data.decode("utf-8", errors="surrogateescape")).encode("utf-8", errors="surrogateescape")

    def argv(self, args: Sequence[str]) -> list[str]:
        return [self.text(a) for a in redact_argv(args, self)]

    def _bearer(self, match: re.Match) -> str:
        if match.group("value") == REDACTED:
            return match.group(0)
        self.learn(match.group("value"))
        return f"{match.group('scheme')}{match.group('sep')}{REDACTED}"

    # --- the last pass ---------------------------------------------------------------
    def scrub_file(self, path: Path, *, shapes: bool = False) -> bool:
        """Rewrite ``path`` if a known secret value is in it; True when it was.
        ``shapes``: also every shape ``text()`` knows (a file written by a reader of
        the run directory, such as report.html and junit.xml, not by the run's writers)."""
        if shapes:
            return self._scrub_shapes(path)
        values = [v.encode("utf-8", errors="surrogateescape") for v in self._values]
        if not values:
            return False
        try:
            data = path.read_bytes()
        except OSError:
            return False
        packed = path.suffix == ".gz"  # rolled sample segments: look inside
        if packed:
            import gzip
            import zlib

            try:
                data = gzip.decompress(data)
            except (OSError, EOFError, zlib.error):
                return False
        if not any(v in data for v in values):
            return False
        structured = self._yaml(data) if path.suffix in (".yaml", ".yml") else None
        if structured is not None:
            data = structured
        else:
            for value in values:
                data = data.replace(value, REDACTED.encode())
        if packed:
            data = gzip.compress(data, 6)
        write_atomic(path, data)
        return True

    def _scrub_shapes(self, path: Path) -> bool:
        try:
            data = path.read_bytes()
        except OSError:
            return False
        text = data.decode("utf-8", errors="surrogateescape")
        parts, done = [], 0
        for match in _DATA_URI.finditer(text):
            parts += [self.text(text[done:match.start()]), match.group(0)]
            done = match.end()
        parts.append(self.text(text[done:]))
        out = "".join(parts).encode("utf-8", errors="surrogateescape")
        if out == data:
            return False
        write_atomic(path, out)
        return True

    def structure(self, obj: Any) -> Any:
        """``obj`` with every string in it redacted (keys too); a YAML or JSON dump
        of the result quotes ``***`` where a bare one would not parse."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, Mapping):
            return {self.structure(k): self.structure(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.structure(v) for v in obj]
        return obj

    def _yaml(self, data: bytes) -> bytes | None:
        """A YAML file redacted value by value, so it still parses (config.yaml)."""
        import yaml

        try:
            obj = yaml.safe_load(data.decode("utf-8"))
        except (UnicodeDecodeError, yaml.YAMLError):
            return None
        return yaml.safe_dump(self.structure(obj), sort_keys=False, allow_unicode=True).encode("utf-8")

    def scrub_tree(self, root: Path) -> list[Path]:
        """Every file under ``root`` that still held a known secret, now rewritten."""
        done = []
        for path in sorted(Path(root).rglob("*")):
            if path.is_file() and not path.is_symlink() and self.scrub_file(path):
                done.append(path)
        return done


def _head_length(text: str, end: int, values: Sequence[str]) -> int:
    """The length of the longest head (``MIN_SECRET_LEN`` characters or more, not
    the whole value) of one of ``values`` that ``text[:end]`` ends with; 0 if none.
    A URL's scheme alone is no head of it (``https`` ends many lines)."""
    best = 0
    for value in values:
        least = MIN_SECRET_LEN
        if "://" in value:
            least = max(least, value.index("://") + 4)
        if len(value) <= least:
            continue
        lead = value[:least]
        at = text.find(lead, max(end - len(value) + 1, 0), end)
        while at >= 0:
            if end - at > best and text.startswith(value[:end - at], at):
                best = end - at
                break  # the first place is the longest head
            at = text.find(lead, at + 1, end)
    return best


def clip(text: str, limit: int, redactor: Redactor | None = None) -> str:
    """``text`` (a command line, a log line, an error body) redacted whole, then
    cut to ``limit`` characters with ``CUT`` at the end where it was cut. Every
    place that shortens outside text for a file or a stream cuts with this:
    cutting first would split ``user:password@`` or a known secret so that no rule
    finds it. ``redactor``: the run's (its known values too); else the shapes and
    URLs only."""
    text = (redactor if redactor is not None else Redactor()).text(text)
    if len(text) <= limit:
        return text
    return text[:max(limit - len(CUT), 0)] + CUT


def argv_secrets(args: Sequence[str]) -> list[str]:
    """The values of secret-looking flags in an argument list."""
    out = []
    args = list(args)
    for i, arg in enumerate(args):
        if holds_credential_url(arg):
            # --db-url=postgres://u:p@h, or the value after --db-url: the whole value, and its parts
            flag, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
            out.append(value if eq and holds_credential_url(value) else arg)
            out += url_secrets(arg)
        if not arg.startswith("-"):
            continue
        flag, eq, value = arg.partition("=")
        if not secret_name(flag):
            continue
        if eq:
            out.append(value)
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            out.append(args[i + 1])
    return out


def redact_argv(args: Sequence[str], redactor: Redactor | None = None) -> list[str]:
    """An argument list with the value of every secret-looking flag as ``***``."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            hide_next = False
            if not arg.startswith("-"):
                if redactor is not None:
                    redactor.learn(arg)
                out.append(REDACTED)
                continue
        flag, eq, value = arg.partition("=")
        if arg.startswith("-") and secret_name(flag):
            if eq:
                if redactor is not None:
                    redactor.learn(value)
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


class LineRedactor:
    """Redacts a byte stream by line (a secret split across two reads is whole
    once its line is). A line longer than ``max_line`` is cut at its last space
    (secrets have none) and the rest carried over."""

    def __init__(self, redactor: Redactor, *, max_line: int = 1 << 20) -> None:
        self._redactor = redactor
        self._max = max_line
        self._buf = bytearray()

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        cut = self._buf.rfind(b"\n")
        out = b""
        if cut >= 0:
            out = bytes(self._buf[: cut + 1])
            del self._buf[: cut + 1]
        if len(self._buf) > self._max:
            space = max(self._buf.rfind(b" ", 0, self._max), self._buf.rfind(b"\t", 0, self._max))
            at = space + 1 if space > 0 else self._max
            out += bytes(self._buf[:at])
            del self._buf[:at]
        return self._redactor.bytes(out) if out else b""

    def flush(self) -> bytes:
        out, self._buf = bytes(self._buf), bytearray()
        return self._redactor.bytes(out) if out else b""


class RedactingStream:
    """A text stream (stdout, stderr) whose every write passes ``Redactor.text``:
    the live view, error lines and warnings of the harness. ``print`` writes a
    line in one call, so a secret is never split across two writes."""

    def __init__(self, stream: Any, redactor: Redactor) -> None:
        self._stream = stream
        self._redactors = [redactor]

    def follow(self, redactor: Redactor) -> None:
        """Also hide what ``redactor`` knows or learns (the run's: its launch command, its target's env)."""
        if all(r is not redactor for r in self._redactors):
            self._redactors = [*self._redactors, redactor]

    def write(self, text: str) -> int:
        out = text
        if isinstance(out, str):
            for redactor in self._redactors:
                out = redactor.text(out)
        self._stream.write(out)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        # isatty, fileno, flush, encoding...: the wrapped stream's
        return getattr(self._stream, name)


def follow_in_streams(redactor: Redactor, *streams: Any) -> None:
    """The CLI's redacting streams (stdout, stderr) also hide what the run's redactor knows."""
    for stream in streams:
        if isinstance(stream, RedactingStream):
            stream.follow(redactor)
