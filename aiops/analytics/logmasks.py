"""Log masking and the canonical (Loghub-2.0) template form, shared by the miner in
:mod:`aiops.analytics.logs`.

* *Masking*: values whose shape gives them away (timestamps, URLs, IPs, hex, UUIDs, paths,
  numbers, ``prefix_123`` ids) become typed masks such as ``<:NUM:>``, so that they never split
  a template. No rule names a system or its format.
* *Canonical form*: :func:`to_loghub` writes a template in the Loghub-2.0 convention (``<*>`` for
  every variable, the benchmark's template-correction rules), so templates can be scored against
  published ground truth and read the same way live.
"""

from __future__ import annotations

import re
from functools import lru_cache

from drain3.masking import LogMasker, MaskingInstruction

__all__ = ["MASKS", "WILDCARD", "to_loghub"]

WILDCARD = "<*>"
# drain3 writes masks as prefix + name + suffix; "<:" ... ":>" cannot be confused with text in a
# log (a literal "<*>" or "<init>"), and Drain's own wildcard becomes "<:*:>".
_PREFIX, _SUFFIX = "<:", ":>"
_DRAIN_WILDCARD = f"{_PREFIX}*{_SUFFIX}"
_MASK_RE = re.compile(r"<:[A-Z*]+:>")

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
# Lookarounds instead of \b: a value ends at anything that is not a letter, digit or underscore.
_L, _R = r"(?<![A-Za-z0-9_])", r"(?![A-Za-z0-9_])"

# (mask name, pattern), applied in order: the most specific shapes first.
MASKS: tuple[tuple[str, str], ...] = (
    # URLs of any scheme, before the IPs and paths inside them.
    ("URL", r"(?<![\w.+-])[A-Za-z][\w+.-]*://[^\s\"'<>]+"),
    # ctime / date(1): "Fri Jul 01 08:16:53 PDT 2005".
    ("TIME", rf"{_L}{_DAY}\s+{_MONTH}\s+\d{{1,2}}\s+\d{{1,2}}:\d{{2}}:\d{{2}}"
             rf"(?:\s+[A-Z]{{3,4}})?(?:\s+\d{{4}})?{_R}"),
    ("TIME", rf"{_L}\d{{4}}-\d{{2}}-\d{{2}}[T ]\d{{2}}:\d{{2}}:\d{{2}}(?:[.,]\d+)?"
             rf"(?:Z|[+-]\d{{2}}:?\d{{2}})?{_R}"),
    ("UUID", rf"{_L}[0-9a-fA-F]{{8}}-(?:[0-9a-fA-F]{{4}}-){{3}}[0-9a-fA-F]{{12}}{_R}"),
    ("IP", rf"{_L}\d{{1,3}}(?:\.\d{{1,3}}){{3}}{_R}"),
    # MAC addresses and other colon-separated byte strings.
    ("MAC", rf"{_L}[0-9A-Fa-f]{{2}}(?::[0-9A-Fa-f]{{2}}){{3,}}{_R}"),
    ("HEX", rf"{_L}0[xX][0-9a-fA-F]+{_R}"),
    # Bare hex words: at least 8 hex digits with a digit and a letter among them.
    ("HEX", rf"{_L}(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{{8,}}{_R}"),
    # Absolute paths (POSIX, and Windows drive paths), wherever a value may start (line start,
    # space, quote, bracket, =, :, comma).
    ("PATH", r"(?:^|(?<=[\s'\"(\[=:,]))(?:/+[\w.\-@+~%]+)+/?"),
    ("PATH", r"(?:^|(?<=[\s'\"(\[=,]))[A-Za-z]:\\[^\s\"'<>|]*"),
    # Ids of underscore-joined words with a number among them: blk_-123, job_1445_0001,
    # attempt_1445_0020_m_000002_0, rdd_2_0, broadcast_4_piece0.
    ("ID", rf"{_L}[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*?_-?\d+(?:_[A-Za-z0-9]+)*{_R}"),
    # Numbers, versions (v1.2.3) and words that start with a digit (16K, 0MB, 80x25, 8a2a501).
    ("NUM", rf"{_L}[-+]?[vV]?\d+(?:\.\d+)*{_R}"),
    ("NUM", rf"{_L}\d[A-Za-z0-9]*{_R}"),
)


# -- canonical (Loghub-2.0) form -------------------------------------------------------------

# The benchmark's template-correction rules (Khan et al., ICSE 2022, as used by Loghub-2.0 to
# correct its ground truth): the same delimiters, applied to predicted templates so that both
# sides follow one convention.
_PATH_DELIMS = re.compile(r"(\s|,|!|;|:|=|\||\"|'|\[|\]|\(|\)|\{|\})")
_TOKEN_DELIMS = re.compile(r"(\s|,|!|;|:|=|\||\"|'|\[|\]|\(|\)|\{|\}|\.|-|\+|@|#|\$|%|&)")
_PLACEHOLDER_WORDS = frozenset({"true", "false", "null", "root", "admin"})
_SPACES = re.compile(r"\s+")
_POSIX_PATH = re.compile(r"(/[^/]+)+")
_GLUED = re.compile(r"[^\s/]*<\*>[^\s/]*")


# Cached: a batch renders the same few hundred templates thousands of times.
@lru_cache(maxsize=1 << 16)
def to_loghub(template: str) -> str:
    """Write a template in the Loghub-2.0 convention: masks become ``<*>``, then the benchmark's
    correction rules (paths, booleans and default user names, digits, words glued to a variable,
    dot-separated and adjacent variables)."""
    text = _MASK_RE.sub(WILDCARD, template)
    text = _SPACES.sub(" ", text.strip())
    text = "".join(WILDCARD if _POSIX_PATH.fullmatch(t) else t for t in _PATH_DELIMS.split(text))
    text = "".join(_correct_token(t) for t in _TOKEN_DELIMS.split(text))
    text = _collapse(text, "<*>.<*>")
    return _collapse(text, "<*><*>")


def _correct_token(token: str) -> str:
    if token.lower() in _PLACEHOLDER_WORDS or token.isdecimal():
        return WILDCARD
    # A word glued to a variable is one variable; "<*>/<*>" stays (a slash is not a delimiter).
    if _GLUED.fullmatch(token) and token != "<*>/<*>":
        return WILDCARD
    return token


def _collapse(text: str, pair: str) -> str:
    while pair in text:
        text = text.replace(pair, WILDCARD)
    return text


# -- masking ---------------------------------------------------------------------------------

_MASKER = LogMasker([MaskingInstruction(p, name) for name, p in MASKS], _PREFIX, _SUFFIX)


# Cached: masking is most of a message's cost, and it depends on the body alone (a batch that
# mines the same lines with several settings masks them once).
@lru_cache(maxsize=1 << 15)
def _mask(body: str) -> str:
    return str(_MASKER.mask(body))
