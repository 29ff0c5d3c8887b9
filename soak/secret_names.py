"""Which names hold a secret: ``secret_name`` (flags, variables, keys, headers).

The rule ``soak.redact`` applies to every name it reads (a launch command's
flags, an environment, a config's keys, a query's parameters), kept apart so
the rule can be read and tested as a whole. Pure.
"""

from __future__ import annotations

import re
from typing import Sequence

# The last word of a name decides: exact words, and words ending in these.
_EXACT = {
    "key", "keys", "apikey", "token", "secret", "secrets", "password", "passwd",
    "passphrase", "auth", "authorization", "credential", "credentials", "pat", "cookie",
}
_ENDINGS = ("apikey", "token", "secret", "password", "passwd", "passphrase", "credential", "credentials")

_WORD_SPLIT = re.compile(r"[-_.\s]+")
# A word starts at an upper-case letter followed by a lower-case one (``accessKey``,
# not ``xKEY``: base64 is not camelCase).
_CAMEL = re.compile(r"([a-z0-9])([A-Z][a-z])")


def secret_name(name: str) -> bool:
    """``--api-key``, ``hf_token``, ``PGPASSWORD``, ``X-Auth``: the last word is a secret word.

    Qualifiers at the end are not that word: a number or a word with digits in
    it (``HF_TOKEN_2``, ``API_KEY_V2``; ``DB_PASSWORD2`` is ``password`` and 2),
    an environment or rotation word (``API_KEY_PROD``, ``DB_PASSWORD_OLD``,
    ``TOKEN_BACKUP``): they are dropped before the last word decides. The short
    spellings ``pass``, ``pwd``, ``pw`` are secret words after another word
    (``DB_PASS``, ``MYSQL_PWD``, ``--db-pass``), not alone (the shell's ``PWD`` is
    a directory). A name that starts with ``secret``/``password`` is one too
    (``SECRET_VALUE``, ``PASSWORD_PROD``) unless its last word names a fact about
    it (``secret_file``, ``password_min_length``)."""
    # camelCase is words too: ``accessKey``, ``clientSecret`` (``HFToken`` stays one word, ending in token).
    name = _CAMEL.sub(r"\1_\2", name.strip().lstrip("-"))
    words = [w for w in _WORD_SPLIT.split(name.lower()) if w]
    while len(words) > 1 and (words[-1] in _QUALIFIERS or (
            any(c.isdigit() for c in words[-1]) and not _secret_word(words[-1].rstrip("0123456789"), words[:-1]))):
        words.pop()
    if not words:
        return False
    last = words[-1].rstrip("0123456789") or words[-1]
    if last in _NOT_SECRET_LAST:
        return False
    # A token *count* or a token *position*, not a credential: chars_per_token,
    # max_token, first_token, prompt_token.
    if last in ("token", "tokens", "key", "keys") and len(words) > 1 and words[-2] in _NOT_CREDENTIAL_BEFORE:
        return False
    return _secret_word(last, words[:-1]) or (len(words) > 1 and words[0] in _SECRET_FIRST)


def _secret_word(word: str, before: Sequence[str]) -> bool:
    return word in _EXACT or word.endswith(_ENDINGS) or (bool(before) and word in _SHORT)


# What a name's last word says about a secret without being one: ``KEY_PATH``, ``api_key_env``, ``token_count``.
_NOT_SECRET_LAST = {"env", "file", "path", "dir", "len", "length", "id", "type", "mode", "name", "count", "size",
                    "url", "host", "port", "user", "username", "min", "max", "policy", "rotation", "expiry",
                    "expires", "ttl", "header", "prefix", "format", "through"}
# Words after the secret word that qualify it (which one), not name something else.
_QUALIFIERS = {"prod", "production", "dev", "devel", "development", "staging", "stage", "test", "testing", "qa",
               "uat", "old", "new", "primary", "secondary", "backup", "bak", "alt", "live", "local", "current",
               "legacy", "default", "main", "rw", "ro"}
# Short spellings that are a secret word only after another word (``DB_PASS``, ``MYSQL_PWD``).
_SHORT = {"pass", "pwd", "pw"}
# A first word that makes the name a secret's (``SECRET_VALUE``), unless the last word is a fact about it.
_SECRET_FIRST = {"secret", "secrets", "password", "passwd", "passphrase"}


_NOT_CREDENTIAL_BEFORE = {
    "per", "max", "min", "num", "first", "last", "next", "prev", "stop", "eos", "bos", "pad", "special",
    "prompt", "output", "input", "generation", "cached", "draft", "sort", "group", "partition", "cache",
    "sequence", "seq", "chars", "char", "bytes", "dedup", "prefix", "primary", "foreign", "lookup",
}
